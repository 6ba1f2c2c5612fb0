"""The served model of a profile: the reference model as the provider serves it.

:func:`build_served_model` turns a :class:`~simulator.profiles.Profile` and the reference
``LoadedModel`` into the *served* model (the one whose distribution p the provider samples from and
whose logprobs it reports): the reference model as is (honest-fp32), cast to bfloat16 (honest-bf16),
wrapped with kernel/batch-order logit noise (honest-noisy), weight-only quantized (int8/int4/fp8,
``simulator.quantize``), pruned to fewer layers (substituted), or a per-request mixture of two
profiles (``mix-PROFILE:F``, :class:`MixtureServedModel`). Every one is wrapped in a
:class:`ServedModel`, the logit tap the engine reads logprobs from.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from simulator.profiles import Profile, get_profile, mix_selects, recorded_of, resolve_substitute_layers

# ---------------------------------------------------------------------------------------------
# the served model wrapper: logit tap (+ deterministic kernel noise)
# ---------------------------------------------------------------------------------------------


class ServedModel(torch.nn.Module):
    """Wraps a causal LM: records the last forward's logits and optionally adds kernel noise.

    Noise model (honest-noisy): on real GPUs the logits of the same prefix change slightly with
    batch composition and reduction order. We add ``sigma * N(0, 1)`` to every logit, drawn from a
    generator seeded by ``(nonce, absolute position)``: the same position in the same request always
    sees the same perturbation (a fixed batch), a different request (``nonce``) sees another one.
    ``sigma`` in nats; 0 disables.

    The wrapper is a drop-in for the model in ``speculative_generate`` and ``score_continuations``
    (forwards every keyword, exposes ``config``/``generation_config``/``parameters()``).
    """

    def __init__(self, inner: Any, sigma: float = 0.0):
        super().__init__()
        self.inner = inner
        self.sigma = float(sigma)
        self.nonce = 0
        self.last_logits: torch.Tensor | None = None  # [n, V] of the last forward's first sequence

    @property
    def config(self):
        """The inner model's config."""
        return self.inner.config

    @property
    def generation_config(self):
        """The inner model's generation config."""
        return getattr(self.inner, "generation_config", None)

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the inner model's weights."""
        return next(self.inner.parameters()).dtype

    def _noise(self, positions: torch.Tensor, V: int, device: torch.device) -> torch.Tensor:
        """``[*positions.shape, V]`` float32 noise keyed by (nonce, position)."""
        flat = positions.reshape(-1).tolist()
        cache: dict[int, torch.Tensor] = {}
        rows = []
        for pos in flat:
            if pos not in cache:
                h = hashlib.blake2b(f"{self.nonce}:{pos}".encode(), digest_size=8).digest()
                g = torch.Generator().manual_seed(int.from_bytes(h, "little") & ((1 << 63) - 1))
                cache[pos] = torch.randn(V, generator=g, dtype=torch.float32)
            rows.append(cache[pos])
        return (torch.stack(rows) * self.sigma).reshape(*positions.shape, V).to(device)

    def forward(self, input_ids: torch.Tensor | None = None, **kwargs: Any):
        """Run the inner model; perturb and record its logits (see class doc)."""
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = int(cache.get_seq_length()) if cache is not None else 0
        out = self.inner(input_ids=input_ids, **kwargs)
        logits = out.logits
        if self.sigma > 0:
            n_out = logits.shape[1]
            pos_ids = kwargs.get("position_ids")
            if pos_ids is not None:
                positions = pos_ids[:, -n_out:].cpu()
            else:
                assert input_ids is not None  # without position_ids the caller passes input_ids
                n_in = input_ids.shape[1]
                positions = (torch.arange(past + n_in - n_out, past + n_in)).unsqueeze(0).expand(logits.shape[0], -1)
            noise = self._noise(positions, logits.shape[-1], logits.device)
            logits = (logits.float() + noise).to(logits.dtype)
            out.logits = logits
        self.last_logits = logits[0].detach()
        return out


