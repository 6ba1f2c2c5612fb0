"""Drafters: strategies that propose k tokens for the target to verify.

All drafters implement the ``Drafter`` protocol::

    propose(context_ids: list[int], k: int, *, sampling: SamplingParams | None = None,
            generator: torch.Generator | None = None) -> (draft_ids [k'] int64, q [k', V] float | None)

``k' <= k`` (possibly 0). ``q`` is the draft distribution each draft was sampled from, after the
*same* processing as the target's p (``logits_to_probs``); ``None`` means a deterministic drafter
(one-hot q: n-gram lookup, greedy drafting, scripted drafts). Optional hooks:
``reset()`` (new sequence) and ``update(context_ids, n_accepted, n_drafted)`` (after verification).

Kinds:
- ``NgramDrafter``: prompt lookup (Saxena 2023; vLLM ``prompt_lookup_min/max``), longest n-gram
  suffix match wins, latest occurrence; free to run.
- ``DraftModelDrafter``: a smaller causal LM sharing the tokenizer, with its own KV cache.
- ``SelfDrafter``: early exit (LayerSkip, Elhoushi et al. 2024; Draft & Verify, Zhang et al. 2023):
  the target's first L decoder layers + its final norm + LM head, with its own KV cache.
- ``ScriptedDrafter`` / ``SequenceDrafter``: fixed proposals for tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from reference.sampling import SamplingParams, logits_to_probs, sample_from

_EMPTY = torch.zeros(0, dtype=torch.long)


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens; see the module docstring for the contract."""

    def propose(
        self,
        context_ids: list[int],
        k: int,
        *,
        sampling: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class NgramDrafter:
    """Prompt-lookup drafter: continue the latest earlier occurrence of the context's suffix.

    For n from ``max_n`` down to ``min_n`` (longest match wins), find the latest position i < len-n
    with ``context[i:i+n] == context[-n:]`` and propose ``context[i+n : i+n+k]``. Deterministic
    (q is one-hot, returned as None). Mirrors vLLM's ``prompt_lookup_min``/``prompt_lookup_max``.
    With ``periodic`` (default), a span that reaches the end of the context is continued with the
    same period, so a repeating loop of period P yields k drafts instead of at most P.

    Args:
        min_n: shortest suffix to match (>= 1).
        max_n: longest suffix to match (>= min_n).
        periodic: extend spans that hit the end of the context periodically.

    Raises:
        ValueError: invalid n range.
    """

    name = "ngram"
    deterministic = True
    cost_per_token = 0.0  # relative to one target step; nearly free

    def __init__(self, min_n: int = 2, max_n: int = 4, periodic: bool = True):
        if min_n < 1 or max_n < min_n:
            raise ValueError(f"NgramDrafter needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n = int(min_n)
        self.max_n = int(max_n)
        self.periodic = bool(periodic)

    def find(self, context_ids: Sequence[int], k: int) -> list[int]:
        """Return the proposed continuation (list of ids, length 0..k)."""
        L = len(context_ids)
        if k <= 0 or L < self.min_n + 1:
            return []
        arr = np.asarray(context_ids, dtype=np.int64)
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            pattern = arr[L - n :]
            # candidate starts i in [0, L-n-1]: windows arr[i:i+n] strictly before the suffix
            win = np.lib.stride_tricks.sliding_window_view(arr[: L - 1], n)
            hits = np.flatnonzero((win == pattern).all(axis=1))
            if hits.size:
                i = int(hits[-1])
                out = arr[i + n : i + n + k].tolist()
                if self.periodic:
                    # the copied span runs into the end of the context: keep copying with the same
                    # period (L - n - i), i.e. read on from the proposal itself (loops, "()()()")
                    src = list(context_ids[i + n :])
                    while len(out) < k:
                        out.append(int(src[len(out)]) if len(out) < len(src) else int(out[len(out) - len(src)]))
                return out
        return []

    def propose(self, context_ids, k, *, sampling=None, generator=None):
        """Propose up to k tokens by prompt lookup; q is None (one-hot)."""
        ids = self.find(context_ids, k)
        if not ids:
            return _EMPTY, None
        return torch.tensor(ids, dtype=torch.long), None

    def reset(self) -> None:
        """Stateless: nothing to reset."""


class _IncrementalLM:
    """Keeps a KV cache in sync with a growing/rolled-back context for a forward function.

    ``forward_fn(input_ids [1, n] int64, cache) -> logits [1, V]`` (logits of the last position).
    """

    def __init__(self, model: Any, forward_fn: Callable[[torch.Tensor, Any], torch.Tensor]):
        self.model = model
        self.forward_fn = forward_fn
        self.cache = None
        self.tokens: list[int] = []

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def reset(self) -> None:
        self.cache = None
        self.tokens = []

    def sync(self, context_ids: Sequence[int]) -> torch.Tensor:
        """Make the cache hold ``context_ids`` and return the next-token logits ``[V]``."""
        from transformers import DynamicCache

        ctx = list(context_ids)
        if not ctx:
            raise ValueError("drafter context is empty; the prompt must have at least one token")
        common = 0
        m = min(len(self.tokens), len(ctx))
        while common < m and self.tokens[common] == ctx[common]:
            common += 1
        keep = min(common, len(ctx) - 1)
        if self.cache is None or keep == 0:
            self.cache = DynamicCache(config=self.model.config)
            keep = 0
        elif keep < len(self.tokens):
            self.cache.crop(-(len(self.tokens) - keep))
        self.tokens = ctx[:keep]
        return self.feed(ctx[keep:])

    def feed(self, ids: Sequence[int]) -> torch.Tensor:
        """Append ``ids`` to the cache; return logits ``[V]`` at the last fed position."""
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        logits = self.forward_fn(x, self.cache)
        self.tokens.extend(int(t) for t in ids)
        return logits[0, -1]


def _draft_autoregressive(
    runner: _IncrementalLM,
    context_ids: Sequence[int],
    k: int,
    sampling: SamplingParams | None,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if k <= 0:
        return _EMPTY, None
    sampling = sampling or SamplingParams()
    with torch.inference_mode():
        logits = runner.sync(context_ids)
        ids: list[int] = []
        qs: list[torch.Tensor] = []
        for j in range(k):
            if sampling.greedy:
                t = int(logits.argmax().item())
            else:
                qj = logits_to_probs(logits.float(), sampling.temperature, sampling.top_k, sampling.top_p)
                t = sample_from(qj, generator)
                qs.append(qj)
            ids.append(t)
            if j < k - 1:
                logits = runner.feed([t])
    q = torch.stack(qs).cpu() if qs else None
    return torch.tensor(ids, dtype=torch.long), q


class DraftModelDrafter:
    """A separate (smaller) causal LM sharing the target's tokenizer, with its own KV cache.

    At temperature 0 drafts are the draft model's argmax (q None); otherwise drafts are sampled
    from q = ``logits_to_probs(draft logits, same params as p)`` and q is returned ``[k', V]``.

    Args:
        model: a transformers causal LM (or ``LoadedModel``) whose vocabulary matches the target's.
    """

    name = "draft-model"
    deterministic = False

    def __init__(self, model: Any):
        from reference.models import unwrap

        self.model, _ = unwrap(model)
        self.model.eval()

        def fwd(x: torch.Tensor, cache: Any) -> torch.Tensor:
            return self.model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits

        self._runner = _IncrementalLM(self.model, fwd)

    def propose(self, context_ids, k, *, sampling=None, generator=None):
        """Draft up to k tokens autoregressively from the draft model (see class doc)."""
        return _draft_autoregressive(self._runner, context_ids, k, sampling, generator)

    def reset(self) -> None:
        """Forget the KV cache (new sequence)."""
        self._runner.reset()


def early_exit_forward(model: Any, n_layers: int, input_ids: torch.Tensor, cache: Any, logits_to_keep: int = 1):
    """Run the first ``n_layers`` decoder layers of a Llama-style model, then its final norm and LM head.

    Args:
        model: a ``*ForCausalLM`` with ``.model.{embed_tokens, rotary_emb, layers, norm}`` and ``.lm_head``.
        n_layers: number of decoder layers to run (1..num_hidden_layers).
        input_ids: ``[1, n]`` int64 new tokens.
        cache: a ``DynamicCache`` holding only this early-exit model's past (positions continue from it).
        logits_to_keep: number of trailing positions to project through the LM head.

    Returns:
        ``[1, logits_to_keep, V]`` logits (model dtype).
    """
    from transformers.masking_utils import create_causal_mask

    base = model.model
    emb = base.embed_tokens(input_ids)
    past = cache.get_seq_length() if cache is not None else 0
    pos = torch.arange(past, past + input_ids.shape[1], device=input_ids.device).unsqueeze(0)
    mask = create_causal_mask(
        config=base.config, inputs_embeds=emb, attention_mask=None, cache=cache, position_ids=pos
    )
    pe = base.rotary_emb(emb, position_ids=pos)
    h = emb
    for layer in base.layers[:n_layers]:
        h = layer(h, attention_mask=mask, position_embeddings=pe, position_ids=pos, cache=cache, use_cache=True)
    h = base.norm(h[:, -logits_to_keep:])
    return model.lm_head(h)


class SelfDrafter:
    """Self-speculative early-exit drafter: the target's first ``n_layers`` layers + final norm + LM head.

    Keeps its own ``DynamicCache`` (only the first ``n_layers`` layers are filled). Greedy at
    temperature 0 (q None), else samples from processed q and returns it.

    Args:
        model: the target (``LoadedModel`` or a Llama-style ``*ForCausalLM``).
        n_layers: early-exit depth L, 1 <= L < num_hidden_layers (L == num_hidden_layers is allowed
            for tests: the drafter then equals the target).

    Raises:
        ValueError: L out of range or the model lacks the Llama-style layout.
    """

    name = "self"
    deterministic = False

    def __init__(self, model: Any, n_layers: int):
        from reference.models import unwrap

        self.model, _ = unwrap(model)
        base = getattr(self.model, "model", None)
        for attr in ("embed_tokens", "rotary_emb", "layers", "norm"):
            if base is None or not hasattr(base, attr):
                raise ValueError(f"self-draft needs a Llama-style model (missing model.{attr}); use --drafter ngram")
        if not hasattr(self.model, "lm_head"):
            raise ValueError("self-draft needs a model with lm_head; use --drafter ngram")
        n_total = len(base.layers)
        if not (1 <= int(n_layers) <= n_total):
            raise ValueError(f"self-draft layers L={n_layers} must be in 1..{n_total}")
        self.n_layers = int(n_layers)
        self.n_total = n_total

        def fwd(x: torch.Tensor, cache: Any) -> torch.Tensor:
            return early_exit_forward(self.model, self.n_layers, x, cache)

        self._runner = _IncrementalLM(self.model, fwd)

    def propose(self, context_ids, k, *, sampling=None, generator=None):
        """Draft up to k tokens with the early-exit model (see class doc)."""
        return _draft_autoregressive(self._runner, context_ids, k, sampling, generator)

    def reset(self) -> None:
        """Forget the KV cache (new sequence)."""
        self._runner.reset()


class ScriptedDrafter:
    """Test drafter: proposals come from a function or a fixed list, consumed in order.

    Args:
        script: either ``fn(context_ids, k) -> (ids, q | None)`` or a list of ``(ids, q | None)`` /
            ``ids`` entries used one per call (empty proposals once exhausted). Proposals longer than
            k are truncated to k (q rows likewise).
    """

    name = "scripted"
    deterministic = True

    def __init__(self, script: Callable[..., Any] | list):
        self.script = script
        self.calls = 0

    def propose(self, context_ids, k, *, sampling=None, generator=None):
        """Return the next scripted proposal, truncated to k."""
        if callable(self.script):
            out = self.script(list(context_ids), k)
        elif self.calls < len(self.script):
            out = self.script[self.calls]
        else:
            out = ([], None)
        self.calls += 1
        ids, q = out if isinstance(out, tuple) else (out, None)
        ids = torch.as_tensor(list(ids) if not torch.is_tensor(ids) else ids, dtype=torch.long).reshape(-1)[: max(k, 0)]
        if q is not None:
            q = q[: ids.numel()]
        return ids, q

    def reset(self) -> None:
        """Restart the script."""
        self.calls = 0


class SequenceDrafter:
    """Test drafter that proposes the next k tokens of a known full sequence (prompt + continuation).

    With the target's own greedy output as ``sequence`` every draft is accepted (oracle); with a
    corrupted sequence drafts are rejected where it differs. Proposes nothing past its end.
    """

    name = "sequence"
    deterministic = True

    def __init__(self, sequence: Sequence[int]):
        self.sequence = list(sequence)

    def propose(self, context_ids, k, *, sampling=None, generator=None):
        """Propose ``sequence[len(context) : len(context)+k]`` (q None)."""
        n = len(context_ids)
        ids = self.sequence[n : n + max(k, 0)]
        return torch.tensor(ids, dtype=torch.long), None

    def reset(self) -> None:
        """Stateless."""


def make_drafter(spec: str | None, lm: Any = None, dtype: str = "float32", device: str = "cpu") -> Any | None:
    """Build a drafter from a CLI spec: ``none`` | ``ngram[:MIN:MAX]`` | ``self:L`` | ``model:PATH``.

    Raises:
        ValueError: unknown or malformed spec (message lists the accepted forms).
    """
    if spec is None or spec in ("", "none"):
        return None
    kind, _, arg = spec.partition(":")
    if kind == "ngram":
        if arg:
            parts = arg.split(":")
            try:
                lo, hi = (int(parts[0]), int(parts[1])) if len(parts) == 2 else (int(parts[0]), int(parts[0]))
            except ValueError:
                raise ValueError(f"--drafter {spec!r}: use ngram or ngram:MIN:MAX") from None
            return NgramDrafter(lo, hi)
        return NgramDrafter()
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
        from reference.models import load_model

        return DraftModelDrafter(load_model(arg, dtype=dtype, device=device))
    raise ValueError(f"--drafter {spec!r} is not one of none, ngram[:MIN:MAX], self:L, model:PATH")
