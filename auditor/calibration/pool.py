"""Pools: one simulator profile's provider outputs, collected once and replayed by every audit.

A pool holds, for a fixed set of chat requests (:func:`build_requests`: one temperature-0
continuation of every distinct prompt of the shipped suites, ``n`` temperature-1 samples per
prompt), every position's emitted token, the provider's reported logprob and top-20 alternatives,
and the reference's top-20 at the provider's own prefix (teacher forcing), in every honest
reference precision. :class:`Pool` is the data and its ``.npz`` file format; collecting one is
:mod:`auditor.calibration.collect`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from probes.suites import load_suite

if TYPE_CHECKING:
    from simulator.profiles import Profile

__all__ = [
    "POOL_FORMAT",
    "POOL_SUITES",
    "PROVIDER_TOP_N",
    "REF_TOP_K",
    "SCORE_BATCH_SIZE",
    "Pool",
    "PoolConfig",
    "PoolRequest",
    "build_requests",
    "calibration_cache_dir",
    "short_sha",
    "suite_fingerprint",
]

#: Bump whenever the pool arrays or their meaning change (invalidates cached pools).
POOL_FORMAT = 3
#: Reference top-K kept per position, and provider alternatives kept (OpenAI's maximum).
REF_TOP_K = 20
PROVIDER_TOP_N = 20
#: Teacher-forcing batch size of the pipeline (``auditor.check.reference_scoring.SCORE_BATCH_SIZE``).
SCORE_BATCH_SIZE = 8
#: Suites whose prompts make up the pools (distinct prompts; the default suite first).
POOL_SUITES = ("default", "chat", "code", "math", "repetition")


def calibration_cache_dir() -> Path:
    """``$SPEC_AUDITOR_HOME/calibration`` or ``<platformdirs user cache>/spec-auditor/calibration``."""
    home = os.environ.get("SPEC_AUDITOR_HOME")
    if home:
        return Path(home).expanduser() / "calibration"
    import platformdirs

    return Path(platformdirs.user_cache_dir("spec-auditor")) / "calibration"


def short_sha(obj: object, n: int = 16) -> str:
    """First ``n`` hex digits of the sha256 of ``obj``'s canonical JSON (sorted keys; ``str`` for the rest)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


