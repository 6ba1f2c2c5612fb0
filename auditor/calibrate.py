"""Detection benchmark: false-accusation rate and power of the audit per simulator profile × token budget.

How it works (issue 7):

1. **Pools, once per profile** (:func:`collect_pool`). For every simulator profile
   (``reference.simulator.profiles``) the provider's outputs for a fixed set of requests are
   collected once, in-process, and cached on disk under ``<cache>/calibration/pools`` keyed by
   (model revision, profile recipe, suite versions and digests, pool config, pool format):
   temperature-0 continuations of every distinct prompt of the shipped suites (the greedy and
   logprob probes; one continuation per prompt — at T = 0 a prompt has only one answer) and
   ``n`` temperature-1 samples per prompt (the sampling probes' law). Every position keeps the
   provider's emitted token, its reported logprob and top-20 alternatives, and the reference's
   top-20 at the provider's own prefix (teacher forcing), so any probe mix can be replayed.

   Backends: where a profile serves *plain* decoding of its served model at a temperature
   (strict/lossless verification — honest, quantized, substituted, truncated sampling, and the
   greedy path of the lossy verifiers, which ``reference.simulator.verifiers`` verifies exactly),
   the requests are decoded in batches directly from the simulator's served model
   (``reference.simulator.engine.build_served_model``): lossless speculative decoding has exactly
   the output law of plain decoding of the target (Leviathan et al. 2023, Thm. 1; tested in
   ``tests/reference``), and batching makes the pool ~8x cheaper on CPU. Where the profile's
   behaviour lives in its verifier at that temperature (``relaxed-threshold``,
   ``typical-acceptance``, ``greedy-verify`` at T > 0; ``decode-noncompliant`` at T = 0) every
   request goes through :class:`reference.simulator.engine.SimulatorEngine` itself (its drafter,
   verifier and seeds) — the very code ``auditor serve`` runs.

2. **Resampled audits** (:func:`run_calibration`). An audit at budget B draws probes from the
   pool without replacement in the proportions of a probe mix (:class:`AuditMix`; default: the
   default suite's greedy/logprob/sampling token shares and its ``top_logprobs`` widths),
   truncating the last continuation so the audit spends exactly B completion tokens, builds the
   detectors' :class:`~auditor.detectors.EvidenceBatch`, runs every detector, Holm and the
   verdict rules (:func:`audit_verdict`) — the same functions ``auditor check`` runs.

3. **Metrics** per profile × budget: rejection rate (a deviation verdict; on honest profiles the
   false-accusation rate, on the others the power) with a Clopper–Pearson 95% interval, the
   verdict confusion counts, cause-correct rate among rejections, INCONCLUSIVE rate, and
   per-detector contributions (how often each ran, rejected after Holm, and which rule decided).
   Written as JSON (:func:`write_outputs`), a Markdown table and a PNG plot, and stored in the
   ``calibration_results`` table (:func:`store_results`), which the dashboard's Calibration
   page reads.

Statistical caveat (stated in docs/calibration.md): audits are resampled from one finite pool
per profile; at budgets close to the pool's size audits overlap, so neighbouring audits are
positively correlated and the binomial interval is optimistic about the pool-to-pool spread.
Pool sizes are reported with every record.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ACCEPTED_CAUSES",
    "DEFAULT_AUDITS",
    "DEFAULT_BUDGETS",
    "POOL_FORMAT",
    "AuditDrawer",
    "AuditMix",
    "CalibrationRecord",
    "Pool",
    "PoolConfig",
    "PoolRequest",
    "audit_verdict",
    "build_requests",
    "calibration_cache_dir",
    "clopper_pearson",
    "collect_pool",
    "default_mix",
    "mix_budgets",
    "record_suite",
    "draw_audit",
    "evidence_for",
    "get_noise_floor",
    "load_or_collect_pool",
    "run_audits",
    "run_calibration",
    "score_groups",
    "score_prompt_groups",
    "store_results",
    "summarize_audits",
    "write_outputs",
]

#: Bump whenever the pool arrays or their meaning change (invalidates cached pools).
POOL_FORMAT = 3
DEFAULT_BUDGETS = (100, 300, 1000, 3000)
DEFAULT_AUDITS = 200
#: Reference top-K kept per position, and provider alternatives kept (OpenAI's maximum).
REF_TOP_K = 20
PROVIDER_TOP_N = 20
#: Teacher-forcing batch size of the pipeline (``auditor.audit.SCORE_BATCH_SIZE``).
SCORE_BATCH_SIZE = 8
#: Suites whose prompts make up the pools (distinct prompts; the default suite first).
POOL_SUITES = ("default", "chat", "code", "math", "repetition")

#: Verdicts that count as "cause named right" per profile, beyond ``Profile.expected_verdict``.
#: ``greedy-verify`` serves sampling requests greedily; the verdict rules (docs/detectors.md,
#: rule 4a) name that DECODING_NONCOMPLIANT while the simulator profile files it under
#: RELAXED_VERIFICATION; both describe the behaviour, so both count.
ACCEPTED_CAUSES: dict[str, tuple[str, ...]] = {
    "greedy-verify": ("RELAXED_VERIFICATION", "DECODING_NONCOMPLIANT"),
}

_DEVIATIONS = ("QUANTIZATION", "RELAXED_VERIFICATION", "SUBSTITUTION", "DECODING_NONCOMPLIANT")


# =============================================================================================
# cache
# =============================================================================================


def calibration_cache_dir() -> Path:
    """``$SPEC_AUDITOR_HOME/calibration`` or ``<platformdirs user cache>/spec-auditor/calibration``."""
    home = os.environ.get("SPEC_AUDITOR_HOME")
    if home:
        return Path(home).expanduser() / "calibration"
    import platformdirs

    return Path(platformdirs.user_cache_dir("spec-auditor")) / "calibration"


def _sha(obj: Any, n: int = 16) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


# =============================================================================================
# requests
# =============================================================================================


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
        batch_size: sequences per batched forward.
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
    batch_size: int = 32
    emulate_rules: bool = True

    def key_dict(self) -> dict:
        d = asdict(self)
        d.pop("batch_size")  # does not change the content (up to float reduction order)
        d.pop("emulate_rules")  # enters the pool key through the backends it selects (pool_path)
        d.pop("honest_sampling_samples")  # enters the key of honest profiles only (pool_path)
        return d

    def samples_for(self, profile: Any, engine: bool) -> int:
        """Temperature-1 samples per prompt for ``profile`` (engine-served or batched)."""
        if engine:
            return self.engine_sampling_samples
        if getattr(profile, "honest", False) and self.honest_sampling_samples is not None:
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
    from probes.suites import load_suite

    seen: dict[str, tuple[str, str, list[dict]]] = {}
    for name in cfg.suites:
        for p in load_suite(name).probes:
            msgs = p.chat_messages()
            pid = "p-" + _sha(msgs, 10)
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


def _suite_fingerprint(cfg: PoolConfig) -> dict:
    from probes.suites import load_suite

    return {n: [load_suite(n).version, load_suite(n).digest] for n in cfg.suites}


def build_requests(
    tokenizer: Any, cfg: PoolConfig, *, engine: bool = False, n_samples: int | None = None
) -> list[PoolRequest]:
    """The pool's requests: one T=0 request per distinct prompt and ``n`` T=1 samples per prompt.

    Args:
        tokenizer: the reference tokenizer (chat template).
        cfg: pool configuration.
        engine: True when the T=1 requests will run through the simulator engine (uses
            ``cfg.engine_sampling_samples`` samples per prompt unless ``n_samples`` is given).
        n_samples: samples per prompt (overrides the config; see ``PoolConfig.samples_for``).

    Returns:
        T=0 requests first, then T=1 requests grouped by prompt.
    """
    from reference.scoring import encode_prompt

    reqs: list[PoolRequest] = []
    n_s = n_samples if n_samples is not None else (cfg.engine_sampling_samples if engine else cfg.sampling_samples)
    prompts = _distinct_prompts(cfg)
    enc = {pid: tuple(encode_prompt(tokenizer, msgs, chat=True)) for pid, _, msgs in prompts}
    for i, (pid, w, _) in enumerate(prompts):
        reqs.append(PoolRequest(f"{pid}@t0#0", pid, w, enc[pid], cfg.t0_max_tokens, 0.0, cfg.seed + i))
    for i, (pid, w, _) in enumerate(prompts):
        for s in range(n_s):
            seed = int(_sha([cfg.seed, pid, s], 15), 16)
            reqs.append(PoolRequest(f"{pid}@t1#{s}", pid, w, enc[pid], cfg.sampling_max_tokens, 1.0, seed))
    return reqs


# =============================================================================================
# the pool
# =============================================================================================


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
            precisions of ``auditor.noise.REFERENCE_DTYPES``) → [N, 20] reference top-20 at the
            provider's prefix (int64 ids, float64 nats).
        ref_token_lp: reference dtype → [N] float64 reference log p(emitted token) (nats).
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
    def n_items(self) -> int:
        return int(self.item_keys.size)

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
        """Sizes: items and tokens at T=0 and T=1."""
        return {
            "t0_items": int(self.items_at(0.0).size),
            "t0_tokens": self.tokens_at(0.0),
            "t1_items": int(self.items_at(1.0).size),
            "t1_tokens": self.tokens_at(1.0),
        }

    # ------------------------------------------------------------------ io
    def save(self, path: Path) -> None:
        """Write the pool as one ``.npz`` (arrays + JSON meta). Atomic (temp file + rename)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {k: getattr(self, k) for k in self._ARRAYS}
        if self.item_prompt_tokens is not None:
            arrays["item_prompt_tokens"] = np.asarray(self.item_prompt_tokens, np.int64)
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
            arrays["item_prompt_tokens"] = z["item_prompt_tokens"] if "item_prompt_tokens" in z.files else None
        return cls(profile=head["profile"], model=head["model"], revision=head["revision"], meta=head["meta"], **arrays)


# =============================================================================================
# batched decoding and scoring (plain decoding of a served model; shared-prompt teacher forcing)
# =============================================================================================


def _inner(model: Any) -> Any:
    from reference.models import unwrap

    m, _ = unwrap(model)
    return m


def _top(logp, k: int):
    """[B, V] log-probs → (ids [B, k] int64, lps [B, k] float64) descending (numpy)."""
    import torch

    tv, ti = torch.topk(logp, k, dim=-1)
    return ti.cpu().numpy().astype(np.int64), tv.double().cpu().numpy()


def _decode_rows(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    eos_ids: Sequence[int],
    seeds: Sequence[int],
    top_n: int = PROVIDER_TOP_N,
    expand: int = 1,
    rule: str | None = None,
    flip_rate: float = 0.0,
) -> list[dict]:
    """Plain autoregressive decoding of a batch (left padding, KV cache) with per-position records.

    Args:
        model: the served model (``ServedModel`` or a causal LM).
        prompts: [B] prompt id lists; with ``expand > 1`` every prompt is decoded ``expand`` times
            (its prefill is computed once and the cache repeated); rows are prompt-major.
        max_new_tokens: tokens per row at most (EOS ends a row early; EOS is not emitted, as the
            simulator's responses exclude it).
        temperature, top_p, top_k: sampling (``reference.sampling.logits_to_probs``; 0 = greedy).
        eos_ids: end-of-sequence ids.
        seeds: the decoded rows' seeds; the batch's draws come from one generator seeded by their hash.
        top_n: alternatives recorded per position.
        expand: rows per prompt (see ``prompts``).
        rule: None (plain decoding), ``argmax`` (emit the argmax whatever the temperature: the
            output law of ``greedy-verify``'s verifier), or ``flip2nd`` (at T=0 emit the 2nd-ranked
            token with probability ``flip_rate`` per position, independently: the output law of
            ``decode-noncompliant``'s verifier, reference/simulator/verifiers.py).
        flip_rate: see ``rule``.

    Returns:
        One dict per row: ``token_ids`` [T] int64, ``logprob`` [T] float64 (raw log-softmax of the
        served model, nats), ``top_ids`` [T, top_n] int64, ``top_lp`` [T, top_n] float64.
    """
    import torch
    from transformers import DynamicCache

    from reference.sampling import logits_to_probs

    if expand < 1:
        raise ValueError(f"expand={expand} must be >= 1")
    B0 = len(prompts)
    B = B0 * expand
    L = max(len(p) for p in prompts)
    ids = torch.zeros((B0, L), dtype=torch.long)
    mask = torch.zeros((B0, L), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, L - len(p) :] = torch.tensor(list(p))
        mask[r, L - len(p) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    gen = torch.Generator().manual_seed(int(_sha(list(seeds), 15), 16))
    eos = torch.tensor(sorted({int(e) for e in eos_ids}) or [-1])
    recs = [{"token_ids": [], "logprob": [], "top_ids": [], "top_lp": []} for _ in range(B)]
    done = torch.zeros(B, dtype=torch.bool)
    with torch.inference_mode():
        cache = DynamicCache()
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values if getattr(out, "past_key_values", None) is not None else cache
        logits = out.logits[:, -1].float()
        if expand > 1:
            cache.batch_repeat_interleave(expand)
            mask = mask.repeat_interleave(expand, 0)
            pos = pos.repeat_interleave(expand, 0)
            logits = logits.repeat_interleave(expand, 0)
        last_pos = pos[:, -1]
        for _t in range(max_new_tokens):
            logp = torch.log_softmax(logits, dim=-1)
            if temperature == 0 or rule == "argmax":
                nxt = logits.argmax(-1)
                if rule == "flip2nd":
                    second = torch.topk(logits, 2, dim=-1).indices[:, 1]
                    coin = torch.rand(nxt.shape[0], dtype=torch.float64, generator=gen) < flip_rate
                    nxt = torch.where(coin, second, nxt)
            else:
                probs = logits_to_probs(logits, temperature, top_k, top_p, dtype=torch.float64)
                nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            is_eos = torch.isin(nxt, eos)
            tid, tlp = _top(logp, top_n)
            chosen = logp.gather(1, nxt.unsqueeze(1)).squeeze(1).double().numpy()
            nxt_np = nxt.numpy()
            for r in range(B):
                if done[r] or is_eos[r]:
                    continue
                rec = recs[r]
                rec["token_ids"].append(int(nxt_np[r]))
                rec["logprob"].append(float(chosen[r]))
                rec["top_ids"].append(tid[r])
                rec["top_lp"].append(tlp[r])
            done |= is_eos
            if bool(done.all()) or _t == max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones((B, 1), dtype=torch.long)], 1)
            last_pos = last_pos + 1
            out = model(
                input_ids=nxt.unsqueeze(1),
                attention_mask=mask,
                position_ids=last_pos.unsqueeze(1),
                cache=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1].float()
    res = []
    for rec in recs:
        T = len(rec["token_ids"])
        res.append(
            {
                "token_ids": np.asarray(rec["token_ids"], np.int64),
                "logprob": np.asarray(rec["logprob"], np.float64),
                "top_ids": np.asarray(rec["top_ids"], np.int64).reshape(T, top_n),
                "top_lp": np.asarray(rec["top_lp"], np.float64).reshape(T, top_n),
            }
        )
    return res


