"""``mix-PROFILE:F`` profiles: a provider that serves a fraction F of requests with another profile.

Models load-dependent routing to a cheaper replica, published as randomized model substitution
(issue 14, item 4; ``../shared/REFERENCES.md``). Each request is routed by its (choice) seed:
``mix_selects(seed, F)`` hashes the seed with BLAKE2b to a uniform in [0, 1) and routes the
request to the other profile when it falls below F, so the choice is deterministic per request and
the fraction of routed requests is Binomial(n, F) over independent seeds.

What is mixed: the served model (weights, dtype, KV/activation quantization, pruning, logit noise)
and the verification rule (``simulator.verifiers.make_verifier(profile, request_seed=...)``).
Request rewrites of the other profile (forced top-p/top-k, compliance faults) and its drafter are
not mixed: the drafter stays the primary's (only speed and acceptance, not the output law under a
strict rule, depend on it).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING, Any

from simulator.engine import BuildInfo, ServedModel

if TYPE_CHECKING:
    from simulator.profiles import Profile


def mix_uniform(seed: int) -> float:
    """The request's routing uniform in [0, 1) (BLAKE2b of ``mix:{seed}``, 53 bits)."""
    h = hashlib.blake2b(f"mix:{int(seed)}".encode(), digest_size=8).digest()
    return (int.from_bytes(h, "little") >> 11) / float(1 << 53)


def mix_selects(seed: int, fraction: float) -> bool:
    """True when the request with this seed is served by the other profile (probability ``fraction``)."""
    return mix_uniform(seed) < float(fraction)


class MixtureServedModel(ServedModel):
    """A :class:`ServedModel` that switches its inner model per request (on ``nonce`` = request seed).

    Args:
        primary: the served model for most requests (a ServedModel).
        alternate: the served model for a fraction of requests (a ServedModel).
        fraction: probability in [0, 1] that a request (nonce) is routed to ``alternate``.
    """

    def __init__(self, primary: ServedModel, alternate: ServedModel, fraction: float):
        super().__init__(primary.inner, primary.sigma)
        self.primary_inner = primary.inner
        self.alternate_inner = alternate.inner
        self.__dict__["_sigmas"] = (primary.sigma, alternate.sigma)
        self.__dict__["_fraction"] = float(fraction)
        self.n_routed = 0
        self.nonce = 0

    @property
    def nonce(self) -> int:
        """The current request's seed; setting it routes the request (see class doc)."""
        return self.__dict__.get("_nonce", 0)

    @nonce.setter
    def nonce(self, value: int) -> None:
        self.__dict__["_nonce"] = value
        if "_fraction" not in self.__dict__:  # during ServedModel.__init__
            return
        alt = mix_selects(int(value), self.__dict__["_fraction"])
        self.inner = self.alternate_inner if alt else self.primary_inner
        self.sigma = self.__dict__["_sigmas"][1 if alt else 0]
        self.routed_alternate = alt

    @property
    def fraction(self) -> float:
        """The routed fraction F."""
        return self.__dict__["_fraction"]


def build_mixture_served_model(profile: Profile, lm: Any, copy_model: bool = True) -> tuple[Any, BuildInfo]:
    """Build ``(LoadedModel with a MixtureServedModel, BuildInfo)`` for a ``mix-PROFILE:F`` profile.

    The primary is the profile without its mixture (honest-fp32 for ``mix-*``), the alternate is
    ``get_profile(profile.mix_with)``, always built on a copy (so ``lm`` is never modified).

    Raises:
        ValueError: ``profile.mix_with`` is None, or the alternate cannot be applied to the model.
        KeyError: unknown alternate profile.
    """
    from reference.models import LoadedModel
    from simulator.engine import build_served_model
    from simulator.profiles import get_profile

    if profile.mix_with is None:
        raise ValueError(f"profile {profile.name!r} has no mix_with; use build_served_model")
    base = dataclasses.replace(profile, mix_with=None, mix_fraction=0.0)
    p_lm, p_info = build_served_model(base, lm, copy_model=copy_model)
    a_lm, a_info = build_served_model(get_profile(profile.mix_with), lm, copy_model=True)
    served = MixtureServedModel(p_lm.model, a_lm.model, profile.mix_fraction)
    served.eval()
    info = dataclasses.replace(p_info)
    info.load_s = p_info.load_s + a_info.load_s
    info.quant = {"mix_with": profile.mix_with, "mix_fraction": profile.mix_fraction, "alternate": dict(a_info.__dict__)}
    slm = LoadedModel(model=served, tokenizer=lm.tokenizer, name=lm.name, path=lm.path, revision=lm.revision,
                      dtype=p_lm.dtype, device=lm.device)
    return slm, info