@dataclass(frozen=True)
class PoolConfig:
    """What a profile's pool holds.

    Attributes:
        suites: suites whose distinct prompts are used (chat messages; the pools are chat-API).
        t0_max_tokens: max completion tokens of a temperature-0 request (the greedy/logprob probes).
        sampling_samples: temperature-1 samples per prompt for batched (plain-decoding) profiles.
        honest_sampling_samples: samples per prompt for honest profiles (None = ``sampling_samples``).
            Their pools must be much larger than an audit's sampled tokens: audits resample one
            pool, and a pool whose realised tail or PIT happens to sit 1.5 sd off would bias every
            audit drawn from it (the false-accusation estimate is the delicate one).
        engine_sampling_samples: samples per prompt where the simulator engine must run
            (lossy verifiers; single-sequence speculative loop, ~8x slower on CPU).
        sampling_max_tokens: max completion tokens of a temperature-1 request.
        max_prompts: use only the first N distinct prompts (CI miniature); None = all.
        seed: base seed of every request (reproducible pools).
        batch_size: sequences per batched forward (128; was 32). Alone on one core ``decode_rows``
            is ~6% faster per token at 128 rows than at 32 (``benchmarks/pool_collection.py``);
            two processes decoding side by side gain almost nothing, as they share memory bandwidth.
        noisy_batch_size: sequences per batched forward of a model with kernel noise
            (honest-noisy): its noise is drawn per batch (``simulator.served_model.ServedModel``), so the
            batch composition is part of that profile's output law and stays at its own size.
        engine_batch_size: requests the simulator engine decodes in lock step
            (``simulator.engine.SimulatorEngine.generate_batch``; 1 = one at a time). Each request keeps its own
            drafts, verifier and draws, so the law is the sequential loop's; at 32 requests an engine pool's
            requests take ~2.3x less time on one core (``benchmarks/engine_batch.py``).
        emulate_rules: serve greedy-verify's sampling and decode-noncompliant's greedy requests by
            batched decoding with the verifier's per-position rule (exactly its output law;
            ~8x cheaper) instead of through the simulator engine.
    """

    suites: tuple[str, ...] = POOL_SUITES
    t0_max_tokens: int = 64
    sampling_samples: int = 4
    engine_sampling_samples: int = 2
    honest_sampling_samples: int | None = 12
    sampling_max_tokens: int = 24
    max_prompts: int | None = None
    seed: int = 0
    batch_size: int = 128
    noisy_batch_size: int = 32
    engine_batch_size: int = 32
    emulate_rules: bool = True

    def key_dict(self) -> dict:
        """The fields that key a pool's cache file (see ``pool_path``)."""
        d = asdict(self)
        d.pop("batch_size")  # changes the draws, not their law (noise-free models; see noisy_batch_size)
        d.pop("engine_batch_size")  # the same: each request's own draws, the float rounding of a batch
        d.pop("emulate_rules")  # enters the pool key through the backends it selects (pool_path)
        d.pop("honest_sampling_samples")  # enters the key of honest profiles only (pool_path)
        return d

    def samples_for(self, profile: Profile, engine: bool) -> int:
        """Temperature-1 samples per prompt for ``profile`` (engine-served or batched)."""
        if engine:
            return self.engine_sampling_samples
        if profile.honest and self.honest_sampling_samples is not None:
            return self.honest_sampling_samples
        return self.sampling_samples


@dataclass(frozen=True)
class PoolRequest:
    """One provider request of a pool.

    Attributes:
        key: unique id ``{prompt_id}@t{temperature}#{sample}``.
        prompt_id: ``p-`` + 10 hex of the chat messages' sha256.
        workload: code | math | chat | repetition.
        prompt_ids: chat-template token ids (reference tokenizer).
        max_tokens: completion budget (tokens).
        temperature: 0 (greedy/logprob probes) or 1 (sampling probes).
        seed: request seed.
    """

    key: str
    prompt_id: str
    workload: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float
    seed: int


def _distinct_prompts(cfg: PoolConfig) -> list[tuple[str, str, list[dict]]]:
    """(prompt_id, workload, messages) of every distinct prompt of the configured suites, in order."""
    seen: dict[str, tuple[str, str, list[dict]]] = {}
    for name in cfg.suites:
        for p in load_suite(name).probes:
            msgs = p.chat_messages()
            pid = "p-" + short_sha(msgs, 10)
            if pid not in seen:
                seen[pid] = (pid, p.workload, msgs)
    out = list(seen.values())
    if cfg.max_prompts is not None:
        # keep the workloads balanced in miniatures: round-robin over workloads
        by: dict[str, list] = {}
        for it in out:
            by.setdefault(it[1], []).append(it)
        rr: list = []
        while len(rr) < min(cfg.max_prompts, len(out)):
            for w in list(by):
                if by[w] and len(rr) < cfg.max_prompts:
                    rr.append(by[w].pop(0))
        out = rr
    return out


def suite_fingerprint(cfg: PoolConfig) -> dict:
    """Suite name → [version, digest] of every suite the pool draws prompts from (part of its cache key)."""
    return {n: [load_suite(n).version, load_suite(n).digest] for n in cfg.suites}


