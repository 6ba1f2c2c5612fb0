"""Collecting a profile's pool in-process, and the on-disk cache of pools.

Two backends (the package docstring, :mod:`auditor.calibration`, says why each is exact): where a
profile serves plain decoding at a temperature (strict/lossless verification, and the greedy path
of the lossy verifiers) requests are decoded in batches from the simulator's served model
(``simulator.served_model.build_served_model``), with the verifier's draft-independent per-position rule
where it has one (``greedy-verify``, ``decode-noncompliant``); where the verifier's law depends on
the drafts (``relaxed-threshold``, ``typical-acceptance`` at T > 0) every request goes through
:class:`simulator.engine.SimulatorEngine` itself. The reference is then teacher-forced at the
provider's prefixes in every honest precision.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from auditor.calibration.decoding import choice_row, decode_rows
from auditor.calibration.pool import (
    POOL_FORMAT,
    PROVIDER_TOP_N,
    Pool,
    PoolConfig,
    PoolRequest,
    build_requests,
    calibration_cache_dir,
    short_sha,
    suite_fingerprint,
)
from auditor.calibration.reasoning import close_ids, decode_reasoning_rows, engine_result, opener_ids
from auditor.calibration.reference_side import as_refs, assemble_pool, score_reference
from simulator.profiles import Profile, get_profile, reasoning_of, recorded_of

if TYPE_CHECKING:
    from auditor.calibration.reference_side import RefModels
    from simulator.engine import ChoiceResult

__all__ = [
    "MIX_BASE_PROFILE", "backend_for", "collect_pool", "load_or_collect_pool", "mix_components", "mix_pools",
    "pool_path",
]


#: Where each lossy verifier changes the output law: at "sampling" (T > 0) or "greedy" (T = 0)
#: requests. At the other temperature it verifies exactly (simulator/verifiers.py).
_LOSSY_AT = {
    "relaxed-threshold": "sampling",
    "typical-acceptance": "sampling",
    "greedy-verify": "sampling",
    "decode-noncompliant": "greedy",
    "greedy-relaxed": "greedy",  # T=0 top-2-within-margin acceptance: depends on the drafts
    "synthetic-acceptance": "both",  # the drafter's tokens emitted unverified at every temperature (issue 35)
    # greedy rounds that share a batch with sampled traffic keep their drafts unverified (issue 40); without this
    # entry its pools would be plain decoding, i.e. an honest provider's (tests/calibrate/test_pool.py)
    "unverified-mixed-batch": "greedy",
}
#: Lossy only in reasoning mode (``think:PROFILE``): relaxed-think relaxes the greedy path inside <think> and
#: verifies strictly everywhere else, so served as plain chat its law is plain decoding.
_LOSSY_IN_REASONING = {"relaxed-think": "greedy"}
#: Lossy verifiers whose output law does not depend on the drafts, so batched decoding with a
#: per-position rule reproduces it exactly (the rule is the verifier's own, per its docstring):
#: greedy-verify emits argmax p at every position; decode-noncompliant emits the 2nd-ranked token
#: of p with probability ``greedy_flip_rate`` per position, independently.
_RULES = {"greedy-verify": "argmax", "decode-noncompliant": "flip2nd"}


def backend_for(profile: Profile, temperature: float, *, emulate: bool = True) -> str:
    """How a profile's requests at ``temperature`` are served in the pool.

    Returns:
        ``mixed`` for a ``mix-PROFILE:F`` profile (its pool routes whole requests between the
        honest-fp32 pool and PROFILE's, :func:`mix_pools`), else
        ``batched`` (plain decoding of the served model: strict verification is lossless),
        ``rule`` (batched decoding with the verifier's draft-independent rule, see ``_RULES``;
        only with ``emulate``), or ``engine`` (the simulator's speculative loop: the verifier's
        law depends on the drafts — relaxed-threshold, typical-acceptance).
    """
    if profile.mix_with is not None:
        return "mixed"  # per-request routing of two component pools (mix_pools)
    at = _LOSSY_AT.get(profile.verifier)
    if at is None and reasoning_of(profile) is not None:
        at = _LOSSY_IN_REASONING.get(profile.verifier)
    if at is None or (at != "both" and (at == "sampling") != (temperature > 0)):
        return "batched"
    if emulate and profile.verifier in _RULES:
        return "rule"
    return "engine"


def _served_is_reference(profile: Profile) -> bool:
    return (
        profile.dtype == "float32"
        and not profile.weight_quant
        and profile.substitute_layers is None
        and profile.logit_noise == 0
        and profile.kv_cache_dtype is None
        and profile.act_quant is None
        and profile.mix_with is None
    )


def collect_pool(
    profile_name: str,
    ref_lms: RefModels,
    cfg: PoolConfig | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> Pool:
    """Collect one profile's pool in-process (see the module docstring for the two backends).

    Args:
        profile_name: a simulator profile (``simulator.profiles.PROFILES``), or ``recorded:NAME`` (a real engine's
            recorded outputs, :func:`auditor.calibration.recorded.collect_recorded_pool`).
        ref_lms: reference dtype → ``LoadedModel`` of the reference weights in that precision
            (``float32`` required; ``bfloat16`` too when the audit compares with the nearest honest
            reference, ``auditor.check.measured_floors``), or one float32 ``LoadedModel``. The served model is
            built from the float32 one (copied where the profile changes weights/dtype/layers;
            the reference is not modified).
        cfg: pool configuration (default ``PoolConfig()``).
        progress: optional callback receiving one-line status messages.

    Returns:
        The Pool (not yet saved; see :func:`load_or_collect_pool`).

    Raises:
        KeyError: unknown profile.
    """
    from simulator.served_model import build_served_model  # torch

    cfg = cfg or PoolConfig()
    ref_lms = as_refs(ref_lms)
    ref_lm = ref_lms["float32"]
    say = progress or (lambda _m: None)
    profile = get_profile(profile_name)
    if recorded_of(profile) is not None:  # a real engine's recorded outputs (auditor.calibration.recorded)
        from auditor.calibration.recorded import collect_recorded_pool

        return collect_recorded_pool(profile_name, ref_lms, cfg, progress=progress)
    t_start = time.perf_counter()
    served_lm, info = build_served_model(profile, ref_lm, copy_model=True)
    eos = list(ref_lm.eos_token_ids)
    be = {t: backend_for(profile, t, emulate=cfg.emulate_rules) for t in (0.0, 1.0)}
    think = reasoning_of(profile)  # reasoning mode (think:PROFILE): reasoning budget in tokens, else None
    reqs = build_requests(ref_lm.tokenizer, cfg, n_samples=cfg.samples_for(profile, be[1.0] == "engine"),
                          opener=opener_ids(ref_lm.tokenizer) if think is not None else ())
    close = close_ids(ref_lm.tokenizer) if think is not None else []
    results: dict[str, dict] = {}
    backends: Counter = Counter()
    engine = None
    t_gen = time.perf_counter()
    # --- T = 0
    t0 = [r for r in reqs if r.temperature == 0]
    t1 = [r for r in reqs if r.temperature > 0]
    eff_p = profile.forced_top_p if profile.forced_top_p is not None else 1.0
    eff_k = profile.forced_top_k if profile.forced_top_k is not None else 0

    def via_engine(rs: list[PoolRequest]) -> None:
        nonlocal engine
        from simulator.engine import SimulatorEngine
        from simulator.reasoning import generate_reasoning, generate_reasoning_batch

        if engine is None:
            # the engine builds its served model from the reference (a copy), as `auditor serve` does
            engine = SimulatorEngine(profile, ref_lm, seed=cfg.seed, copy_model=True)
        # lock-step batches of one temperature where the engine can (reference.speculative_batch: each
        # request's own drafts, verifier and draws, one target forward per round); else one at a time
        batch = cfg.engine_batch_size if engine.batch_unsupported() is None and all(len(r.prompt_ids) >= 2 for r in rs) else 1
        order = sorted(range(len(rs)), key=lambda i: len(rs[i].prompt_ids))  # similar lengths share a prefill
        chs: list[ChoiceResult] = []
        for b in range(0, len(rs), batch):
            chunk = [rs[i] for i in order[b : b + batch]]
            if think is not None:  # reasoning mode (think:PROFILE): generate_reasoning, batched where it can
                if batch > 1:
                    chs += generate_reasoning_batch(
                        engine, [list(r.prompt_ids) for r in chunk], max_tokens=[r.max_tokens for r in chunk], budget=think,
                        temperature=chunk[0].temperature, seeds=[r.seed for r in chunk], top_n=PROVIDER_TOP_N)
                else:
                    chs += [generate_reasoning(engine, list(r.prompt_ids), max_tokens=r.max_tokens, budget=think,
                                               temperature=r.temperature, seed=r.seed, top_n=PROVIDER_TOP_N)
                            for r in chunk]
            elif batch > 1:
                chs += engine.generate_batch([list(r.prompt_ids) for r in chunk], max_tokens=[r.max_tokens for r in chunk],
                                             temperature=chunk[0].temperature, seeds=[r.seed for r in chunk],
                                             top_n=PROVIDER_TOP_N)
            else:
                chs += [engine.generate(list(r.prompt_ids), max_tokens=r.max_tokens, temperature=r.temperature,
                                        seed=r.seed, top_n=PROVIDER_TOP_N) for r in chunk]
            say(f"{profile_name}: engine {len(chs)}/{len(rs)} requests" + (f" (batches of {batch})" if batch > 1 else ""))
        for i, ch in zip(order, chs, strict=True):
            results[rs[i].key] = engine_result(ch) if think is not None else choice_row(ch)
            backends["engine"] += 1

    def via_batched(rs: list[PoolRequest], temperature: float) -> None:
        model = served_lm.model
        rule = _RULES.get(profile.verifier) if be[temperature] == "rule" else None
        tag = "rule" if rule else "batched"
        bs = cfg.noisy_batch_size if getattr(model, "sigma", 0.0) > 0 else cfg.batch_size
        if temperature == 0:
            for b in range(0, len(rs), bs):
                chunk = rs[b : b + bs]
                if hasattr(model, "nonce"):
                    model.nonce = chunk[0].seed  # honest-noisy: a fresh "batch" of kernel noise
                if think is not None:
                    outs = decode_reasoning_rows(
                        model, [r.prompt_ids for r in chunk], budget=think, close=close,
                        max_tokens=[r.max_tokens for r in chunk], temperature=0.0, top_p=1.0, top_k=0, eos_ids=eos,
                        seeds=[r.seed for r in chunk], rule=rule, flip_rate=profile.greedy_flip_rate,
                    )
                else:
                    outs = decode_rows(
                        model,
                        [r.prompt_ids for r in chunk],
                        max_new_tokens=max(r.max_tokens for r in chunk),
                        temperature=0.0,
                        top_p=1.0,
                        top_k=0,
                        eos_ids=eos,
                        seeds=[r.seed for r in chunk],
                        rule=rule,
                        flip_rate=profile.greedy_flip_rate,
                    )
                for r, o in zip(chunk, outs, strict=True):
                    results[r.key] = _cut(o, r.max_tokens)
                    backends[tag] += 1
                say(f"{profile_name}: T=0 {min(b + bs, len(rs))}/{len(rs)} requests")
        else:
            by: dict[str, list[PoolRequest]] = {}
            for r in rs:
                by.setdefault(r.prompt_id, []).append(r)
            groups = list(by.values())
            n_s = max(len(g) for g in groups)
            per = max(1, bs // n_s)  # prompts per batch; each decoded n_s times
            for b in range(0, len(groups), per):
                gchunk = groups[b : b + per]
                if hasattr(model, "nonce"):
                    model.nonce = gchunk[0][0].seed
                if think is not None:
                    if any(len(g) != n_s for g in gchunk):
                        raise ValueError(f"{profile_name}: reasoning-mode pools need n_s={n_s} samples of every prompt")
                    outs = decode_reasoning_rows(
                        model, [g[0].prompt_ids for g in gchunk], budget=think, close=close,
                        max_tokens=[r.max_tokens for g in gchunk for r in g], temperature=temperature, top_p=eff_p,
                        top_k=eff_k, eos_ids=eos, seeds=[r.seed for g in gchunk for r in g], expand=n_s, rule=rule,
                        flip_rate=profile.greedy_flip_rate,
                    )
                else:
                    outs = decode_rows(
                        model,
                        [g[0].prompt_ids for g in gchunk],
                        max_new_tokens=max(r.max_tokens for g in gchunk for r in g),
                        temperature=temperature,
                        top_p=eff_p,
                        top_k=eff_k,
                        eos_ids=eos,
                        seeds=[r.seed for g in gchunk for r in g],
                        expand=n_s,
                        rule=rule,
                        flip_rate=profile.greedy_flip_rate,
                    )
                for gi, g in enumerate(gchunk):
                    for si, r in enumerate(g):
                        results[r.key] = _cut(outs[gi * n_s + si], r.max_tokens)
                        backends[tag] += 1
                say(f"{profile_name}: T=1 {min(b + per, len(groups))}/{len(groups)} prompts")

    for temp, rs in ((0.0, t0), (1.0, t1)):
        if not rs:
            continue
        if be[temp] == "engine":
            via_engine(rs)
        else:
            via_batched(rs, temp)
    gen_s = time.perf_counter() - t_gen
    del engine
    # --- reference at the provider's prefixes
    t_ref = time.perf_counter()
    same = _served_is_reference(profile)
    ref = score_reference(
        profile_name, reqs, results, ref_lms,
        reuse=lambda r: same and be[r.temperature] == "batched", progress=say,
    )
    ref_s = time.perf_counter() - t_ref
    pool = assemble_pool(profile_name, ref_lm, reqs, results, ref)
    pool.meta.update(
        {
            "pool_format": POOL_FORMAT,
            "pool_config": cfg.key_dict(),
            "suites": suite_fingerprint(cfg),
            "profile": profile.describe(),
            "backends": dict(backends),
            "backend_t0": be[0.0],
            "backend_t1": be[1.0],
            **({"reasoning_budget": think} if think is not None else {}),
            "served": {"dtype": info.dtype, "layers": info.layers, "quant": info.quant},
            "generate_s": round(gen_s, 2),
            "reference_s": round(ref_s, 2),
            "total_s": round(time.perf_counter() - t_start, 2),
            **pool.summary(),
        }
    )
    say(f"{profile_name}: pool {pool.summary()} in {pool.meta['total_s']:.0f}s")
    return pool


def _cut(o: dict, n: int) -> dict:
    """Every per-position array of a decoded row cut to its first ``n`` positions."""
    return {k: v[:n] for k, v in o.items()}


def pool_path(profile_name: str, ref_lms: RefModels, cfg: PoolConfig, cache_dir: Path | None = None) -> Path:
    """Cache file of a pool: keyed by model revision, reference precisions, profile recipe,
    suites (versions and digests), pool config, the backends that serve it, and pool format."""
    refs = as_refs(ref_lms)
    ref_lm = refs["float32"]
    prof = get_profile(profile_name)
    backends = [backend_for(prof, t, emulate=cfg.emulate_rules) for t in (0.0, 1.0)]
    key_src: dict[str, Any] = {
        "revision": str(ref_lm.revision),
        "model": str(ref_lm.name),
        "profile": prof.describe(),
        "suites": suite_fingerprint(cfg),
        "cfg": cfg.key_dict(),
        "references": sorted(refs),
        "format": POOL_FORMAT,
    }
    if backends != ["batched", "batched"]:
        key_src["backends"] = backends
    if prof.honest and cfg.honest_sampling_samples is not None:
        key_src["honest_samples"] = cfg.honest_sampling_samples
    rec = recorded_of(prof)
    if rec is not None:
        from auditor.calibration.recorded import recording_sha256

        key_src["recording"] = recording_sha256(rec)
    key = short_sha(key_src)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(ref_lm.revision))[:12]
    return (cache_dir or calibration_cache_dir()) / "pools" / f"{profile_name}-{safe}-{key}.npz"


#: The base pool of every mixture profile ``mix-OTHER:F`` (``simulator.profiles``: honest-fp32 except F).
MIX_BASE_PROFILE = "honest-fp32"


def mix_components(profile_name: str) -> tuple[str, str] | None:
    """(base, other) pools a mixture profile is built from (:func:`mix_pools`), None for any other profile."""
    other = get_profile(profile_name).mix_with
    return None if other is None else (MIX_BASE_PROFILE, other)


def load_or_collect_pool(
    profile_name: str,
    ref_lms: RefModels,
    cfg: PoolConfig | None = None,
    *,
    cache_dir: Path | None = None,
    refresh: bool = False,
    progress: Callable[[str], None] | None = None,
) -> tuple[Pool, bool]:
    """The cached pool if present (and valid), else collect and cache it.

    Returns:
        (pool, from_cache).
    """
    cfg = cfg or PoolConfig()
    path = pool_path(profile_name, ref_lms, cfg, cache_dir)
    if path.is_file() and not refresh:
        try:
            return Pool.load(path), True
        except (ValueError, KeyError, OSError):
            pass  # stale or corrupt: recollect
    prof = get_profile(profile_name)
    parts = mix_components(profile_name)
    if parts is not None:
        base, other = (load_or_collect_pool(q, ref_lms, cfg, cache_dir=cache_dir, refresh=refresh, progress=progress)[0]
                       for q in parts)
        pool = mix_pools(profile_name, base, other, prof.mix_fraction, seed=cfg.seed)
    else:
        pool = collect_pool(profile_name, ref_lms, cfg, progress=progress)
    pool.save(path)
    return pool, False


def _cat(parts: list[tuple[Pool, int]], field: str, ref: str | None = None) -> np.ndarray:
    """The routed items' positions of a per-position array (``Pool.<field>``, or ``Pool.<field>[ref]``
    for the per-reference ones), concatenated in item order."""
    def rows(p: Pool) -> np.ndarray:
        a = getattr(p, field)
        return a[ref] if ref is not None else a

    return np.concatenate([rows(p)[p.item_offsets[j]:p.item_offsets[j + 1]] for p, j in parts])


def mix_pools(profile_name: str, base: Pool, other: Pool, fraction: float, *, seed: int = 0) -> Pool:
    """The pool of ``mix-OTHER:F``: each request served by ``other``'s model with probability F, else by the base's.

    A mixing provider routes whole requests (``simulator.served_model.MixtureServedModel``: the choice depends on the request's
    seed, not its content), so its output law is, request by request, that of one component; a pool
    built by routing each request key of the two component pools (the honest-fp32 pool and
    OTHER's, collected with the same prompts, seeds and references) has exactly that law. Only keys
    present in both pools are kept (the honest pool holds more samples per prompt).

    Args:
        profile_name: the mixture's profile name (recorded in the pool).
        base, other: the component pools (honest-fp32's and OTHER's).
        fraction: F in [0, 1].
        seed: routing seed (with the request key: the same key is routed the same way in every run).

    Returns:
        The mixed Pool; ``meta["mix"]`` records the components, F and the requests routed to OTHER.

    Raises:
        ValueError: the pools disagree on model, revision or reference precisions, or share no key.
    """
    if (base.model, base.revision, base.references) != (other.model, other.revision, other.references):
        raise ValueError(f"mix_pools: {base.profile} and {other.profile} pools differ in model, revision or references")
    where_other = {str(k): i for i, k in enumerate(other.item_keys)}
    keys = [(i, str(k)) for i, k in enumerate(base.item_keys) if str(k) in where_other]
    if not keys:
        raise ValueError(f"mix_pools: {base.profile} and {other.profile} pools share no request key")
    parts: list[tuple[Pool, int]] = []
    routed = []
    for i, k in keys:
        u = np.random.default_rng(np.random.SeedSequence([seed, int(short_sha(k, 12), 16)])).random()
        if u < fraction:
            parts.append((other, where_other[k]))
            routed.append(k)
        else:
            parts.append((base, i))

    lengths = np.array([p.item_offsets[j + 1] - p.item_offsets[j] for p, j in parts], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def per_item(name: str) -> np.ndarray:
        return np.array([getattr(p, name)[j] for p, j in parts])

    prompt_tokens = None
    if base.item_prompt_tokens is not None and other.item_prompt_tokens is not None:
        pt = {id(base): base.item_prompt_tokens, id(other): other.item_prompt_tokens}
        prompt_tokens = np.array([pt[id(p)][j] for p, j in parts], np.int64)
    meta = {**base.meta, "mix": {"base": base.profile, "other": other.profile, "fraction": fraction, "seed": seed,
                                 "requests": len(parts), "routed_to_other": len(routed)},
            "backends": {"mixed": len(parts)}}
    return Pool(
        profile=profile_name, model=base.model, revision=base.revision, meta=meta,
        item_keys=per_item("item_keys"), item_prompt=per_item("item_prompt"), item_workload=per_item("item_workload"),
        item_temperature=per_item("item_temperature").astype(np.float64), item_offsets=offsets,
        token_ids=_cat(parts, "token_ids"), prov_logprob=_cat(parts, "prov_logprob"),
        prov_top_ids=_cat(parts, "prov_top_ids"), prov_top_lp=_cat(parts, "prov_top_lp"),
        ref_top_ids={r: _cat(parts, "ref_top_ids", r) for r in base.references},
        ref_top_lp={r: _cat(parts, "ref_top_lp", r) for r in base.references},
        ref_token_lp={r: _cat(parts, "ref_token_lp", r) for r in base.references},
        item_prompt_tokens=prompt_tokens,
    )
