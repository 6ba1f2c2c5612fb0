"""The drafter factory: a ``--drafter`` CLI spec (``none``, ``ngram[:MIN:MAX]``, ``suffix[:MIN:MAX]``,
``self:L``, ``model:PATH``) to a :class:`reference.drafters.Drafter`.

It sits above every drafter kind (``reference.drafters`` and ``reference.suffix``), so neither kind
module imports the other.
"""

from __future__ import annotations

import torch

from reference.drafters import Drafter, DraftModelDrafter, ModelLike, NgramDrafter, SelfDrafter
from reference.suffix import SuffixDrafter

__all__ = ["make_drafter"]


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _n_range(spec: str, kind: str, arg: str) -> tuple[int, int]:
    """``MIN:MAX`` (or one ``N`` for both) of a ``kind:MIN:MAX`` drafter spec.

    Raises:
        ValueError: not one or two integers (the message shows the accepted form).
    """
    parts = arg.split(":")
    try:
        return (int(parts[0]), int(parts[1])) if len(parts) == 2 else (int(parts[0]), int(parts[0]))
    except ValueError:
        raise ValueError(f"--drafter {spec!r}: use {kind} or {kind}:MIN:MAX") from None


def make_drafter(
    spec: str | None, lm: ModelLike | None = None, dtype: str = "float32", device: str = "cpu"
) -> Drafter | None:
    """Build a drafter from a CLI spec: ``none`` | ``ngram[:MIN:MAX]`` | ``suffix[:MIN:MAX]`` | ``self:L`` | ``model:PATH``.

    ``suffix`` is prompt lookup plus a cache of the drafter's earlier outputs (``reference.suffix``).

    ``model:PATH`` gets ``cost_per_token`` = draft parameters / target parameters when ``lm`` is
    given (0.35 otherwise).

    Raises:
        ValueError: unknown or malformed spec (message lists the accepted forms).
    """
    if spec is None or spec in ("", "none"):
        return None
    kind, _, arg = spec.partition(":")
    if kind == "ngram":
        return NgramDrafter(*_n_range(spec, kind, arg)) if arg else NgramDrafter()
    if kind == "suffix":
        return SuffixDrafter(*_n_range(spec, kind, arg)) if arg else SuffixDrafter()
    if kind == "self":
        if lm is None:
            raise ValueError("--drafter self:L needs the target model")
        try:
            n = int(arg)
        except ValueError:
            raise ValueError(f"--drafter {spec!r}: use self:L with an integer layer count, e.g. self:8") from None
        return SelfDrafter(lm, n)
    if kind == "model":
        if not arg:
            raise ValueError("--drafter model:PATH needs a model path or name")
        from reference.models import load_model, unwrap

        draft = load_model(arg, dtype=dtype, device=device)
        cost = 0.35 if lm is None else _n_params(draft.model) / max(_n_params(unwrap(lm)[0]), 1)
        return DraftModelDrafter(draft, cost_per_token=cost)
    raise ValueError(f"--drafter {spec!r} is not one of none, ngram[:MIN:MAX], suffix[:MIN:MAX], self:L, model:PATH")