def build_requests(
    tokenizer: Any, cfg: PoolConfig, *, engine: bool = False, n_samples: int | None = None,
    opener: tuple[int, ...] = (),
) -> list[PoolRequest]:
    """The pool's requests: one T=0 request per distinct prompt and ``n`` T=1 samples per prompt.

    Args:
        tokenizer: the reference tokenizer (chat template).
        cfg: pool configuration.
        engine: True when the T=1 requests will run through the simulator engine (uses
            ``cfg.engine_sampling_samples`` samples per prompt unless ``n_samples`` is given).
        n_samples: samples per prompt (overrides the config; see ``PoolConfig.samples_for``).
        opener: token ids the template appends after the generation prompt (a reasoning-mode pool's
            ``<think>\n``, ``auditor.calibration.reasoning.opener_ids``); () for plain chat.

    Returns:
        T=0 requests first, then T=1 requests grouped by prompt.
    """
    from reference.scoring import encode_prompt

    reqs: list[PoolRequest] = []
    n_s = n_samples if n_samples is not None else (cfg.engine_sampling_samples if engine else cfg.sampling_samples)
    prompts = _distinct_prompts(cfg)
    enc = {pid: tuple(encode_prompt(tokenizer, msgs, chat=True)) + tuple(opener) for pid, _, msgs in prompts}
    for i, (pid, w, _) in enumerate(prompts):
        reqs.append(PoolRequest(f"{pid}@t0#0", pid, w, enc[pid], cfg.t0_max_tokens, 0.0, cfg.seed + i))
    for pid, w, _ in prompts:
        for s in range(n_s):
            seed = int(short_sha([cfg.seed, pid, s], 15), 16)
            reqs.append(PoolRequest(f"{pid}@t1#{s}", pid, w, enc[pid], cfg.sampling_max_tokens, 1.0, seed))
    return reqs