def score_groups(
    lm: Any,
    prompt_ids: Sequence[int],
    continuations: Sequence[Sequence[int]],
    *,
    top_k: int = REF_TOP_K,
    max_rows_tokens: int = 1024,
) -> list[dict]:
    """Teacher-force several continuations of ONE prompt (its prefill computed once).

    See :func:`score_prompt_groups` (this is the one-group case).
    """
    return score_prompt_groups(lm, [(prompt_ids, continuations)], top_k=top_k, max_rows_tokens=max_rows_tokens)[0]


def score_prompt_groups(
    lm: Any,
    groups: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]],
    *,
    top_k: int = REF_TOP_K,
    max_rows_tokens: int = 1024,
    max_prompts: int = 16,
) -> list[list[dict]]:
    """Teacher-force continuations grouped by prompt, batched, each prompt's prefill computed once.

    Same values as ``reference.scoring.score_continuations`` (raw log-softmax, nats) at a fraction
    of the cost when many samples share a prompt: the prompts of a chunk are prefilled together
    (left padding, KV cache), the cache rows are repeated for each continuation
    (``DynamicCache.batch_select_indices``), then one forward runs over the right-padded
    continuations (position ids continue each prompt).

    Args:
        lm: reference ``LoadedModel`` or causal LM.
        groups: [(prompt ids (non-empty), [continuation ids, ...]), ...].
        top_k: alternatives per position.
        max_rows_tokens: continuation rows × length per forward at most (bounds the
            [rows, T, V] float32 logits: 1024 × 49152 × 4 B ≈ 200 MB).
        max_prompts: prompts per chunk at most.

    Returns:
        Per group, per continuation: ``top_ids`` [T, top_k] int64, ``top_lp`` [T, top_k] float64,
        ``token_lp`` [T] float64 (reference log p of each continuation token).

    Raises:
        ValueError: an empty prompt.
    """
    import torch
    from transformers import DynamicCache

    model = _inner(lm)
    out: list[list[dict | None]] = [[None] * len(c) for _, c in groups]
    empty = {"top_ids": np.zeros((0, top_k), np.int64), "top_lp": np.zeros((0, top_k)), "token_lp": np.zeros(0)}
    for gi, (pr, conts) in enumerate(groups):
        if not len(pr):
            raise ValueError(f"score_prompt_groups: group {gi} has an empty prompt")
        for ci, c in enumerate(conts):
            if len(c) == 0:
                out[gi][ci] = dict(empty)
    # chunks of groups bounded by rows × length
    chunks: list[list[int]] = []
    cur: list[int] = []
    rows = t_max = 0
    for gi, (_, conts) in enumerate(groups):
        live = [c for c in conts if len(c)]
        if not live:
            continue
        r2, t2 = rows + len(live), max(t_max, max(len(c) for c in live))
        if cur and (r2 * t2 > max_rows_tokens or len(cur) >= max_prompts):
            chunks.append(cur)
            cur, rows, t_max = [], 0, 0
            r2, t2 = len(live), max(len(c) for c in live)
        cur.append(gi)
        rows, t_max = r2, t2
    if cur:
        chunks.append(cur)
    with torch.inference_mode():
        for chunk in chunks:
            prompts = [list(groups[g][0]) for g in chunk]
            B0, P = len(prompts), max(len(p) for p in prompts)
            ids = torch.zeros((B0, P), dtype=torch.long)
            mask = torch.zeros((B0, P), dtype=torch.long)
            for r, p in enumerate(prompts):
                ids[r, P - len(p) :] = torch.tensor(p)
                mask[r, P - len(p) :] = 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            cache = DynamicCache()
            pre = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True,
                        logits_to_keep=1)
            cache = pre.past_key_values if getattr(pre, "past_key_values", None) is not None else cache
            first = torch.log_softmax(pre.logits[:, -1].float(), -1)  # [B0, V] predicts token 0
            src: list[tuple[int, int, int]] = []  # (row in chunk, group, continuation index)
            for r, g in enumerate(chunk):
                for ci, c in enumerate(groups[g][1]):
                    if len(c):
                        src.append((r, g, ci))
            R = len(src)
            T = max(len(groups[g][1][ci]) for _, g, ci in src)
            cache.batch_select_indices(torch.tensor([r for r, _, _ in src]))
            cids = torch.zeros((R, T), dtype=torch.long)
            cmask = torch.cat([mask[[r for r, _, _ in src]], torch.zeros((R, T), dtype=torch.long)], 1)
            plen = torch.tensor([len(prompts[r]) for r, _, _ in src])
            for k, (_, g, ci) in enumerate(src):
                c = list(groups[g][1][ci])
                cids[k, : len(c)] = torch.tensor(c)
                cmask[k, P : P + len(c)] = 1
            cpos = plen.unsqueeze(1) + torch.arange(T).unsqueeze(0)
            o = model(input_ids=cids, attention_mask=cmask, position_ids=cpos, cache=cache, use_cache=True)
            logp = torch.log_softmax(o.logits.float(), -1)  # [R, T, V]; [:, t] predicts token t+1
            for k, (r, g, ci) in enumerate(src):
                c = list(groups[g][1][ci])
                rows_lp = torch.cat([first[r].unsqueeze(0), logp[k, : len(c) - 1]], 0)  # [Tc, V]
                tid, tlp = _top(rows_lp, top_k)
                tok = rows_lp.gather(1, torch.tensor(c).unsqueeze(1)).squeeze(1).double().numpy()
                out[g][ci] = {"top_ids": tid, "top_lp": tlp, "token_lp": tok}
            del logp, o
    return out  # type: ignore[return-value]


# =============================================================================================
# collection
# =============================================================================================

#: Where each lossy verifier changes the output law: at "sampling" (T > 0) or "greedy" (T = 0)
#: requests. At the other temperature it verifies exactly (reference/simulator/verifiers.py).
_LOSSY_AT = {
    "relaxed-threshold": "sampling",
    "typical-acceptance": "sampling",
    "greedy-verify": "sampling",
    "decode-noncompliant": "greedy",
}
#: Lossy verifiers whose output law does not depend on the drafts, so batched decoding with a
#: per-position rule reproduces it exactly (the rule is the verifier's own, per its docstring):
#: greedy-verify emits argmax p at every position; decode-noncompliant emits the 2nd-ranked token
#: of p with probability ``greedy_flip_rate`` per position, independently.
_RULES = {"greedy-verify": "argmax", "decode-noncompliant": "flip2nd"}


def backend_for(profile: Any, temperature: float, *, emulate: bool = True) -> str:
    """How a profile's requests at ``temperature`` are served in the pool.

    Returns:
        ``batched`` (plain decoding of the served model: strict verification is lossless),
        ``rule`` (batched decoding with the verifier's draft-independent rule, see ``_RULES``;
        only with ``emulate``), or ``engine`` (the simulator's speculative loop: the verifier's
        law depends on the drafts — relaxed-threshold, typical-acceptance).
    """
    at = _LOSSY_AT.get(profile.verifier)
    if at is None or (at == "sampling") != (temperature > 0):
        return "batched"
    if emulate and profile.verifier in _RULES:
        return "rule"
    return "engine"


def _served_is_reference(profile: Any) -> bool:
    return (
        profile.dtype == "float32"
        and not profile.weight_quant
        and profile.substitute_layers is None
        and profile.logit_noise == 0
    )