# ---------------------------------------------------------------------------------------------
# building the served model
# ---------------------------------------------------------------------------------------------


def prune_layers_(model: Any, keep: Sequence[int]) -> None:
    """Keep only decoder layers ``keep`` of a Llama-style model, in place (renumbers ``layer_idx``).

    Raises:
        ValueError: the model lacks ``model.layers``.
    """
    base = getattr(model, "model", None)
    if base is None or not hasattr(base, "layers"):
        raise ValueError("substituted profile needs a Llama-style model with model.layers")
    layers = [base.layers[i] for i in keep]
    base.layers = torch.nn.ModuleList(layers)
    for j, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "layer_idx"):
            attn.layer_idx = j
        if hasattr(layer, "layer_idx"):
            layer.layer_idx = j
    cfg = model.config
    lt = getattr(cfg, "layer_types", None)
    if lt:
        cfg.layer_types = [lt[i] for i in keep]
    cfg.num_hidden_layers = len(layers)


#: The simulator's operator log (``auditor serve`` prints its INFO records on stderr).
log = logging.getLogger("simulator")


def _quant_progress(done: int, total: int, elapsed_s: float) -> None:
    """Quantization progress in the operator log, every tenth of the matrices (the port is closed meanwhile)."""
    if done == total or done % max(1, total // 10) == 0:
        log.info("  quantized %d/%d weight matrices (%.0f s)", done, total, elapsed_s)


@dataclass
class BuildInfo:
    """Operator-facing facts about how the served model was built.

    Attributes:
        model_name: reference model name; revision: its weights revision; dtype: served dtype.
        load_s: seconds to load/copy the model; quant: ``QuantReport`` dict for quantized profiles.
        layers: decoder layers served (substituted: fewer than the reference).
        n_params: parameters of the served model.
    """

    model_name: str
    revision: str
    dtype: str
    load_s: float = 0.0
    quant: dict | None = None
    layers: int | None = None
    n_params: int = 0


def build_served_model(profile: Profile, lm: Any, copy_model: bool = True, *,
                       quant_cache_dir: Path | None = None) -> tuple[Any, BuildInfo]:
    """Return ``(LoadedModel with a ServedModel inside, BuildInfo)`` for ``profile``.

    Args:
        profile: the serving recipe.
        lm: a ``reference.models.LoadedModel`` of the reference (float32) model.
        copy_model: deep-copy the model before changing dtype/weights/layers (the caller's ``lm``
            stays intact); False modifies it in place (saves memory in ``auditor serve``).
        quant_cache_dir: cache the quantized weights of a weight-quantized profile here (the next
            start reads them in seconds; issue 38, item 11) and print quantization progress on stderr;
            None (tests, calibration) quantizes silently without a cache.

    Returns:
        (served LoadedModel, BuildInfo). The served ``LoadedModel.model`` is a :class:`ServedModel`.

    Raises:
        ValueError: the profile cannot be applied to this model (message names the field).
    """
    from reference.models import LoadedModel

    if recorded_of(profile) is not None:
        raise ValueError(f"profile {profile.name!r} replays outputs a real engine recorded (calibration only); "
                         "there is no model to serve: choose a simulator profile (auditor serve --list-profiles)")
    if profile.mix_with is not None:  # issue 14: mix-PROFILE:F (MixtureServedModel below)
        return build_mixture_served_model(profile, lm, copy_model)
    t0 = time.perf_counter()
    model = lm.model
    mutates = (profile.dtype != "float32" or profile.weight_quant or profile.substitute_layers is not None
               or profile.kv_cache_dtype or profile.act_quant)
    if mutates and copy_model:
        model = copy.deepcopy(model)
    info = BuildInfo(model_name=lm.name, revision=lm.revision, dtype=profile.dtype)
    if profile.substitute_layers is not None:
        n_total = len(model.model.layers)
        keep = resolve_substitute_layers(profile, n_total)
        assert keep is not None  # substitute_layers is set
        prune_layers_(model, keep)
    if profile.weight_quant:
        from simulator.quantize import quantize_model_weights

        if next(model.parameters()).dtype != torch.float32:
            model = model.float()
        cache_file = None
        if quant_cache_dir is not None and profile.substitute_layers is None:
            from simulator.quantize import quant_cache_file

            cache_file = quant_cache_file(quant_cache_dir, lm.name, lm.revision, profile.weight_quant,
                                          profile.group_size)
            if not cache_file.is_file():
                log.info("quantizing %s's weights to %s (first start only, a few minutes on 2 CPU cores; cached in %s)",
                         lm.name, profile.weight_quant, cache_file)
        rep = quantize_model_weights(model, profile.weight_quant, group_size=profile.group_size,
                                     cache_file=cache_file,
                                     progress=_quant_progress if quant_cache_dir is not None else None)
        info.quant = {
            "scheme": rep.scheme,
            "group_size": rep.group_size,
            "n_matrices": rep.n_matrices,
            "n_params": rep.n_params,
            "seconds": round(rep.seconds, 3),
            "mean_rel_error": rep.mean_rel_error,
            "backend": rep.backend,
            "errors": rep.errors,
            "cached": rep.cached,
        }
    if profile.kv_cache_dtype or profile.act_quant:  # issue 14: kv-fp8, w8a8 (simulator.quantize)
        from simulator.quantize import apply_runtime_quant

        info.quant = {**(info.quant or {}), **apply_runtime_quant(model, profile, lm.tokenizer)}
    if profile.dtype in ("bfloat16", "float16"):
        model = model.to(getattr(torch, profile.dtype))
        # 16-bit GEMMs accumulate in float32, as on a GPU (and 4-6x faster here than native CPU kernels)
        from simulator.quantize import install_fp32_accumulation

        install_fp32_accumulation(model)
    model.eval()
    served = ServedModel(model, sigma=profile.logit_noise)
    served.eval()
    info.layers = len(getattr(getattr(model, "model", None), "layers", []) or []) or None
    info.n_params = int(sum(p.numel() for p in model.parameters()))
    info.load_s = time.perf_counter() - t0
    dtype = getattr(torch, profile.dtype)
    slm = LoadedModel(
        model=served, tokenizer=lm.tokenizer, name=lm.name, path=lm.path, revision=lm.revision, dtype=dtype,
        device=lm.device,
    )
    return slm, info


def mean_kl(p_logprobs: torch.Tensor, q_logprobs: torch.Tensor) -> float:
    """Mean over rows of KL(p || q) in nats; inputs ``[n, V]`` log-probabilities."""
    p = p_logprobs.double()
    q = q_logprobs.double()
    kl = (p.exp() * (p - q)).sum(-1)
    return float(kl.mean()) if kl.numel() else math.nan



# ------------------------------------------------------------------------------------------ mixtures
# ``mix-PROFILE:F`` profiles: a provider that serves a fraction F of requests with another profile.
#
# Models load-dependent routing to a cheaper replica, published as randomized model substitution
# (issue 14, item 4; ``../shared/REFERENCES.md``). Each request is routed by its (choice) seed:
# ``mix_selects(seed, F)`` hashes the seed with BLAKE2b to a uniform in [0, 1) and routes the
# request to the other profile when it falls below F, so the choice is deterministic per request and
# the fraction of routed requests is Binomial(n, F) over independent seeds.
#
# What is mixed: the served model (weights, dtype, KV/activation quantization, pruning, logit noise)
# and the verification rule (``simulator.verifiers.make_verifier(profile, request_seed=...)``).
# Request rewrites of the other profile (forced top-p/top-k, compliance faults) and its drafter are
# not mixed: the drafter stays the primary's (only speed and acceptance, not the output law under a
# strict rule, depend on it).
# (mix_selects, the routing rule, lives in simulator.profiles beside mix_fraction.)


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