@dataclass
class Pool:
    """One profile's collected provider outputs with the reference at the same prefixes.

    Items are requests; positions are concatenated over items (N positions in all).

    Attributes:
        profile: simulator profile name.
        model, revision: reference model name and weights revision.
        meta: provenance (pool config, suite fingerprints, backends, timings, code format).
        item_keys: [I] request keys; item_prompt: [I] prompt ids; item_workload: [I];
        item_temperature: [I] float64; item_offsets: [I+1] int64 (positions of item i are
            ``item_offsets[i]:item_offsets[i+1]``).
        token_ids: [N] int64 emitted tokens (reference vocabulary; the simulator shares it).
        prov_logprob: [N] float64 provider's reported logprob of the emitted token (nats).
        prov_top_ids / prov_top_lp: [N, 20] provider's top-20 alternatives (raw log-softmax of the
            served model, descending; a request with ``top_logprobs=M`` sees the first M).
        ref_top_ids / ref_top_lp: reference dtype (``float32``, ``bfloat16``: the honest
            precisions of ``auditor.check.measured_floors.REFERENCE_DTYPES``) → [N, 20] reference top-20 at the
            provider's prefix (int64 ids, float64 nats).
        ref_token_lp: reference dtype → [N] float64 reference log p(emitted token) (nats).
        item_prompt_tokens: [I] int64 prompt tokens per item, or None (older pools).
        token_span: [N] str span label of each position in a reasoning-mode pool (``think:PROFILE``;
            ``reasoning`` / ``close`` / ``answer``, ``auditor.calibration.reasoning``), None for a plain pool.
        step_final: [N] float64 in a reasoning-mode pool: 1.0 at the last token of its streamed chunk, 0.0 inside
            one, NaN unknown (``EvidenceBatch.step_final``); None for a plain pool.
    """

    profile: str
    model: str
    revision: str
    meta: dict
    item_keys: np.ndarray
    item_prompt: np.ndarray
    item_workload: np.ndarray
    item_temperature: np.ndarray
    item_offsets: np.ndarray
    token_ids: np.ndarray
    prov_logprob: np.ndarray
    prov_top_ids: np.ndarray
    prov_top_lp: np.ndarray
    ref_top_ids: dict[str, np.ndarray]
    ref_top_lp: dict[str, np.ndarray]
    ref_token_lp: dict[str, np.ndarray]
    item_prompt_tokens: np.ndarray | None = None
    token_span: np.ndarray | None = None
    step_final: np.ndarray | None = None

    _ARRAYS = (
        "item_keys",
        "item_prompt",
        "item_workload",
        "item_temperature",
        "item_offsets",
        "token_ids",
        "prov_logprob",
        "prov_top_ids",
        "prov_top_lp",
    )
    _REF_ARRAYS = ("ref_top_ids", "ref_top_lp", "ref_token_lp")

    @property
    def references(self) -> list[str]:
        """Reference dtypes the pool was scored with (``float32`` first)."""
        return sorted(self.ref_top_ids, key=lambda r: (r != "float32", r))

    # ------------------------------------------------------------------ views
    @property
    def item_lengths(self) -> np.ndarray:
        """[I] int64 completion tokens per item."""
        return np.diff(self.item_offsets)

    def items_at(self, temperature: float) -> np.ndarray:
        """Indices of the items requested at ``temperature`` (non-empty continuations only)."""
        return np.flatnonzero((np.abs(self.item_temperature - temperature) < 1e-9) & (self.item_lengths > 0))

    def tokens_at(self, temperature: float) -> int:
        """Completion tokens the pool holds at ``temperature``."""
        return int(self.item_lengths[self.items_at(temperature)].sum())

    def summary(self) -> dict:
        """Sizes: items and tokens at T=0 and T=1 (and, in a reasoning-mode pool, tokens per span)."""
        out: dict[str, Any] = {
            "t0_items": int(self.items_at(0.0).size),
            "t0_tokens": self.tokens_at(0.0),
            "t1_items": int(self.items_at(1.0).size),
            "t1_tokens": self.tokens_at(1.0),
        }
        if self.token_span is not None:
            out["span_tokens"] = {str(k): int(n) for k, n in zip(*np.unique(self.token_span, return_counts=True),
                                                                 strict=True)}
        return out

    # ------------------------------------------------------------------ io
    def save(self, path: Path) -> None:
        """Write the pool as one ``.npz`` (arrays + JSON meta). Atomic (temp file + rename)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {k: getattr(self, k) for k in self._ARRAYS}
        if self.item_prompt_tokens is not None:
            arrays["item_prompt_tokens"] = np.asarray(self.item_prompt_tokens, np.int64)
        if self.token_span is not None:  # reasoning-mode pools only: plain pools' files are unchanged
            arrays["token_span"] = np.asarray(self.token_span, dtype=str)
        if self.step_final is not None:
            arrays["step_final"] = np.asarray(self.step_final, np.float64)
        for k in ("item_keys", "item_prompt", "item_workload"):
            arrays[k] = np.asarray(arrays[k], dtype=str)
        for k in self._REF_ARRAYS:
            for r, a in getattr(self, k).items():
                arrays[f"{k}__{r}"] = a
        head = {"profile": self.profile, "model": self.model, "revision": self.revision, "meta": self.meta}
        buf = io.BytesIO()
        np.savez_compressed(buf, __head__=np.asarray(json.dumps(head, default=str)), **arrays)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(buf.getvalue())
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Pool:
        """Read a pool written by :meth:`save`.

        Raises:
            ValueError: the file is not a pool of the current POOL_FORMAT.
        """
        with np.load(path, allow_pickle=False) as z:
            head = json.loads(str(z["__head__"]))
            if head.get("meta", {}).get("pool_format") != POOL_FORMAT:
                raise ValueError(f"{path}: pool format {head.get('meta', {}).get('pool_format')} != {POOL_FORMAT}")
            arrays: dict[str, Any] = {k: z[k] for k in cls._ARRAYS}
            for k in cls._REF_ARRAYS:
                arrays[k] = {n.split("__", 1)[1]: z[n] for n in z.files if n.startswith(k + "__")}
            for k in ("item_prompt_tokens", "token_span", "step_final"):  # optional arrays
                arrays[k] = z[k] if k in z.files else None
        return cls(profile=head["profile"], model=head["model"], revision=head["revision"], meta=head["meta"], **arrays)