def collect_pool(
    profile_name: str,
    ref_lms: Any,
    cfg: PoolConfig | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> Pool:
    """Collect one profile's pool in-process (see the module docstring for the two backends).

    Args:
        profile_name: a simulator profile (``reference.simulator.profiles.PROFILES``).
        ref_lms: reference dtype → ``LoadedModel`` of the reference weights in that precision
            (``float32`` required; ``bfloat16`` too when the audit compares with the nearest honest
            reference, ``auditor.noise``), or one float32 ``LoadedModel``. The served model is
            built from the float32 one (copied where the profile changes weights/dtype/layers;
            the reference is not modified).
        cfg: pool configuration (default ``PoolConfig()``).
        progress: optional callback receiving one-line status messages.

    Returns:
        The Pool (not yet saved; see :func:`load_or_collect_pool`).

    Raises:
        KeyError: unknown profile.
    """
    from reference.simulator.engine import build_served_model
    from reference.simulator.profiles import get_profile

    cfg = cfg or PoolConfig()
    ref_lms = _as_refs(ref_lms)
    ref_lm = ref_lms["float32"]
    say = progress or (lambda _m: None)
    profile = get_profile(profile_name)
    t_start = time.perf_counter()
    served_lm, info = build_served_model(profile, ref_lm, copy_model=True)
    eos = list(ref_lm.eos_token_ids)
    be = {t: backend_for(profile, t, emulate=cfg.emulate_rules) for t in (0.0, 1.0)}
    reqs = build_requests(ref_lm.tokenizer, cfg, n_samples=cfg.samples_for(profile, be[1.0] == "engine"))
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
        from reference.simulator.engine import SimulatorEngine

        if engine is None:
            # the engine builds its served model from the reference (a copy), as `auditor serve` does
            engine = SimulatorEngine(profile, ref_lm, seed=cfg.seed, copy_model=True)
        for j, r in enumerate(rs):
            ch = engine.generate(
                list(r.prompt_ids), max_tokens=r.max_tokens, temperature=r.temperature, seed=r.seed, top_n=PROVIDER_TOP_N
            )
            toks = list(ch.tokens)
            T = len(toks)
            top_ids = np.full((T, PROVIDER_TOP_N), -1, np.int64)
            top_lp = np.full((T, PROVIDER_TOP_N), -np.inf)
            for i, t in enumerate(toks):
                k = len(t.top_ids)
                top_ids[i, :k] = t.top_ids
                top_lp[i, :k] = t.top_logprobs
            results[r.key] = {
                "token_ids": np.asarray([t.token_id for t in toks], np.int64),
                "logprob": np.asarray([np.nan if t.logprob is None else t.logprob for t in toks], np.float64),
                "top_ids": top_ids,
                "top_lp": top_lp,
            }
            backends["engine"] += 1
            if (j + 1) % 10 == 0:
                say(f"{profile_name}: engine {j + 1}/{len(rs)} requests")

    def via_batched(rs: list[PoolRequest], temperature: float) -> None:
        model = served_lm.model
        rule = _RULES.get(profile.verifier) if be[temperature] == "rule" else None
        tag = "rule" if rule else "batched"
        if temperature == 0:
            for b in range(0, len(rs), cfg.batch_size):
                chunk = rs[b : b + cfg.batch_size]
                if hasattr(model, "nonce"):
                    model.nonce = chunk[0].seed  # honest-noisy: a fresh "batch" of kernel noise
                outs = _decode_rows(
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
                for r, o in zip(chunk, outs):
                    results[r.key] = _cut(o, r.max_tokens)
                    backends[tag] += 1
                say(f"{profile_name}: T=0 {min(b + cfg.batch_size, len(rs))}/{len(rs)} requests")
        else:
            by: dict[str, list[PoolRequest]] = {}
            for r in rs:
                by.setdefault(r.prompt_id, []).append(r)
            groups = list(by.values())
            n_s = max(len(g) for g in groups)
            per = max(1, cfg.batch_size // n_s)  # prompts per batch; each decoded n_s times
            for b in range(0, len(groups), per):
                chunk = [g for g in groups[b : b + per]]
                if hasattr(model, "nonce"):
                    model.nonce = chunk[0][0].seed
                outs = _decode_rows(
                    model,
                    [g[0].prompt_ids for g in chunk],
                    max_new_tokens=max(r.max_tokens for g in chunk for r in g),
                    temperature=temperature,
                    top_p=eff_p,
                    top_k=eff_k,
                    eos_ids=eos,
                    seeds=[r.seed for g in chunk for r in g],
                    expand=n_s,
                    rule=rule,
                    flip_rate=profile.greedy_flip_rate,
                )
                for gi, g in enumerate(chunk):
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
    by_prompt: dict[tuple[int, ...], list[PoolRequest]] = {}
    for r in reqs:
        by_prompt.setdefault(r.prompt_ids, []).append(r)
    ref: dict[str, dict[str, dict]] = {}
    for dt, lm in ref_lms.items():
        rd: dict[str, dict] = {}
        todo: list[tuple[tuple[int, ...], list[PoolRequest]]] = []
        for prompt, group in by_prompt.items():
            need = []
            for r in group:
                if dt == "float32" and same and be[r.temperature] == "batched":
                    # the served model IS the float32 reference: its rows are the reference rows
                    o = results[r.key]
                    rd[r.key] = {"top_ids": o["top_ids"][:, :REF_TOP_K], "top_lp": o["top_lp"][:, :REF_TOP_K],
                                 "token_lp": o["logprob"]}
                else:
                    need.append(r)
            if need:
                todo.append((prompt, need))
        # temperature-0 items (where logprob-divergence and greedy-match look) through the
        # pipeline's own scorer and batching (auditor.audit.score_observations uses
        # reference.scoring.score_continuations, batch 8), so low-precision references see the
        # same numerics as in `auditor check`; sampled items share their prompt's prefill.
        t0_need = [r for _, need in todo for r in need if r.temperature == 0]
        if t0_need:
            from reference.scoring import score_continuations

            sc0 = score_continuations(lm, [list(r.prompt_ids) for r in t0_need],
                                      [results[r.key]["token_ids"].tolist() for r in t0_need],
                                      top_k=REF_TOP_K, batch_size=SCORE_BATCH_SIZE)
            for r, x in zip(t0_need, sc0):
                rd[r.key] = {"top_ids": x.top_ids, "top_lp": x.top_logprobs, "token_lp": x.logprobs}
        groups1 = [(pr, [r for r in need if r.temperature > 0]) for pr, need in todo]
        groups1 = [(pr, need) for pr, need in groups1 if need]
        scored = score_prompt_groups(
            lm, [(list(pr), [results[r.key]["token_ids"].tolist() for r in need]) for pr, need in groups1]
        )
        for (_, need), sc in zip(groups1, scored):
            for r, x in zip(need, sc):
                rd[r.key] = x
        ref[dt] = rd
        say(f"{profile_name}: reference {dt} scored")
    ref_s = time.perf_counter() - t_ref
    pool = _assemble(profile_name, ref_lm, reqs, results, ref)
    pool.meta.update(
        {
            "pool_format": POOL_FORMAT,
            "pool_config": cfg.key_dict(),
            "suites": _suite_fingerprint(cfg),
            "profile": profile.describe(),
            "backends": dict(backends),
            "backend_t0": be[0.0],
            "backend_t1": be[1.0],
            "served": {"dtype": info.dtype, "layers": info.layers, "quant": info.quant},
            "generate_s": round(gen_s, 2),
            "reference_s": round(ref_s, 2),
            "total_s": round(time.perf_counter() - t_start, 2),
            **pool.summary(),
        }
    )
    say(f"{profile_name}: pool {pool.summary()} in {pool.meta['total_s']:.0f}s")
    return pool


def _as_refs(ref_lms: Any) -> dict[str, Any]:
    """Normalise ``ref_lms`` to {dtype: LoadedModel} with ``float32`` present.

    Raises:
        ValueError: no float32 reference.
    """
    if not isinstance(ref_lms, dict):
        return {"float32": ref_lms}
    if "float32" not in ref_lms:
        raise ValueError(f"ref_lms needs a 'float32' reference (got {sorted(ref_lms)})")
    return dict(ref_lms)


def _cut(o: dict, n: int) -> dict:
    return {k: v[:n] for k, v in o.items()}


def _assemble(profile_name: str, ref_lm: Any, reqs: list[PoolRequest], results: dict, ref: dict) -> Pool:
    lens = [len(results[r.key]["token_ids"]) for r in reqs]
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)

    def cat(src: dict, k: str, shape_tail: tuple, dtype) -> np.ndarray:
        parts = [np.asarray(src[r.key][k], dtype).reshape((-1, *shape_tail)) for r in reqs]
        return np.concatenate(parts) if parts else np.zeros((0, *shape_tail), dtype)

    return Pool(
        profile=profile_name,
        model=str(ref_lm.name),
        revision=str(ref_lm.revision),
        meta={},
        item_keys=np.asarray([r.key for r in reqs], dtype=str),
        item_prompt=np.asarray([r.prompt_id for r in reqs], dtype=str),
        item_workload=np.asarray([r.workload for r in reqs], dtype=str),
        item_temperature=np.asarray([r.temperature for r in reqs], np.float64),
        item_offsets=offsets,
        item_prompt_tokens=np.asarray([len(r.prompt_ids) for r in reqs], np.int64),
        token_ids=cat(results, "token_ids", (), np.int64),
        prov_logprob=cat(results, "logprob", (), np.float64),
        prov_top_ids=cat(results, "top_ids", (PROVIDER_TOP_N,), np.int64),
        prov_top_lp=cat(results, "top_lp", (PROVIDER_TOP_N,), np.float64),
        ref_top_ids={dt: cat(rd, "top_ids", (REF_TOP_K,), np.int64) for dt, rd in ref.items()},
        ref_top_lp={dt: cat(rd, "top_lp", (REF_TOP_K,), np.float64) for dt, rd in ref.items()},
        ref_token_lp={dt: cat(rd, "token_lp", (), np.float64) for dt, rd in ref.items()},
    )


def pool_path(profile_name: str, ref_lms: Any, cfg: PoolConfig, cache_dir: Path | None = None) -> Path:
    """Cache file of a pool: keyed by model revision, reference precisions, profile recipe,
    suites (versions and digests), pool config, the backends that serve it, and pool format."""
    from reference.simulator.profiles import get_profile

    refs = _as_refs(ref_lms)
    ref_lm = refs["float32"]
    prof = get_profile(profile_name)
    backends = [backend_for(prof, t, emulate=cfg.emulate_rules) for t in (0.0, 1.0)]
    key_src: dict[str, Any] = {
        "revision": str(ref_lm.revision),
        "model": str(ref_lm.name),
        "profile": prof.describe(),
        "suites": _suite_fingerprint(cfg),
        "cfg": cfg.key_dict(),
        "references": sorted(refs),
        "format": POOL_FORMAT,
    }
    if backends != ["batched", "batched"]:
        key_src["backends"] = backends
    if prof.honest and cfg.honest_sampling_samples is not None:
        key_src["honest_samples"] = cfg.honest_sampling_samples
    key = _sha(key_src)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(ref_lm.revision))[:12]
    return (cache_dir or calibration_cache_dir()) / "pools" / f"{profile_name}-{safe}-{key}.npz"


def load_or_collect_pool(
    profile_name: str,
    ref_lms: Any,
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
    pool = collect_pool(profile_name, ref_lms, cfg, progress=progress)
    pool.save(path)
    return pool, False


# =============================================================================================
# audits resampled from a pool
# =============================================================================================

MODES = ("greedy", "logprob", "sampling")


@dataclass(frozen=True)
class AuditMix:
    """How an audit of B planned tokens is spent, per probe mode (as ``auditor.audit.plan_budget`` does).

    Attributes:
        name: mix name (``default`` = the default suite's proportions).
        shares: mode → fraction of the planned budget (greedy and logprob are temperature-0
            requests, sampling temperature 1); sums to 1.
        top_m: mode → ``top_logprobs`` requested (0 = no logprobs asked).
        max_tokens: mode → workload → ``max_tokens`` of one request (the budget each request is
            charged, whatever it actually returns); a missing workload uses the mode's largest.
        description: one line for reports.
        max_total: planned completion tokens of the whole suite (the most ``auditor check
            --suite NAME`` can spend), None when the mix is not a shipped suite.

    Raises:
        ValueError: unknown modes, shares not summing to 1.
    """

    name: str
    shares: dict[str, float]
    top_m: dict[str, int]
    max_tokens: dict[str, dict[str, int]] = field(default_factory=dict)
    description: str = ""
    max_total: int | None = None

    def __post_init__(self) -> None:
        bad = set(self.shares) - set(MODES)
        if bad:
            raise ValueError(f"mix {self.name!r}: unknown modes {sorted(bad)}; use {MODES}")
        tot = sum(self.shares.values())
        if not math.isclose(tot, 1.0, abs_tol=1e-6):
            raise ValueError(f"mix {self.name!r}: shares sum to {tot}, not 1")

    def request_tokens(self, mode: str, workload: str, default: int) -> int:
        """``max_tokens`` of a request of ``mode`` on ``workload`` (``default`` when the mix has none)."""
        by = self.max_tokens.get(mode) or {}
        if workload in by:
            return int(by[workload])
        return int(max(by.values())) if by else int(default)

    def to_dict(self) -> dict:
        return {"name": self.name, "shares": dict(self.shares), "top_m": dict(self.top_m),
                "max_tokens": {k: dict(v) for k, v in self.max_tokens.items()}, "description": self.description,
                "max_total": self.max_total}


def default_mix(suite: str = "default") -> AuditMix:
    """The mix of a shipped suite: each mode's share of the suite's planned completion tokens
    (max_tokens × samples), the largest ``top_logprobs`` its probes of that mode request, and its
    ``max_tokens`` per mode and workload."""
    from probes.suites import load_suite

    s = load_suite(suite)
    tok: Counter = Counter()
    m: dict[str, int] = {k: 0 for k in MODES}
    mt: dict[str, dict[str, int]] = {k: {} for k in MODES}
    for p in s.probes:
        tok[p.mode] += p.max_tokens * p.n_samples
        m[p.mode] = max(m[p.mode], int(p.top_logprobs or 0))
        mt[p.mode][p.workload] = max(mt[p.mode].get(p.workload, 0), int(p.max_tokens))
    tot = sum(tok.values())
    shares = {k: tok[k] / tot for k in MODES}
    desc = ", ".join(f"{k} {shares[k]:.0%} (top_logprobs={m[k]}, max_tokens {min(mt[k].values(), default=0)}-"
                     f"{max(mt[k].values(), default=0)})" for k in MODES if shares[k] > 0)
    return AuditMix(suite, shares, m, {k: v for k, v in mt.items() if v}, f"suite {suite!r} v{s.version}: {desc}",
                    int(s.max_completion_tokens()))


@dataclass
class AuditDraw:
    """One resampled audit: which pool items, how many of their tokens, under which mode.

    Attributes:
        items: [(item index, tokens returned, mode, reuse round)]; the reuse round is 0 unless
            the pool ran out of distinct sampling items (then items are drawn again, round 1, ...).
        tokens: mode → completion tokens actually returned (EOS ends continuations early).
        planned: mode → planned tokens (Σ max_tokens of the requests: what the budget counts).
        prompt_tokens: Σ prompt tokens of the requests (input tokens, for the price).
    """

    items: list[tuple[int, int, str, int]]
    tokens: dict[str, int]
    planned: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0

    @property
    def total(self) -> int:
        """Completion tokens actually returned."""
        return int(sum(self.tokens.values()))

    @property
    def planned_total(self) -> int:
        """Planned completion tokens (the ``--budget-tokens`` this audit used)."""
        return int(sum(self.planned.values()))

    @property
    def reused(self) -> bool:
        return any(r > 0 for *_, r in self.items)


class AuditDrawer:
    """Draws one audit's requests from a pool, incrementally: ``extend_to(B)`` grows the same audit.

    Budget semantics are ``auditor check --budget-tokens``'s (``auditor.audit.plan_budget``): a
    request is charged its ``max_tokens`` whatever it returns, requests are added while they fit,
    always to the mode furthest below its share of the budget. Temperature-0 requests (greedy,
    logprob) come from one random permutation of the pool's T=0 items, each prompt at most once (at
    T=0 a prompt has one answer); sampling requests from a permutation of the T=1 items. A pool
    item longer than the request's ``max_tokens`` is cut to it (the continuation a shorter request
    returns). When the T=0 items run out, their share goes to sampling; when the T=1 items run out
    they are drawn again (``reuse round`` > 0, reported as ``reused``). Nested draws are what a
    sequential audit needs: look k+1 sees every request of look k.

    Args:
        pool: the profile's pool.
        mix: the probe mix.
        rng: numpy Generator (the audit's randomness).

    Raises:
        ValueError: the pool holds no tokens at all.
    """

    def __init__(self, pool: Pool, mix: AuditMix, rng: np.random.Generator):
        self.pool, self.mix, self.rng = pool, mix, rng
        self.lens = pool.item_lengths
        self.t0_src = pool.items_at(0.0)
        self.t1_src = pool.items_at(1.0)
        if not self.t0_src.size and not self.t1_src.size:
            raise ValueError(f"pool of profile {pool.profile!r} holds no tokens")
        self.t0 = list(rng.permutation(self.t0_src))
        self.t1 = list(rng.permutation(self.t1_src))
        self.rnd = {"t0": 0, "t1": 0}
        self.items: list[tuple[int, int, str, int]] = []
        self.tokens = {m: 0 for m in MODES}
        self.planned = {m: 0 for m in MODES}
        self.prompt_tokens = 0
        self._pending: dict[str, tuple[int, int]] = {}  # mode -> (item, round) drawn but not yet fitting

    def _peek(self, mode: str) -> tuple[int, int] | None:
        if mode in self._pending:
            return self._pending[mode]
        if mode == "sampling":
            if not self.t1_src.size:
                return None
            if not self.t1:
                self.rnd["t1"] += 1
                self.t1 = list(self.rng.permutation(self.t1_src))
            got = (int(self.t1.pop()), self.rnd["t1"])
        else:
            if not self.t0:
                if self.t1_src.size or not self.t0_src.size:
                    return None
                self.rnd["t0"] += 1  # no sampling items at all: reuse T=0 items
                self.t0 = list(self.rng.permutation(self.t0_src))
            got = (int(self.t0.pop()), self.rnd["t0"])
        self._pending[mode] = got
        return got

    def _cost(self, mode: str, item: int) -> int:
        w = str(self.pool.item_workload[item])
        return self.mix.request_tokens(mode, w, int(self.lens[item]) or 1)

    def extend_to(self, budget: int) -> AuditDraw:
        """Grow the audit to at most ``budget`` planned tokens (no-op when already there).

        Raises:
            ValueError: budget < 1.
        """
        if budget < 1:
            raise ValueError(f"budget={budget} must be >= 1 token")
        active = [m for m in MODES if self.mix.shares.get(m, 0.0) > 0] or list(MODES)
        while True:
            spent = sum(self.planned.values())
            order = sorted(active, key=lambda m: (self.planned[m] - self.mix.shares.get(m, 0.0) * budget, MODES.index(m)))
            took = False
            for mode in order:
                nxt = self._peek(mode)
                if nxt is None:
                    continue
                i, r = nxt
                cost = self._cost(mode, i)
                if spent + cost > budget:
                    continue
                del self._pending[mode]
                n = int(min(self.lens[i], cost))
                self.items.append((i, n, mode, r))
                self.tokens[mode] += n
                self.planned[mode] += cost
                pt = self.pool.item_prompt_tokens
                self.prompt_tokens += int(pt[i]) if pt is not None else 0
                took = True
                break
            if not took:
                break
        if not self.items:
            raise ValueError(
                f"budget {budget} is smaller than the smallest request of the {self.mix.name!r} mix "
                f"({min(self._cost(m, int(x)) for m, src in (('greedy', self.t0_src), ('sampling', self.t1_src)) for x in src[:1])} tokens)"
            )
        return AuditDraw([x for x in self.items if x[1] > 0], dict(self.tokens), dict(self.planned), self.prompt_tokens)


def draw_audit(pool: Pool, budget: int, mix: AuditMix, rng: np.random.Generator) -> AuditDraw:
    """Draw one audit of at most ``budget`` planned completion tokens (see :class:`AuditDrawer`).

    Raises:
        ValueError: budget < 1 or below the smallest request, or the pool holds no tokens at all.
    """
    return AuditDrawer(pool, mix, rng).extend_to(budget)


def evidence_for(pool: Pool, draw: AuditDraw, mix: AuditMix, reference: str = "float32") -> Any:
    """The detectors' :class:`~auditor.detectors.EvidenceBatch` for one drawn audit.

    Each item is one probe (``prompt_id`` = its request key, so positions of one continuation are
    grouped as the detectors expect); the provider's top list is cut to the mode's
    ``top_logprobs`` width and its token logprob dropped when the mode asks for none.

    Args:
        reference: which reference precision's rows to use (a key of ``pool.ref_top_ids``).

    Raises:
        KeyError: the pool was not scored with that reference.
    """
    from auditor.detectors import EvidenceBatch

    if reference not in pool.ref_top_ids:
        raise KeyError(f"pool {pool.profile!r} has no {reference!r} reference rows (has {pool.references})")
    idx: list[np.ndarray] = []
    pids: list[str] = []
    pos: list[np.ndarray] = []
    widths: list[int] = []
    for i, n, mode, rnd in draw.items:
        a = int(pool.item_offsets[i])
        idx.append(np.arange(a, a + n))
        key = str(pool.item_keys[i]) + (f"~{rnd}" if rnd else "")
        pids.extend([key] * n)
        pos.append(np.arange(n))
        widths.extend([int(mix.top_m.get(mode, 0))] * n)
    sel = np.concatenate(idx) if idx else np.zeros(0, np.int64)
    w = np.asarray(widths, np.int64)
    M = int(w.max()) if w.size else 0
    p_ids = pool.prov_top_ids[sel, :M].copy()
    p_lp = pool.prov_top_lp[sel, :M].copy()
    if M:
        cut = np.arange(M)[None, :] >= w[:, None]
        p_ids[cut] = -1
        p_lp[cut] = -np.inf
    p_tok = np.where(w > 0, pool.prov_logprob[sel], np.nan)
    temps = np.repeat(pool.item_temperature[[i for i, *_ in draw.items]], [n for _, n, *_ in draw.items])
    return EvidenceBatch.from_arrays(
        prompt_ids=pids,
        positions=np.concatenate(pos) if pos else np.zeros(0, np.int64),
        token_ids=pool.token_ids[sel],
        temperatures=temps,
        ref_top_ids=pool.ref_top_ids[reference][sel],
        ref_top_logprobs=pool.ref_top_lp[reference][sel],
        ref_token_logprobs=pool.ref_token_lp[reference][sel],
        provider_top_ids=p_ids,
        provider_top_logprobs=p_lp,
        provider_token_logprobs=p_tok,
    )


def audit_verdict(batches: Any, floors: Any, *, alpha: float = 0.05, seed: int = 0, power: float | None = None) -> Any:
    """Per-position evidence → detector results → verdict, exactly as ``auditor check`` decides.

    Calls the pipeline's ``auditor.audit.run_reference_detectors`` (every detector against every
    honest reference precision with that precision's noise floor, combined as an
    intersection–union test: per detector the nearest reference's result) and then
    ``auditor.verdict.decide_verdict`` with the floor of the reference nearest in
    logprob-divergence — the same steps as ``auditor.audit.analyze_run``.

    Args:
        batches: reference dtype → EvidenceBatch (same positions), or one batch (float32).
        floors: ``auditor.noise.FloorSet``.
        alpha: family-wise level (Holm).
        seed: detector randomisation seed.
        power: power a PASS needs against the target effects (None: the verdict's default).

    Returns:
        ``auditor.verdict.Verdict`` (its ``results`` carry the Holm-adjusted p-values).
    """
    from auditor.audit import run_reference_detectors
    from auditor.verdict import DEFAULT_POWER, decide_verdict

    if not isinstance(batches, dict):
        batches = {"float32": batches}
    results = run_reference_detectors(batches, floors, seed=seed)
    fl = getattr(floors, "floors", None) or {}
    lp = next((r for r in results if r.name == "logprob-divergence" and r.ran), None)
    lp_floor = fl.get(lp.details.get("nearest_reference")) if lp is not None else None
    return decide_verdict(results, alpha, floor=lp_floor or fl.get(next(iter(batches))),
                          power=DEFAULT_POWER if power is None else power)


@dataclass
class AuditOutcome:
    """One resampled audit's result (compact, JSON-able)."""

    budget: int
    verdict: str
    rule: str
    rejected: list[str]
    ran: list[str]
    tokens: dict[str, int]
    reused: bool
    prompt_tokens: int = 0
    planned: dict[str, int] = field(default_factory=dict)


def _outcome(budget: int, draw: AuditDraw, v: Any) -> AuditOutcome:
    det = v.details.get("detectors", {})
    return AuditOutcome(
        budget=budget,
        verdict=str(v.verdict),
        rule=str(v.details.get("rule", "")),
        rejected=[k for k, d in det.items() if d.get("rejects")],
        ran=[k for k, d in det.items() if d.get("ran")],
        tokens=dict(draw.tokens),
        reused=draw.reused,
        prompt_tokens=draw.prompt_tokens,
        planned=dict(draw.planned),
    )


def run_audits(
    pool: Pool,
    floor: Any,
    *,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    audits: int = DEFAULT_AUDITS,
    mix: AuditMix | None = None,
    alpha: float = 0.05,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[AuditOutcome]:
    """Run ``audits`` resampled audits at each budget on one pool.

    Seeds: audit j at budget B draws with ``SeedSequence([seed, B, j])`` and seeds its detectors
    with ``seed * 1_000_003 + j`` — reproducible and independent of the other budgets.
    """
    mix = mix or default_mix()
    fl = getattr(floor, "floors", floor)
    refs = [r for r in pool.references if not isinstance(fl, dict) or r in fl] or pool.references[:1]
    out: list[AuditOutcome] = []
    for B in budgets:
        t = time.perf_counter()
        for j in range(audits):
            rng = np.random.default_rng(np.random.SeedSequence([seed, int(B), j]))
            d = draw_audit(pool, int(B), mix, rng)
            batches = {r: evidence_for(pool, d, mix, r) for r in refs}
            v = audit_verdict(batches, floor, alpha=alpha, seed=seed * 1_000_003 + j)
            out.append(_outcome(int(B), d, v))
        if progress:
            progress(f"{pool.profile}: {audits} audits at {B} tokens in {time.perf_counter() - t:.0f}s")
    return out


# =============================================================================================
# metrics
# =============================================================================================


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper–Pearson 1934) two-sided interval for a binomial proportion k/n.

    Uses ``scipy.stats.binomtest(k, n).proportion_ci(method="exact")``; (nan, nan) when n == 0.
    """
    from scipy import stats

    if n <= 0:
        return (math.nan, math.nan)
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="exact")
    return (float(ci.low), float(ci.high))


@dataclass
class CalibrationRecord:
    """One profile × budget cell of the benchmark (a row of docs/calibration.json).

    Attributes:
        profile, family, expected_verdict: the simulator profile and the verdict it should get.
        honest: True for honest profiles (``rejection_rate`` is then the false-accusation rate).
        budget_tokens: completion tokens per audit; audits: audits run.
        rejections: audits with a deviation verdict (QUANTIZATION, RELAXED_VERIFICATION,
            SUBSTITUTION, DECODING_NONCOMPLIANT).
        rejection_rate, ci_low, ci_high: rejections/audits with a Clopper–Pearson 95% interval.
        cause_correct_rate: among rejections, the share naming the profile's cause (None for
            honest profiles or without rejections); pass_rate, inconclusive_rate: shares of
            PASS and INCONCLUSIVE verdicts.
        verdicts: verdict → count (the confusion row of this profile).
        detectors: detector → {"ran": share of audits it ran, "rejected": share where it rejected
            after Holm}; rules: deciding rule → count.
        budget_tokens is the planned budget (Σ max_tokens of the requests, ``--budget-tokens``);
        tokens: mean completion tokens actually returned per mode; completion_tokens: their
        mean total; sampled_tokens: mean T=1 tokens returned; planned_tokens: mean planned total;
        prompt_tokens: mean prompt (input) tokens per audit (for its price).
        reused_rate: share of audits that had to reuse sampling items (pool too small).
        pool: pool sizes; mix: probe-mix name; alpha; model, revision; design: ``fixed``.
    """

    profile: str
    family: str
    expected_verdict: str
    honest: bool
    budget_tokens: int
    audits: int
    rejections: int
    rejection_rate: float
    ci_low: float
    ci_high: float
    cause_correct_rate: float | None
    pass_rate: float
    inconclusive_rate: float
    verdicts: dict[str, int]
    detectors: dict[str, dict[str, float]]
    rules: dict[str, int]
    tokens: dict[str, float]
    sampled_tokens: float
    completion_tokens: float
    planned_tokens: float
    prompt_tokens: float
    reused_rate: float
    pool: dict
    mix: str
    alpha: float
    model: str
    revision: str
    design: str = "fixed"
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        from auditor.detectors.base import _json_safe

        return _json_safe(asdict(self))


def summarize_audits(
    outcomes: Sequence[AuditOutcome], pool: Pool, *, mix: AuditMix, alpha: float
) -> list[CalibrationRecord]:
    """Aggregate audit outcomes into one :class:`CalibrationRecord` per budget."""
    from reference.simulator.profiles import get_profile

    prof = get_profile(pool.profile)
    accepted = set(ACCEPTED_CAUSES.get(prof.name, ())) | {prof.expected_verdict}
    recs = []
    for B in sorted({o.budget for o in outcomes}):
        os_ = [o for o in outcomes if o.budget == B]
        n = len(os_)
        verdicts = Counter(o.verdict for o in os_)
        rej = sum(verdicts[v] for v in _DEVIATIONS)
        lo, hi = clopper_pearson(rej, n)
        correct = sum(verdicts[v] for v in _DEVIATIONS if v in accepted)
        dets: dict[str, dict[str, float]] = {}
        names = sorted({k for o in os_ for k in o.ran} | {k for o in os_ for k in o.rejected})
        for k in names:
            dets[k] = {
                "ran": sum(k in o.ran for o in os_) / n,
                "rejected": sum(k in o.rejected for o in os_) / n,
            }
        tokens = {m: float(np.mean([o.tokens.get(m, 0) for o in os_])) for m in MODES}
        recs.append(
            CalibrationRecord(
                profile=prof.name,
                family=prof.family,
                expected_verdict=prof.expected_verdict,
                honest=prof.honest,
                budget_tokens=int(B),
                audits=n,
                rejections=int(rej),
                rejection_rate=rej / n,
                ci_low=lo,
                ci_high=hi,
                cause_correct_rate=(None if prof.honest or rej == 0 else correct / rej),
                pass_rate=verdicts["PASS"] / n,
                inconclusive_rate=verdicts["INCONCLUSIVE"] / n,
                verdicts=dict(verdicts),
                detectors=dets,
                rules=dict(Counter(o.rule for o in os_)),
                tokens=tokens,
                sampled_tokens=tokens["sampling"],
                completion_tokens=float(np.mean([sum(o.tokens.values()) for o in os_])),
                planned_tokens=float(np.mean([sum(o.planned.values()) for o in os_])),
                prompt_tokens=float(np.mean([o.prompt_tokens for o in os_])),
                reused_rate=sum(o.reused for o in os_) / n,
                pool=pool.summary(),
                mix=mix.name,
                alpha=alpha,
                model=pool.model,
                revision=pool.revision,
            )
        )
    return recs


# =============================================================================================
# sequential audits on a pool
# =============================================================================================


def run_sequential_audits(
    pool: Pool,
    floor: Any,
    design: Any,
    *,
    audits: int = DEFAULT_AUDITS,
    mix: AuditMix | None = None,
    seed: int = 0,
) -> dict:
    """Simulate ``audits`` sequential audits (``auditor.sequential``) on one pool.

    Each audit draws nested evidence (:class:`AuditDrawer`) and looks at the design's token
    counts, deciding at the look's spent α.

    Returns:
        A JSON-able record: profile, design, audits, rejection_rate with Clopper–Pearson CI,
        cause_correct_rate, verdicts, mean/median planned tokens used at the stopping look,
        mean completion tokens returned, tokens_saved (1 − mean/max), stop-look histogram.
    """
    from auditor.sequential import SequentialAudit
    from reference.simulator.profiles import get_profile

    mix = mix or default_mix()
    prof = get_profile(pool.profile)
    fl = getattr(floor, "floors", floor)
    refs = [r for r in pool.references if not isinstance(fl, dict) or r in fl] or pool.references[:1]
    used: list[int] = []
    actual: list[int] = []
    verdicts: Counter = Counter()
    stops: Counter = Counter()
    for j in range(audits):
        rng = np.random.default_rng(np.random.SeedSequence([seed, 7, j]))
        drawer = AuditDrawer(pool, mix, rng)
        seq = SequentialAudit(design)
        while (target := seq.next_look_tokens()) is not None:
            d = drawer.extend_to(target)
            batches = {r: evidence_for(pool, d, mix, r) for r in refs}
            dec = seq.update(
                d.planned_total,
                lambda a, power=None, _b=batches, _j=j: audit_verdict(_b, floor, alpha=a, seed=seed * 1_000_003 + _j,
                                                                     power=power),
            )
            if dec.stop:
                break
        last = seq.decisions[-1]
        used.append(last.tokens)
        actual.append(d.total)
        verdicts[last.verdict] += 1
        stops[last.look] += 1
    n = audits
    rej = sum(verdicts[v] for v in _DEVIATIONS)
    lo, hi = clopper_pearson(rej, n)
    accepted = set(ACCEPTED_CAUSES.get(prof.name, ())) | {prof.expected_verdict}
    correct = sum(verdicts[v] for v in _DEVIATIONS if v in accepted)
    return {
        "profile": prof.name,
        "family": prof.family,
        "honest": prof.honest,
        "expected_verdict": prof.expected_verdict,
        "design": design.to_dict(),
        "max_tokens": design.max_tokens,
        "audits": n,
        "rejections": rej,
        "rejection_rate": rej / n,
        "ci_low": lo,
        "ci_high": hi,
        "cause_correct_rate": None if prof.honest or rej == 0 else correct / rej,
        "pass_rate": verdicts["PASS"] / n,
        "inconclusive_rate": verdicts["INCONCLUSIVE"] / n,
        "verdicts": dict(verdicts),
        "mean_tokens": float(np.mean(used)),
        "mean_completion_tokens": float(np.mean(actual)),
        "median_tokens": float(np.median(used)),
        "tokens_saved": 1.0 - float(np.mean(used)) / design.max_tokens,
        "stop_look": {str(k): v for k, v in sorted(stops.items())},
        "mix": mix.name,
    }


# =============================================================================================
# the whole benchmark
# =============================================================================================


def get_noise_floor(
    ref_lms: Any,
    *,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
    **floor_kwargs: Any,
) -> Any:
    """The pipeline's noise floors for the reference (``auditor.noise.get_floors``; cached on disk).

    Args:
        ref_lms: reference dtype → LoadedModel (``float32`` and usually ``bfloat16``).
        cache_dir: cache root (floors under ``noise/``); None = ``auditor.noise``'s own cache,
            shared with ``auditor check``.
        floor_kwargs: passed to ``get_floors`` (``n_prompts``, ``max_new_tokens``: miniatures only —
            the benchmark must use the floor ``auditor check`` uses, i.e. the defaults).

    Returns:
        ``auditor.noise.FloorSet`` (``.floors``: dtype → NoiseFloor).
    """
    from auditor.noise import get_floors

    refs = _as_refs(ref_lms)
    cb = None
    if progress is not None:
        def cb(stage: str, done: int, total: int) -> None:
            if done == total or done % 8 == 0:
                progress(f"{stage} {done}/{total}")
    return get_floors(refs, cache_dir=None if cache_dir is None else Path(cache_dir) / "noise", progress=cb,
                      **floor_kwargs)


@dataclass
class CalibrationRun:
    """Everything one benchmark run produced.

    Attributes:
        records: fixed-budget cells (:class:`CalibrationRecord`), profile-major.
        sequential: sequential-audit records (see :func:`run_sequential_audits`), may be empty.
        meta: model, revision, budgets, audits, alpha, mix, pool config, floor summary, pools
            (sizes, backends, seconds, cache hits), timings (seconds per stage), machine.
    """

    records: list[CalibrationRecord]
    sequential: list[dict]
    meta: dict

    def to_json_list(self) -> list[dict]:
        """docs/calibration.json content: a list of records (fixed first, then sequential)."""
        out = [r.to_dict() for r in self.records]
        for s in self.sequential:
            d = dict(s)
            d.update(
                {
                    "design": "sequential",
                    "sequential_design": s["design"],
                    "budget_tokens": s["max_tokens"],
                    "model": self.meta.get("model"),
                    "revision": self.meta.get("revision"),
                }
            )
            out.append(d)
        return out


def mix_budgets(mix: AuditMix, budgets: Sequence[int], *, primary: bool = False) -> list[int]:
    """The budgets a mix is calibrated at: all of them for the primary mix; for the others those
    its suite can spend (``<= mix.max_total``), plus ``max_total`` itself when some budget exceeds it."""
    bl = sorted({int(b) for b in budgets})
    if primary or mix.max_total is None:
        return bl
    keep = [b for b in bl if b <= mix.max_total]
    if any(b > mix.max_total for b in bl):
        keep.append(int(mix.max_total))
    return sorted(set(keep))


def load_reference_models(model: str | None = None) -> dict[str, Any]:
    """The reference in every honest precision (``auditor.noise.REFERENCE_DTYPES``)."""
    from auditor.noise import REFERENCE_DTYPES
    from reference.models import DEFAULT_MODEL, load_model

    name = model or DEFAULT_MODEL
    return {dt: load_model(name, dtype=dt) for dt in REFERENCE_DTYPES}


def run_calibration(
    profiles: Sequence[str] | None = None,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    audits: int = DEFAULT_AUDITS,
    *,
    ref_lms: Any = None,
    model: str | None = None,
    pool_cfg: PoolConfig | None = None,
    mix: AuditMix | Sequence[AuditMix] | None = None,
    alpha: float = 0.05,
    seed: int = 0,
    cache_dir: Path | None = None,
    refresh: bool = False,
    sequential: Any = "auto",
    sequential_audits: int | None = None,
    floor_kwargs: dict | None = None,
    progress: Callable[[str], None] | None = None,
) -> CalibrationRun:
    """Run the detection benchmark: pools (cached), resampled fixed-budget audits, sequential audits.

    Args:
        profiles: simulator profiles (default: all).
        budgets: completion-token budgets per audit.
        audits: resampled audits per profile × budget.
        ref_lms: reference dtype → LoadedModel (default: :func:`load_reference_models`).
        model: reference model name when ``ref_lms`` is None.
        pool_cfg: pool configuration.
        mix: probe mix, or several (default: the default suite's). With several, the first is the
            primary one (every budget; the sequential simulation); each further mix (a targeted
            suite such as ``precision`` or ``verification``) runs at the budgets it can spend
            (``budget <= mix.max_total``, plus ``max_total`` itself when a budget exceeds it), and
            its records carry its name in ``mix``.
        alpha: family-wise level of every audit.
        seed: base seed (pools use ``pool_cfg.seed``).
        cache_dir: cache root (pools under ``pools/``, floors under ``noise/``); default
            :func:`calibration_cache_dir` for pools and ``auditor.noise``'s cache for floors.
        refresh: recollect pools even when cached.
        sequential: a ``SequentialDesign``, None (skip), or "auto" (geometric looks from the
            smallest budget to the largest with the spending and early-acceptance power of
            ``auditor check --budget-tokens auto``).
        sequential_audits: audits per profile for the sequential simulation (default ``audits``).
        floor_kwargs: extra arguments of ``auditor.noise.get_floors`` (CI miniatures only).
        progress: callback for one-line status messages.

    Returns:
        CalibrationRun.

    Raises:
        KeyError: unknown profile name.
        ValueError: empty budgets or audits < 1.
    """
    from auditor.sequential import SequentialDesign
    from reference.simulator.profiles import PROFILES, get_profile

    say = progress or (lambda _m: None)
    profiles = list(profiles or PROFILES)
    for p in profiles:
        get_profile(p)
    budgets = sorted({int(b) for b in budgets})
    if not budgets or budgets[0] < 1:
        raise ValueError(f"budgets must be positive token counts, got {budgets}")
    if audits < 1:
        raise ValueError(f"audits={audits} must be >= 1")
    t_all = time.perf_counter()
    timings: dict[str, float] = {}
    t = time.perf_counter()
    refs = _as_refs(ref_lms) if ref_lms is not None else load_reference_models(model)
    timings["load_models_s"] = time.perf_counter() - t
    first = refs["float32"]
    t = time.perf_counter()
    floors = get_noise_floor(refs, cache_dir=cache_dir, progress=say, **(floor_kwargs or {}))
    timings["noise_floor_s"] = time.perf_counter() - t
    say(f"noise floor ready ({'cached' if floors.meta.get('cached') else 'computed'}, {timings['noise_floor_s']:.0f}s)")
    mixes = [default_mix()] if mix is None else ([mix] if isinstance(mix, AuditMix) else list(mix))
    if not mixes:
        raise ValueError("mix: give at least one probe mix")
    mix = mixes[0]
    cfg = pool_cfg or PoolConfig()
    if sequential == "auto":
        from auditor.sequential import AUTO_ACCEPT_POWER, AUTO_SPENDING

        sequential = SequentialDesign.geometric(max(budgets), first=min(budgets), alpha=alpha, spending=AUTO_SPENDING,
                                                accept_power=AUTO_ACCEPT_POWER)
    records: list[CalibrationRecord] = []
    seq_records: list[dict] = []
    pools_meta: dict[str, dict] = {}
    t_pools = t_audits = t_seq = 0.0
    for p in profiles:
        t = time.perf_counter()
        pool, cached = load_or_collect_pool(p, refs, cfg, cache_dir=None if cache_dir is None else Path(cache_dir),
                                            refresh=refresh, progress=say)
        dt = time.perf_counter() - t
        t_pools += dt
        pools_meta[p] = {
            **pool.summary(),
            "cached": cached,
            "seconds": round(dt, 1),
            "collect_s": pool.meta.get("total_s"),
            "backends": pool.meta.get("backends"),
            "backend_t0": pool.meta.get("backend_t0"),
            "backend_t1": pool.meta.get("backend_t1"),
        }
        say(f"{p}: pool ready ({'cache' if cached else 'collected'}, {dt:.0f}s) {pool.summary()}")
        t = time.perf_counter()
        recs = []
        for mi, m in enumerate(mixes):
            bl = mix_budgets(m, budgets, primary=mi == 0)
            outs = run_audits(pool, floors, budgets=bl, audits=audits, mix=m, alpha=alpha, seed=seed, progress=say)
            for r in summarize_audits(outs, pool, mix=m, alpha=alpha):
                r.extra["suite_max_tokens"] = m.max_total
                recs.append(r)
        records.extend(recs)
        t_audits += time.perf_counter() - t
        for r in recs:
            say(
                f"{p} [{r.mix}] @ {r.budget_tokens}: rejection {r.rejection_rate:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] "
                f"cause {r.cause_correct_rate if r.cause_correct_rate is None else round(r.cause_correct_rate, 3)} "
                f"{r.verdicts}"
            )
        if sequential is not None:
            t = time.perf_counter()
            sr = run_sequential_audits(pool, floors, sequential, audits=sequential_audits or audits, mix=mix, seed=seed)
            seq_records.append(sr)
            t_seq += time.perf_counter() - t
            say(f"{p} sequential: rejection {sr['rejection_rate']:.3f}, mean tokens {sr['mean_tokens']:.0f} "
                f"(saved {sr['tokens_saved']:.0%}) {sr['verdicts']}")
    timings.update({"pools_s": t_pools, "audits_s": t_audits, "sequential_s": t_seq,
                    "total_s": time.perf_counter() - t_all})
    import platform

    import torch

    meta = {
        "model": str(first.name),
        "revision": str(first.revision),
        "references": sorted(refs),
        "profiles": profiles,
        "budgets": budgets,
        "audits": audits,
        "sequential_audits": (sequential_audits or audits) if sequential is not None else 0,
        "alpha": alpha,
        "seed": seed,
        "mix": mix.to_dict(),
        "mixes": [m.to_dict() for m in mixes],
        "pool_config": cfg.key_dict(),
        "pool_format": POOL_FORMAT,
        "pools": pools_meta,
        "noise_floor": floors.summary(),
        "sequential_design": sequential.to_dict() if sequential is not None else None,
        "timings": {k: round(v, 1) for k, v in timings.items()},
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "python": platform.python_version(), "torch": torch.__version__},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return CalibrationRun(records, seq_records, meta)


# =============================================================================================
# targets (issue 7) and reading results
# =============================================================================================

#: Issue 7 targets on the bundled model. Power targets: profile → (tokens, unit) where unit is
#: ``tokens`` (audit budget) or ``sampled`` (temperature-1 tokens within the audit).
POWER_TARGETS: dict[str, tuple[int, str]] = {
    "int4": (100, "tokens"),
    "int8": (1000, "tokens"),
    "fp8": (2000, "tokens"),
    "relaxed-threshold": (500, "sampled"),
    "typical-acceptance": (500, "sampled"),
    "substituted": (100, "tokens"),
}
TARGET_POWER = 0.95
MAX_FALSE_ACCUSATION = 0.05
MAX_FALSE_ACCUSATION_UPPER = 0.08
MIN_CAUSE_CORRECT = 0.90
#: ``auditor plan --target`` names → simulator profiles.
PLAN_TARGETS: dict[str, tuple[str, ...]] = {
    "int8": ("int8",),
    "int4": ("int4",),
    "fp8": ("fp8",),
    "relaxed": ("relaxed-threshold",),
    "typical": ("typical-acceptance",),
    "substituted": ("substituted",),
    "any": ("int8", "int4", "fp8", "relaxed-threshold", "typical-acceptance", "substituted"),
}


def tokens_for_power(records: Sequence[dict], power: float = TARGET_POWER, *, unit: str = "tokens") -> dict:
    """Smallest budget reaching ``power`` from fixed-budget records of one profile.

    Returns:
        {"grid": first calibrated budget with rejection_rate >= power (None if none),
         "interpolated": log-linear interpolation of the power curve between the grid budgets
         bracketing ``power`` (None if not reached), "unit": tokens|sampled,
         "power_at_max": rejection rate at the largest budget}. With ``unit="sampled"`` the
         x axis is the mean sampled (T=1) tokens per audit.
    """
    rs = sorted((r for r in records if r.get("design", "fixed") == "fixed"), key=lambda r: r["budget_tokens"])
    if not rs:
        return {"grid": None, "interpolated": None, "unit": unit, "power_at_max": None}
    xs = [float(r["budget_tokens"] if unit == "tokens" else r.get("sampled_tokens", 0.0)) for r in rs]
    ys = [float(r["rejection_rate"]) for r in rs]
    grid = interp = None
    for i, (x, y) in enumerate(zip(xs, ys)):
        if y >= power:
            grid = x
            if i == 0:
                interp = x
            else:
                x0, y0 = xs[i - 1], ys[i - 1]
                if y == y0 or x0 <= 0:
                    interp = x
                else:
                    f = (power - y0) / (y - y0)
                    interp = float(math.exp(math.log(x0) + f * (math.log(x) - math.log(x0))))
            break
    return {"grid": grid, "interpolated": interp, "unit": unit, "power_at_max": ys[-1]}


def check_targets(records: Sequence[dict]) -> list[dict]:
    """Evaluate the issue-7 targets on fixed-budget records (one row per target, with ``met``)."""
    from reference.simulator.profiles import PROFILES

    fixed = [r for r in records if r.get("design", "fixed") == "fixed"]
    by: dict[str, list[dict]] = {}
    for r in fixed:
        by.setdefault(r["profile"], []).append(r)
    rows = []
    mix_names = list(dict.fromkeys(record_suite(r) for r in fixed))
    for p, rs_all in by.items():
        prof = PROFILES.get(p)
        if prof is not None and prof.honest:
            for mname in mix_names:  # one row per suite: each is a way to audit, each must hold
                rs = [r for r in rs_all if record_suite(r) == mname]
                if not rs:
                    continue
                worst = max(rs, key=lambda r: (r["rejection_rate"], r["ci_high"]))
                rows.append({
                    "profile": p,
                    "suite": mname,
                    "target": f"false accusation <= {MAX_FALSE_ACCUSATION} (upper CI <= {MAX_FALSE_ACCUSATION_UPPER}) at every "
                              f"budget, suite `{mname}`",
                    "measured": f"max {worst['rejection_rate']:.3f} [{worst['ci_low']:.3f}, {worst['ci_high']:.3f}] at "
                                f"{worst['budget_tokens']} tokens; mean {np.mean([r['rejection_rate'] for r in rs]):.3f} over "
                                f"{len(rs)} budgets",
                    "met": all(r["rejection_rate"] <= MAX_FALSE_ACCUSATION and r["ci_high"] <= MAX_FALSE_ACCUSATION_UPPER
                               for r in rs),
                })
    for p, (limit, unit) in POWER_TARGETS.items():
        if p not in by:
            continue
        per_mix: dict[str, list[dict]] = {}
        for r in by[p]:
            per_mix.setdefault(record_suite(r), []).append(r)
        found = {m: tokens_for_power(rs, TARGET_POWER, unit=unit) for m, rs in per_mix.items()}
        parts = []
        for m, tp in found.items():
            x = tp["interpolated"]
            parts.append(f"`{m}`: " + (f"{x:.0f} {unit} (grid {tp['grid']:.0f})" if x is not None
                                        else f"not reached ({tp['power_at_max']:.2f} at its largest budget)"))
        reached = {m: tp["interpolated"] for m, tp in found.items() if tp["interpolated"] is not None}
        best = min(reached, key=reached.get) if reached else None
        rows.append({
            "profile": p,
            "target": f">= {TARGET_POWER:.0%} power at <= {limit} {'sampled tokens' if unit == 'sampled' else 'tokens'}",
            "measured": "; ".join(parts),
            "best_suite": best,
            "met": best is not None and reached[best] <= limit,
        })
    for mname in mix_names:
        rej = [r for r in fixed if record_suite(r) == mname
               and not (PROFILES.get(r["profile"]) and PROFILES[r["profile"]].honest)]
        n_rej = sum(r["rejections"] for r in rej if r.get("rejections"))
        n_ok = sum(round(r["rejections"] * (r["cause_correct_rate"] or 0.0)) for r in rej if r.get("rejections"))
        if n_rej:
            rows.append({
                "profile": "all deviating profiles",
                "suite": mname,
                "target": f"cause named right in >= {MIN_CAUSE_CORRECT:.0%} of rejections, suite `{mname}`",
                "measured": f"{n_ok / n_rej:.3f} ({n_ok}/{n_rej})",
                "met": n_ok / n_rej >= MIN_CAUSE_CORRECT,
            })
    return rows


# =============================================================================================
# outputs: JSON, Markdown, PNG; database
# =============================================================================================


#: Hand-written analysis below this marker in docs/calibration.md survives re-generation.
ANALYSIS_MARKER = "<!-- analysis: text below this line is kept when `auditor calibrate` rewrites the file -->"

METHOD_MD = """## Method

- **Pools** (`auditor/calibrate.py`): per simulator profile, one temperature-0 continuation of every
  distinct prompt of the shipped suites and several temperature-1 samples per prompt, with the
  provider's top-20 logprobs and the reference's top-20 at the provider's own prefix, in both honest
  reference precisions (float32, bfloat16). Profiles whose verification is lossless at a temperature
  are decoded in batches from the simulator's own served model (`build_served_model`: lossless
  speculative decoding has the output law of plain decoding); `greedy-verify` (sampling) and
  `decode-noncompliant` (greedy) by batched decoding with their verifier's per-position rule;
  `relaxed-threshold` and `typical-acceptance` (sampling), whose law depends on the drafts, through
  the simulator engine itself (n-gram drafter, ideal-draft fallback, seeds). Pools are cached on disk
  keyed by model revision, profile recipe, suite versions/digests and pool configuration.
- **Audits**: each audit draws requests without replacement in the default suite's proportions,
  charging each request its `max_tokens` exactly like `auditor check --budget-tokens`
  (`auditor.audit.plan_budget`), and decides with the pipeline's own functions
  (`auditor.audit.run_reference_detectors`: every detector against both honest references with
  their noise floors, intersection–union; then Holm and the rules of `auditor.verdict`).
- **Intervals**: Clopper–Pearson 95% for the rejection rate. Audits resample one finite pool per
  profile; at large budgets they share requests, so the interval understates pool-to-pool spread.
- **Sequential** (`auditor/sequential.py`): group-sequential looks at 100, 200, 400, … tokens,
  Lan–DeMets α spending, union bound over looks (valid for any dependence between looks).
"""


def _pct(x: Any, nd: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * float(x):.{nd}f}%"


def render_markdown(run_list: Sequence[dict], meta: dict) -> str:
    """The Markdown report (docs/calibration.md) from the JSON records and the run's meta."""
    all_fixed = [r for r in run_list if r.get("design", "fixed") == "fixed"]
    seq = [r for r in run_list if r.get("design") == "sequential"]
    mix_names = list(dict.fromkeys(record_suite(r) for r in all_fixed))
    primary = mix_names[0] if mix_names else "default"
    fixed = [r for r in all_fixed if record_suite(r) == primary]
    budgets = sorted({r["budget_tokens"] for r in fixed})
    profiles = list(dict.fromkeys(r["profile"] for r in fixed))
    L: list[str] = []
    L.append("# Detection benchmark: false-accusation rate and power per token budget\n")
    L.append(
        f"Model `{meta.get('model')}` (revision `{meta.get('revision')}`), references {', '.join(meta.get('references', []))}; "
        f"{meta.get('audits')} resampled audits per cell at family-wise α = {meta.get('alpha')}; probe mix "
        f"{meta.get('mix', {}).get('description', '')}. Generated by `auditor calibrate` on {meta.get('created_at')} "
        f"({(meta.get('timings') or {}).get('total_s', '?')} s; machine {meta.get('machine', {})}).\n"
    )
    L.append("Rejection = the audit names a deviation (QUANTIZATION, RELAXED_VERIFICATION, SUBSTITUTION, "
             "DECODING_NONCOMPLIANT). On honest profiles it is the **false-accusation rate**, on the others the "
             "**power**. Brackets: Clopper–Pearson 95% interval; *cause* = share of rejections that name the "
             "profile's cause.\n")
    L.append("## Rejection rate by profile and budget (completion tokens per audit)\n")
    mixes_meta = {m.get("name"): m for m in (meta.get("mixes") or [meta.get("mix") or {}])}
    for mname in mix_names:
        L.extend(_rate_table([r for r in all_fixed if record_suite(r) == mname], mname,
                             mixes_meta.get(mname) or {}, primary=mname == primary))
    L.append("Mean sampled (temperature-1) tokens per audit (`" + primary + "` suite): " + ", ".join(
        f"{b:,} → {np.mean([r['sampled_tokens'] for r in fixed if r['budget_tokens'] == b]):.0f}" for b in budgets) + ".\n")
    L.append("![power vs tokens](calibration.png)\n")
    L.extend(_rest_of_markdown(run_list, meta, fixed, seq, budgets, profiles))
    return "\n".join(L) + "\n"


def _rate_table(fixed: Sequence[dict], mname: str, mmeta: dict, *, primary: bool) -> list[str]:
    """One Markdown table of rejection rates (profile × budget) for the records of one probe mix."""
    from reference.simulator.profiles import PROFILES

    budgets = sorted({r["budget_tokens"] for r in fixed})
    profiles = list(dict.fromkeys(r["profile"] for r in fixed))
    L: list[str] = []
    cap = mmeta.get("max_total")
    L.append(f"### Suite `{mname}`" + (" (primary)" if primary else "") + "\n")
    if mmeta.get("description"):
        L.append(f"{mmeta['description']}" + (f"; the whole suite plans {cap:,} completion tokens" if cap else "")
                 + (" (larger budgets draw more prompts from the pool in the same proportions)." if primary and cap
                    and budgets and budgets[-1] > cap else ".") + "\n")
    hdr = "| profile | expected | " + " | ".join(f"{b:,} tok" for b in budgets) + " |"
    L.append(hdr)
    L.append("|" + "---|" * (2 + len(budgets)))
    for p in profiles:
        cells = []
        for b in budgets:
            r = next((x for x in fixed if x["profile"] == p and x["budget_tokens"] == b), None)
            if r is None:
                cells.append("")
                continue
            c = f"{_pct(r['rejection_rate'])} [{_pct(r['ci_low'])}, {_pct(r['ci_high'])}]"
            if r.get("cause_correct_rate") is not None:
                c += f", cause {_pct(r['cause_correct_rate'], 0)}"
            if r.get("inconclusive_rate"):
                c += f", inconcl. {_pct(r['inconclusive_rate'], 0)}"
            cells.append(c)
        exp = PROFILES[p].expected_verdict if p in PROFILES else ""
        L.append(f"| `{p}` | {exp} | " + " | ".join(cells) + " |")
    L.append("")
    return L


def _rest_of_markdown(run_list: Sequence[dict], meta: dict, fixed: Sequence[dict], seq: Sequence[dict],
                      budgets: Sequence[int], profiles: Sequence[str]) -> list[str]:
    """Targets, sequential audits, verdict/detector tables, pools, timings and the method."""
    L: list[str] = []
    tg = check_targets(run_list)
    if tg:
        L.append("## Targets (issue 7)\n")
        L.append("| profile | target | measured | met |")
        L.append("|---|---|---|---|")
        for t in tg:
            met = ("yes" if t["met"] else "**no**") + (f" (`{t['best_suite']}`)" if t.get("best_suite") else "")
            L.append(f"| `{t['profile']}` | {t['target']} | {t['measured']} | {met} |")
        L.append("")
    if seq:
        L.append("## Sequential audits (`auditor check --budget-tokens auto`)\n")
        d = seq[0].get("sequential_design") or {}
        L.append(f"Group-sequential design, looks at {d.get('looks')} tokens, {d.get('spending')} α spending "
                 f"(α per look {[round(a, 5) for a in d.get('look_alphas', [])]}), union bound over looks "
                 "(`auditor/sequential.py`).\n")
        L.append("| profile | rejection [95% CI] | cause | verdicts | mean tokens | median | saved vs fixed max | fixed-max rejection |")
        L.append("|---|---|---|---|---|---|---|---|")
        for s in seq:
            fx = next((r for r in fixed if r["profile"] == s["profile"] and r["budget_tokens"] == s["max_tokens"]), None)
            L.append(
                f"| `{s['profile']}` | {_pct(s['rejection_rate'])} [{_pct(s['ci_low'])}, {_pct(s['ci_high'])}] | "
                f"{_pct(s.get('cause_correct_rate'), 0)} | {s['verdicts']} | {s['mean_tokens']:.0f} | "
                f"{s['median_tokens']:.0f} | {_pct(s['tokens_saved'], 0)} | {_pct(fx['rejection_rate']) if fx else '–'} |"
            )
        allm = [s["mean_tokens"] for s in seq]
        L.append(f"\nAverage over profiles: {np.mean(allm):.0f} tokens of {seq[0]['max_tokens']} "
                 f"({1 - np.mean(allm) / seq[0]['max_tokens']:.0%} saved).\n")
    if fixed:
        bmax = budgets[-1]
        L.append(f"## Verdicts and deciding detectors at {bmax:,} tokens\n")
        verdict_names = ["PASS", "QUANTIZATION", "RELAXED_VERIFICATION", "SUBSTITUTION", "DECODING_NONCOMPLIANT", "INCONCLUSIVE"]
        L.append("| profile | " + " | ".join(verdict_names) + " |")
        L.append("|" + "---|" * (1 + len(verdict_names)))
        for p in profiles:
            r = next((x for x in fixed if x["profile"] == p and x["budget_tokens"] == bmax), None)
            if r:
                L.append(f"| `{p}` | " + " | ".join(str(r["verdicts"].get(v, 0)) for v in verdict_names) + " |")
        L.append("")
        dets = sorted({k for r in fixed for k in r.get("detectors", {})})
        L.append(f"Per-detector rejection share (Holm-adjusted p ≤ α) at {bmax:,} tokens:\n")
        L.append("| profile | " + " | ".join(dets) + " |")
        L.append("|" + "---|" * (1 + len(dets)))
        for p in profiles:
            r = next((x for x in fixed if x["profile"] == p and x["budget_tokens"] == bmax), None)
            if r:
                L.append(f"| `{p}` | " + " | ".join(_pct(r["detectors"].get(k, {}).get("rejected"), 0) for k in dets) + " |")
        L.append("")
    pools = meta.get("pools") or {}
    if pools:
        L.append("## Pools\n")
        L.append("| profile | T=0 items / tokens | T=1 items / tokens | backend T=0 / T=1 | collect s |")
        L.append("|---|---|---|---|---|")
        for p, m in pools.items():
            L.append(f"| `{p}` | {m.get('t0_items')} / {m.get('t0_tokens')} | {m.get('t1_items')} / {m.get('t1_tokens')} | "
                     f"{m.get('backend_t0')} / {m.get('backend_t1')} | {m.get('collect_s')} |")
        L.append("")
    L.append(f"Timings (s): {meta.get('timings')}.\n")
    L.append(METHOD_MD)
    return L


def render_plot(run_list: Sequence[dict], path: Path, *, alpha: float = 0.05) -> None:
    """PNG: rejection rate vs tokens (log x), one line per profile (honest dashed), α and 95% marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from reference.simulator.profiles import PROFILES

    all_fixed = [r for r in run_list if r.get("design", "fixed") == "fixed"]
    mix_names = list(dict.fromkeys(record_suite(r) for r in all_fixed)) or ["default"]
    profiles = list(dict.fromkeys(r["profile"] for r in all_fixed))
    fig, axes = plt.subplots(1, len(mix_names), figsize=(7.5 + 5 * (len(mix_names) - 1) + 2.5, 5.5), dpi=110,
                             squeeze=False, sharey=True)
    cmap = plt.get_cmap("tab20")
    for mi, (mname, ax) in enumerate(zip(mix_names, axes[0])):
        fixed = [r for r in all_fixed if record_suite(r) == mname]
        _plot_mix(ax, fixed, profiles, cmap, PROFILES, alpha=alpha, title=f"suite {mname!r}", ylabel=mi == 0,
                  legend=mi == len(mix_names) - 1)
    fig.suptitle("Detection benchmark on the simulator: rejection rate vs token budget")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _plot_mix(ax: Any, fixed: Sequence[dict], profiles: Sequence[str], cmap: Any, PROFILES: Any, *, alpha: float,
              title: str, ylabel: bool, legend: bool = True) -> None:
    """One panel of :func:`render_plot`: the records of one probe mix."""
    for i, p in enumerate(profiles):
        rs = sorted((r for r in fixed if r["profile"] == p), key=lambda r: r["budget_tokens"])
        if not rs:
            continue
        x = [r["budget_tokens"] for r in rs]
        y = [r["rejection_rate"] for r in rs]
        lo = [r["rejection_rate"] - r["ci_low"] for r in rs]
        hi = [r["ci_high"] - r["rejection_rate"] for r in rs]
        honest = PROFILES[p].honest if p in PROFILES else False
        ax.errorbar(x, y, yerr=[lo, hi], label=p + (" (honest)" if honest else ""), color=cmap(i % 20),
                    linestyle="--" if honest else "-", marker="o", ms=4, capsize=2, lw=1.4)
    ax.axhline(alpha, color="red", lw=1, ls=":", label=f"α = {alpha}")
    ax.axhline(TARGET_POWER, color="gray", lw=1, ls=":", label=f"{TARGET_POWER:.0%} power")
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("completion tokens per audit")
    if ylabel:
        ax.set_ylabel("rejection rate (power; false accusation for honest)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if legend:  # outside the panel, right of it: the curves stay visible
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5), borderaxespad=0.0)


def write_outputs(run: CalibrationRun, out_dir: Path | str) -> dict[str, Path]:
    """Write ``calibration.json`` (list of records), ``calibration.meta.json``, ``calibration.md``
    and ``calibration.png`` into ``out_dir``.

    Returns:
        name → path of each file written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = run.to_json_list()
    paths = {
        "json": out / "calibration.json",
        "meta": out / "calibration.meta.json",
        "markdown": out / "calibration.md",
        "png": out / "calibration.png",
    }
    paths["json"].write_text(json.dumps(records, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    from auditor.detectors.base import _json_safe

    paths["meta"].write_text(json.dumps(_json_safe(run.meta), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    kept = ""
    if paths["markdown"].is_file():
        old = paths["markdown"].read_text(encoding="utf-8")
        if ANALYSIS_MARKER in old:
            kept = old[old.index(ANALYSIS_MARKER) + len(ANALYSIS_MARKER):]
    paths["markdown"].write_text(render_markdown(records, run.meta) + "\n" + ANALYSIS_MARKER + kept, encoding="utf-8")
    render_plot(records, paths["png"], alpha=float(run.meta.get("alpha", 0.05)))
    return paths


def store_results(run: CalibrationRun, db_url: str | None = None) -> int:
    """Replace this model's rows for the run's profiles in ``calibration_results`` with the run's.

    Fixed-budget cells are stored under their profile name; sequential records under
    ``"<profile> (sequential)"`` with ``budget_tokens`` = the design's maximum and the mean tokens
    used in ``details``. The dashboard's Calibration page reads this table.

    Returns:
        Rows written.
    """
    from sqlalchemy import delete

    from auditor.store import CalibrationResult, open_store, queries

    store = open_store(db_url)
    model = str(run.meta.get("model"))
    names = set(run.meta.get("profiles") or []) | {f"{p} (sequential)" for p in run.meta.get("profiles") or []}
    n = 0
    with store.session() as s:
        s.execute(delete(CalibrationResult).where(CalibrationResult.model == model, CalibrationResult.profile.in_(names)))
        for r in run.to_json_list():
            seq = r.get("design") == "sequential"
            keep = {k: v for k, v in r.items() if k not in ("profile", "budget_tokens", "audits", "rejection_rate",
                                                             "ci_low", "ci_high", "cause_correct_rate", "model")}
            keep["revision"] = run.meta.get("revision")
            queries.add_calibration_result(
                s,
                model=model,
                profile=f"{r['profile']} (sequential)" if seq else r["profile"],
                budget_tokens=int(r["budget_tokens"]),
                audits=int(r["audits"]),
                rejection_rate=float(r["rejection_rate"]),
                ci_low=r.get("ci_low"),
                ci_high=r.get("ci_high"),
                cause_correct_rate=r.get("cause_correct_rate"),
                details=keep,
            )
            n += 1
    return n


def committed_calibration_path() -> Path:
    """``docs/calibration.json`` of this checkout (the committed benchmark results)."""
    return Path(__file__).resolve().parents[1] / "docs" / "calibration.json"


def load_calibration(db_url: str | None = None, *, path: Path | None = None, model: str | None = None) -> tuple[list[dict], str]:
    """Calibration records for ``auditor plan``: from the database when it holds rows for the
    model, else from ``path`` or the committed ``docs/calibration.json`` (all of its rows when
    none is for the model, so the caller can say which models are covered).

    Returns:
        (records as dicts with at least profile, budget_tokens, rejection_rate, ci_low, ci_high,
        cause_correct_rate, sampled_tokens, model, design; source description).
    """
    rows: list[dict] = []
    src = ""
    if path is None:
        try:
            from auditor.store import open_store, queries

            store = open_store(db_url)
            with store.session() as s:
                for c in queries.list_calibration_results(s, model=model):
                    d = dict(c.details or {})
                    seq = c.profile.endswith(" (sequential)")
                    d.update({
                        "profile": c.profile.removesuffix(" (sequential)"),
                        "budget_tokens": c.budget_tokens,
                        "audits": c.audits,
                        "rejection_rate": c.rejection_rate,
                        "ci_low": c.ci_low,
                        "ci_high": c.ci_high,
                        "cause_correct_rate": c.cause_correct_rate,
                        "model": c.model,
                        "design": "sequential" if seq else "fixed",
                    })
                    rows.append(d)
            src = "database calibration_results"
        except Exception:  # noqa: BLE001 - an unreachable DB falls back to the committed file
            rows = []
    if not rows:
        p = path or committed_calibration_path()
        if p.is_file():
            allrows = json.loads(p.read_text(encoding="utf-8"))
            rows = [r for r in allrows if model is None or r.get("model") == model] or allrows
            src = str(p)
    return rows, src


# =============================================================================================
# the planner
# =============================================================================================


def make_plan(
    rows: Sequence[dict],
    *,
    model: str,
    target: str = "any",
    power: float = TARGET_POWER,
    pricing: Any = None,
    capabilities: Any = None,
) -> dict:
    """Answer "how many tokens for this power against this deviation?" from calibration records.

    The recommended budget is the smallest *calibrated* budget whose measured rejection rate
    reaches ``power`` (a measured point, not an extrapolation); the log-linear interpolation of
    the power curve is given as an estimate beside it. For ``target="any"`` every deviation of
    :data:`PLAN_TARGETS` must reach the power (the largest of their budgets).

    Args:
        rows: calibration records (:func:`load_calibration`).
        model: reference model name the provider is compared with.
        target: a key of :data:`PLAN_TARGETS`.
        power: wanted rejection rate in (0, 1).
        pricing: ``probes.config.Pricing`` (USD per 1M input/output tokens) or None.
        capabilities: ``probes.config.Capabilities`` or None (notes when the provider offers less
            than the calibrated probe mix asks for).

    Returns:
        JSON-able dict: covered, reached, message, suite (the calibrated suite that reaches the
        power with the fewest tokens, counting only budgets that suite can spend), alternatives
        (the other suites), rows (per profile: tokens, estimate, prompt_tokens, usd,
        power_at_grid, false_accusation), budget_tokens, usd, command, notes.

    Raises:
        KeyError: unknown target.
    """
    if target not in PLAN_TARGETS:
        raise KeyError(f"unknown target {target!r}; choose one of {list(PLAN_TARGETS)}")
    fixed = [r for r in rows if r.get("design", "fixed") == "fixed"]
    models = sorted({str(r.get("model")) for r in fixed})
    mine = [r for r in fixed if str(r.get("model")) == str(model)]
    plan: dict[str, Any] = {"model": model, "target": target, "power": power, "covered": bool(mine), "reached": False,
                            "rows": [], "notes": [], "budget_tokens": None, "usd": None, "command": None}
    if not mine:
        plan["message"] = (
            f"The calibration does not cover model {model!r} (calibrated: {', '.join(models) or 'nothing yet'}). "
            f"Token budgets measured on another model do not transfer; run `auditor calibrate --model {model}` first."
        )
        return plan
    mixes = list(dict.fromkeys(record_suite(r) for r in mine))
    options = []
    for m in mixes:
        usable = [r for r in mine if record_suite(r) == m and (_suite_cap(r) is None or r["budget_tokens"] <= _suite_cap(r))]
        rows_m = _plan_rows(usable, target, power, pricing)
        ok = bool(rows_m) and all(r["tokens"] is not None for r in rows_m) and \
            {r["profile"] for r in rows_m} == {p for p in PLAN_TARGETS[target] if any(x["profile"] == p for x in mine)}
        worst = max((r["tokens"] for r in rows_m), default=None) if ok else None
        options.append({"suite": m, "rows": rows_m, "reached": ok, "budget_tokens": worst})
    for p in PLAN_TARGETS[target]:
        if not any(r["profile"] == p for r in mine):
            plan["notes"].append(f"profile {p!r} is not in the calibration")
    good = [o for o in options if o["reached"]]
    if not good and len(options) > 1:
        combo = _combine_suites(options, [p for p in PLAN_TARGETS[target] if any(x["profile"] == p for x in mine)])
        if combo is not None:
            return _capability_notes(_combined_plan(plan, combo, target, power, model), capabilities)
    best = min(good, key=lambda o: (o["budget_tokens"], mixes.index(o["suite"]))) if good else options[0]
    mix = best["suite"]
    out_rows = best["rows"]
    plan["suite"] = mix
    plan["alternatives"] = [{"suite": o["suite"], "reached": o["reached"], "budget_tokens": o["budget_tokens"]}
                            for o in options if o is not best]
    plan["rows"] = out_rows
    reached = [r for r in out_rows if r["tokens"] is not None]
    plan["reached"] = bool(out_rows) and len(reached) == len(out_rows) and best["reached"]
    if plan["reached"]:
        worst = max(out_rows, key=lambda r: r["tokens"])
        plan["budget_tokens"] = worst["tokens"]
        plan["usd"] = worst["usd"]
        fa = worst["false_accusation_max"]
        fa_hi = worst.get("false_accusation_upper")
        plan["message"] = (
            f"To detect {target} with {power:.0%} power on {model}: a budget of {worst['tokens']:,} completion tokens "
            f"per audit with the {mix!r} suite (--suite {mix} --budget-tokens {worst['tokens']})"
            + (f" (~${worst['usd']:.4f} at the provider's prices)" if worst["usd"] is not None else "")
            + (f"; false-accusation rate measured at that budget: at most {fa:.1%} over the honest profiles"
               + (f" (95% upper bound {fa_hi:.1%})" if fa_hi is not None else "") if fa is not None else "")
            + "."
        )
        plan["command"] = f"auditor check --suite {mix} --budget-tokens {worst['tokens']}"
        for o in plan["alternatives"]:
            plan["notes"].append(
                f"suite {o['suite']!r}: " + (f"{o['budget_tokens']:,} tokens" if o["reached"] else
                                            f"does not reach {power:.0%} within the budgets it can spend")
            )
    else:
        missing = [r["profile"] for r in out_rows if r["tokens"] is None]
        plan["message"] = (
            f"The calibration of {model} never reaches {power:.0%} power against {', '.join(missing) or target} within the "
            f"calibrated budgets any one suite can spend (largest {max((r['max_budget'] for r in out_rows), default=0):,} "
            "tokens). Calibrate larger budgets (`auditor calibrate --budgets ...`) or use a probe mix with more "
            "logprob/sampling tokens."
        )
    return _capability_notes(plan, capabilities)


def _capability_notes(plan: dict, capabilities: Any) -> dict:
    """Notes where the provider offers less than the calibrated suites ask for."""
    if capabilities is not None:
        if not getattr(capabilities, "logprobs", True):
            plan["notes"].append(
                "this provider returns no logprobs: the calibration assumes top_logprobs 5; "
                "without them only greedy-match and the sampling tests run, so more tokens are needed than shown"
            )
        elif int(getattr(capabilities, "max_top_logprobs", 20)) < 5:
            plan["notes"].append(
                f"this provider lists at most {capabilities.max_top_logprobs} top_logprobs; the calibration used up to 5"
            )
    return plan


def _combine_suites(options: Sequence[dict], profiles: Sequence[str]) -> list[dict] | None:
    """When no one suite reaches the power against every profile: give each profile the suite that
    reaches it with the fewest tokens; one audit per suite used, at the largest budget its profiles
    need. None when some profile is reached by no suite."""
    cands: dict[str, list[tuple[str, dict]]] = {}
    for p in profiles:
        cands[p] = [(o["suite"], r) for o in options for r in o["rows"] if r["profile"] == p and r["tokens"] is not None]
        if not cands[p]:
            return None
    # suites some profile needs (the only one reaching it) are run anyway: give them what they reach
    needed = {c[0][0] for c in cands.values() if len(c) == 1}
    pick: dict[str, tuple[str, dict]] = {}
    for p in profiles:
        mine = [c for c in cands[p] if c[0] in needed] or cands[p]
        pick[p] = min(mine, key=lambda c: c[1]["tokens"])
        needed.add(pick[p][0])
    audits: dict[str, dict] = {}
    for p, (suite, row) in pick.items():
        a = audits.setdefault(suite, {"suite": suite, "budget_tokens": 0, "usd": 0.0, "profiles": [], "rows": []})
        a["profiles"].append(p)
        a["rows"].append({**row, "suite": suite})
    for a in audits.values():
        a["worst"] = max(a["rows"], key=lambda r: r["tokens"])  # the row that sets the audit's budget
        a["budget_tokens"], a["usd"] = a["worst"]["tokens"], a["worst"]["usd"]
    return list(audits.values())


def _combined_plan(plan: dict, audits: list[dict], target: str, power: float, model: str) -> dict:
    plan["reached"] = True
    plan["suite"] = None
    plan["audits"] = [{k: v for k, v in a.items() if k not in ("rows", "worst")} for a in audits]
    plan["rows"] = [r for a in audits for r in a["rows"]]
    plan["budget_tokens"] = sum(a["budget_tokens"] for a in audits)
    usd = [a["usd"] for a in audits]
    plan["usd"] = None if any(u is None for u in usd) else float(sum(usd))
    def _fa(a: dict) -> str:
        w = a["worst"]
        if w.get("false_accusation_max") is None:
            return ""
        hi = w.get("false_accusation_upper")
        return f"; false accusations measured {w['false_accusation_max']:.1%}" + (f", 95% upper bound {hi:.1%}" if hi is not None else "")

    parts = [f"--suite {a['suite']} --budget-tokens {a['budget_tokens']} (for {', '.join(a['profiles'])}{_fa(a)})"
             for a in audits]
    plan["message"] = (
        f"No one suite detects every deviation of {target!r} with {power:.0%} power on {model} within what it can spend; "
        f"{len(audits)} audits do, {plan['budget_tokens']:,} completion tokens in all"
        + (f" (~${plan['usd']:.4f} at the provider's prices)" if plan["usd"] is not None else "")
        + ": " + "; ".join(parts) + "."
    )
    plan["command"] = " && ".join(f"auditor check --suite {a['suite']} --budget-tokens {a['budget_tokens']}" for a in audits)
    return plan


def record_suite(r: dict) -> str:
    """The suite (probe mix) of a calibration record; records written before suites existed are ``default``."""
    return str(r.get("mix") or "default")


def _suite_cap(r: dict) -> int | None:
    """Planned tokens of the record's whole suite (what ``auditor check --suite`` can spend), if known."""
    cap = (r.get("extra") or {}).get("suite_max_tokens", r.get("suite_max_tokens"))
    return None if cap is None else int(cap)


def _plan_rows(mine: Sequence[dict], target: str, power: float, pricing: Any) -> list[dict]:
    """Per target profile of one probe mix: the smallest calibrated budget reaching ``power``."""
    honest = [r for r in mine if r.get("honest")]
    out_rows = []
    for p in PLAN_TARGETS[target]:
        rs = sorted((r for r in mine if r["profile"] == p), key=lambda r: r["budget_tokens"])
        if not rs:
            continue
        tp = tokens_for_power(rs, power)
        grid = None if tp["grid"] is None else int(tp["grid"])
        at = next((r for r in rs if r["budget_tokens"] == grid), rs[-1])
        prompt = float(at.get("prompt_tokens") or 0.0)
        usd = None
        if pricing is not None and grid is not None:
            usd = float(pricing.cost_usd(round(prompt), grid))
        at_b = [r for r in honest if r["budget_tokens"] == (grid or rs[-1]["budget_tokens"])]
        fa = [r["rejection_rate"] for r in at_b]
        fa_hi = [r["ci_high"] for r in at_b if r.get("ci_high") is not None]
        out_rows.append({
            "profile": p,
            "tokens": grid,
            "estimate": None if tp["interpolated"] is None else math.ceil(tp["interpolated"]),
            "power_at_grid": at["rejection_rate"],
            "power_ci": [at.get("ci_low"), at.get("ci_high")],
            "cause_correct_rate": at.get("cause_correct_rate"),
            "sampled_tokens": at.get("sampled_tokens"),
            "prompt_tokens": prompt,
            "usd": usd,
            "max_budget": rs[-1]["budget_tokens"],
            "power_at_max": rs[-1]["rejection_rate"],
            "false_accusation_max": max(fa) if fa else None,
            "false_accusation_upper": max(fa_hi) if fa_hi else None,
        })
    return out_rows
