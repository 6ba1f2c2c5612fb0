"""The ``check`` pipeline: probe a provider, score it against the reference, test, decide, store.

``run_check(provider_name, ...)`` — what ``auditor check`` and the scheduler call — runs:

1. **Config and plan**: the provider from ``providers.toml`` (``probes.config``), the suite
   (``probes.suites``); ``budget_tokens`` caps the *planned completion tokens* (Σ max_tokens ×
   samples) by taking the suite's requests in an order that keeps its mix of modes (greedy,
   logprob, sampling) and workloads (:func:`plan_budget`).
2. **Probes** through ``auditor.runner`` (kind ``audit``): every attempt stored as it arrives;
   ``resume=RUN_ID`` continues an interrupted audit (pending probes only; a finished one is only
   re-scored).
3. **Normalized tokens → reference tokens**: each stored final response is normalized again
   (``probes.normalize``; the stored rows drop the alternatives' bytes) and aligned to the
   reference tokenizer through bytes (``probes.align``); the aligned ids are written back to
   ``normalized_tokens.ref_token_id``. Only positions that map 1:1 are compared (a 1:n token has
   no single reference distribution); alignment failures end a continuation and are counted.
4. **Reference scoring**: the reference model teacher-forced at the provider's own prefixes
   (float32 by default; more honest precisions with ``reference_dtypes``, see ``auditor.noise``),
   batched, with the top-20 alternatives and the emitted token's logprob per position; results
   are cached in ``reference_cache`` keyed by model revision + dtype + prompt ids + continuation
   ids + top-k.
5. **Evidence → detectors**: one ``EvidenceBatch`` per reference precision; every reference
   detector (greedy-match, logprob-divergence, sampling-gof/-argmax/-tail) runs against each with
   that precision's noise floor (measured on the simulator's honest profiles, ``auditor.noise``).
   logprob-divergence uses the temperature-0 positions (where its floor is measured). With
   several references the per-detector p-value is the **maximum over them** (intersection–union
   test: accuse only if inconsistent with every honest precision; ``details['nearest_reference']``
   names the one that fit best). ``self-greedy`` runs once on the provider's own logprobs with the
   most lenient band.
6. **Holm → verdict** (``auditor.verdict.decide_verdict``) → detector_results, verdict and the
   run summary (TTFT/TPOT medians, tokens/s, tokens per stream chunk, mean KL, clear-mismatch
   rate, noise floor) stored → :class:`auditor.report.AuditReport`.

Errors a user can fix (bad config, unknown suite, unreachable database or provider, too small a
budget) raise :class:`AuditError` (``exit_code`` 3) with a one-line message naming the fix.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from auditor.report import AuditReport, report_from_store

__all__ = [
    "REFERENCE_TOP_K",
    "AuditError",
    "AuditInterrupted",
    "Observation",
    "analyze_run",
    "build_evidence",
    "get_reference_models",
    "load_observations",
    "load_suite_spec",
    "plan_budget",
    "run_check",
    "run_reference_detectors",
    "score_observations",
    "speed_summary",
]

#: Reference alternatives kept per position (top-K, with the emitted token's own logprob).
REFERENCE_TOP_K = 20
#: Default teacher-forcing batch size (sequences per forward).
SCORE_BATCH_SIZE = 8
#: logprob-divergence uses positions requested at temperature <= this (greedy), where its noise
#: floor was measured (the floor's honest variants generate greedily).
LOGPROB_TEST_MAX_TEMPERATURE = 1e-6
#: Characters of provider text kept before an evidence position (``context``).
EVIDENCE_CONTEXT_CHARS = 60


class AuditInterrupted(KeyboardInterrupt):
    """Ctrl-C/SIGTERM during an audit; ``run_id`` is the run to continue with ``resume`` (None if
    it was interrupted before the run was created)."""

    def __init__(self, run_id: str | None):
        super().__init__(run_id)
        self.run_id = run_id


class AuditError(RuntimeError):
    """An audit cannot start or finish for a reason the user can fix (config, suite, database,
    connection, budget). ``exit_code`` is the CLI exit code (3)."""

    def __init__(self, message: str, exit_code: int = 3):
        super().__init__(message)
        self.exit_code = exit_code


# ------------------------------------------------------------------------------------------ plan
def load_suite_spec(spec: str | None) -> Any:
    """A packaged suite by name (default ``default``) or a suite JSON file.

    Raises:
        AuditError: unknown suite or invalid file (message names it and the fix).
    """
    from probes.suites import Suite, SuiteError, load_suite

    spec = spec or "default"
    p = Path(spec).expanduser()
    try:
        if spec.endswith(".json") or p.is_file():
            if not p.is_file():
                raise SuiteError(f"{p}: no such suite file. Fix: check the --suite path or use a packaged suite name.")
            try:
                return Suite.model_validate(json.loads(p.read_text(encoding="utf-8")))
            except (ValueError, TypeError) as exc:
                raise SuiteError(f"{p}: invalid suite file: {exc}") from None
        return load_suite(spec)
    except SuiteError as exc:
        raise AuditError(str(exc)) from None


def plan_budget(suite: Any, budget_tokens: int | None) -> Any:
    """The suite cut down to at most ``budget_tokens`` planned completion tokens.

    Requests (probe × sample) are taken greedily, always from the mode (greedy / logprob /
    sampling) that has used the smallest share of its own planned tokens so far, and within a mode
    round-robin over workloads with samples spread across prompts (sample 0 of every prompt before
    sample 1), so a small budget keeps the suite's mix. A request that does not fit is skipped
    (smaller ones may still fit). Samples of a probe stay contiguous (``#0..#c-1``), so run keys
    are those of the full suite.

    Args:
        suite: a ``probes.suites.Suite``.
        budget_tokens: cap on Σ max_tokens over planned requests (tokens); None = whole suite.

    Returns:
        A Suite with the same name and version (the digest differs when cut).

    Raises:
        AuditError: the budget is smaller than the smallest request (message gives the minimum).
    """
    if budget_tokens is None or budget_tokens >= suite.max_completion_tokens():
        return suite
    if budget_tokens <= 0:
        raise AuditError(f"--budget-tokens {budget_tokens}: must be a positive number of tokens")
    queues: dict[str, list[tuple[Any, int]]] = {}
    mode_total: Counter[str] = Counter()
    for mode in ("greedy", "logprob", "sampling"):
        probes = [p for p in suite.probes if p.mode == mode]
        by_w: dict[str, list] = {}
        for p in probes:
            by_w.setdefault(p.workload, []).append(p)
        rr: list = []
        while any(by_w.values()):
            for w in list(by_w):
                if by_w[w]:
                    rr.append(by_w[w].pop(0))
        items = [(p, s) for s in range(max((p.n_samples for p in rr), default=0)) for p in rr if s < p.n_samples]
        if items:
            queues[mode] = items
            mode_total[mode] = sum(p.max_tokens for p, _ in items)
    used: Counter[str] = Counter()
    taken: Counter[str] = Counter()
    total = 0
    blocked: set[str] = set()  # probes whose next sample did not fit (samples stay contiguous)
    while True:
        took = False
        for mode in sorted(queues, key=lambda m: (used[m] / mode_total[m], m)):
            q = queues[mode]
            for j, (p, s) in enumerate(q):
                if p.id in blocked or taken[p.id] != s:
                    continue
                if total + p.max_tokens <= budget_tokens:
                    total += p.max_tokens
                    used[mode] += p.max_tokens
                    taken[p.id] += 1
                    q.pop(j)
                    took = True
                    break
                blocked.add(p.id)
            if took:
                break
        if not took:
            break
    if total == 0:
        smallest = min(p.max_tokens for p in suite.probes)
        raise AuditError(
            f"--budget-tokens {budget_tokens} is smaller than the smallest request of suite {suite.name} "
            f"({smallest} tokens). Fix: use --budget-tokens {smallest} or more."
        )
    kept = [p.model_copy(update={"n_samples": taken[p.id]}) for p in suite.probes if taken[p.id] > 0]
    return suite.model_copy(update={"probes": kept})


# ------------------------------------------------------------------------------------------ models
_MODELS: dict[tuple[str, str], Any] = {}
_MODELS_LOCK = threading.Lock()


def get_reference_models(name: str, dtypes: Sequence[str] | None = None) -> dict[str, Any]:
    """The reference model in every honest precision (``auditor.noise.REFERENCE_DTYPES``), loaded
    once per process (the scheduler and ``auditor demo`` audit several providers).

    Raises:
        AuditError: the model cannot be found or loaded (message names the fix).
    """
    from auditor.noise import REFERENCE_DTYPES

    out = {}
    for dt in dtypes or REFERENCE_DTYPES:
        key = (name, dt)
        with _MODELS_LOCK:
            lm = _MODELS.get(key)
            if lm is None:
                try:
                    from reference.models import ModelNotAvailableError, load_model
                except ImportError as exc:  # pragma: no cover - install problem
                    raise AuditError(f"the reference engine is not installed ({exc}). Fix: pip install -e .") from None
                try:
                    lm = load_model(name, dtype=dt)
                except (ModelNotAvailableError, ValueError, OSError) as exc:
                    raise AuditError(f"reference model {name!r} ({dt}) cannot be loaded: {exc}") from None
                _MODELS[key] = lm
        out[dt] = lm
    return out


# ------------------------------------------------------------------------------------------ observations
@dataclass
class Observation:
    """One finished probe, normalized and aligned to the reference tokenizer.

    Attributes:
        probe_id, probe_key, mode, workload: from the ``probes`` row.
        temperature: requested temperature; top_p: requested top_p (1.0 when not sent).
        request: the JSON body sent.
        prompt_ids: reference prompt token ids (chat template applied for ``api = chat``).
        tokens: ``probes.normalize.TokenRecord`` list (bytes of alternatives included).
        ref_ids: reference continuation ids (teacher-forced), covering ``aligned_prefix`` tokens.
        spans: per provider token, ``(start, end)`` into ``ref_ids`` or None.
        one_to_one: per provider token, the single reference id or None.
        failures: alignment failures (``probes.align.AlignmentFailure``).
        anomalies: response-level anomaly kinds.
    """

    probe_id: int
    probe_key: str
    mode: str | None
    workload: str | None
    temperature: float
    top_p: float
    request: dict
    prompt_ids: list[int]
    tokens: list[Any]
    ref_ids: list[int]
    spans: list[tuple[int, int] | None]
    one_to_one: list[int | None]
    failures: list[Any] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)


def _final_attempts(session: Any, run_id: str) -> dict[int, Any]:
    """probe_id → its last successful attempt."""
    from sqlalchemy import select

    from auditor.store.models import ProbeAttempt

    out: dict[int, Any] = {}
    rows = session.scalars(
        select(ProbeAttempt)
        .where(ProbeAttempt.run_id == run_id, ProbeAttempt.error.is_(None))
        .order_by(ProbeAttempt.probe_id, ProbeAttempt.attempt_no)
    )
    for a in rows:
        out[a.probe_id] = a
    return out


def _stored_token_records(rows: Sequence[Any]) -> list[Any]:
    """TokenRecords from stored ``normalized_tokens`` rows (fallback when no raw body is stored):
    alternatives' bytes are taken as the UTF-8 of their strings."""
    from probes.normalize import TokenRecord

    out = []
    for r in rows:
        tops = []
        for alt in r.top_logprobs or []:
            tok = str(alt[0]) if alt else ""
            lp = alt[1] if len(alt) > 1 else None
            tops.append((tok, tok.encode("utf-8", errors="surrogatepass"), lp))
        out.append(TokenRecord(index=r.position, token=r.token, bytes=r.token_bytes, logprob=r.logprob,
                               top_logprobs=tops, anomalies=list(r.anomalies or [])))
    return out


def _retokenize(text: str, tokenizer: Any) -> list[Any]:
    """TokenRecords of ``text`` tokenized by the reference tokenizer (no logprobs, no alternatives).

    Fallback for responses without per-token data (the provider returned no logprobs): it assumes
    the provider emitted the canonical tokenization of its text, which holds for almost every
    position of a model with the same tokenizer (a sampler can emit a non-canonical split; such a
    position is then scored as its canonical merge). Each record carries ``retokenized``.
    """
    from probes.normalize import TokenRecord

    bv = _byte_vocab(tokenizer)
    out = []
    for i, tid in enumerate(tokenizer.encode(text, add_special_tokens=False)):
        b = bv.id_bytes.get(int(tid))
        out.append(TokenRecord(index=i, token=_token_text(bv, int(tid)), bytes=b, logprob=None, anomalies=["retokenized"]))
    return out


def load_observations(store: Any, run_id: str, config: Any, tokenizer: Any) -> list[Observation]:
    """Normalize and align every ``done`` probe of a run (and store the aligned reference ids).

    Args:
        store: open ``auditor.store.Store``; run_id: the audit run.
        config: the provider's ``ProviderConfig`` (api, max_top_logprobs).
        tokenizer: the reference tokenizer.

    Returns:
        Observations in plan order (probes without tokens are skipped).
    """
    from auditor.store import queries as q
    from probes.align import align_to_reference
    from probes.normalize import normalize_response
    from reference.scoring import encode_prompt

    obs: list[Observation] = []
    with store.session() as s:
        finals = _final_attempts(s, run_id)
        stored = {}
        for p in q.list_probes(s, run_id, status="done"):
            stored[p.id] = p
        for pid, p in stored.items():
            req = dict(p.request_json or {})
            att = finals.get(pid)
            tokens = None
            anomalies: list[str] = list(p.anomalies or [])
            if att is not None and att.response_text:
                norm = normalize_response(
                    config.api, req, response_text=att.response_text, stream=bool(req.get("stream")),
                    max_top_logprobs=config.capabilities.max_top_logprobs,
                )
                tokens = norm.tokens
                anomalies = list(norm.anomalies)
            if tokens is None:
                tokens = _stored_token_records(q.tokens_for_probe(s, pid))
            if not tokens and p.text:
                tokens = _retokenize(p.text, tokenizer)
                anomalies.append("retokenized_text")
            if not tokens:
                continue
            if "messages" in req:
                prompt_ids = encode_prompt(tokenizer, req["messages"], chat=True)
            else:
                prompt = req.get("prompt")
                prompt_ids = encode_prompt(tokenizer, prompt[0] if isinstance(prompt, list) else str(prompt or ""), chat=False)
            al = align_to_reference(tokens, tokenizer)
            q.set_ref_token_ids(s, pid, list(al.ref_token_ids))
            temp = req.get("temperature")
            top_p = req.get("top_p")
            obs.append(
                Observation(
                    probe_id=pid,
                    probe_key=p.probe_key,
                    mode=p.mode,
                    workload=p.workload,
                    temperature=float(1.0 if temp is None else temp),
                    top_p=float(1.0 if top_p is None else top_p),
                    request=req,
                    prompt_ids=list(prompt_ids),
                    tokens=list(tokens),
                    ref_ids=list(al.ref_ids),
                    spans=list(al.spans),
                    one_to_one=list(al.ref_token_ids),
                    failures=list(al.failures),
                    anomalies=anomalies,
                )
            )
    return obs


# ------------------------------------------------------------------------------------------ scoring
def _pack(sc: Any) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, logprobs=np.asarray(sc.logprobs, np.float64), top_ids=np.asarray(sc.top_ids, np.int64),
                        top_logprobs=np.asarray(sc.top_logprobs, np.float64))
    return buf.getvalue()


def _unpack(payload: bytes, token_ids: list[int]) -> Any:
    from reference.scoring import ScoredContinuation

    with np.load(io.BytesIO(payload)) as z:
        return ScoredContinuation(list(token_ids), z["logprobs"], z["top_ids"], z["top_logprobs"], None)


def score_observations(
    store: Any,
    lm: Any,
    dtype: str,
    observations: Sequence[Observation],
    *,
    top_k: int = REFERENCE_TOP_K,
    batch_size: int = SCORE_BATCH_SIZE,
    progress: Callable[[int, int], None] | None = None,
) -> list[Any]:
    """Teacher-force the reference ``lm`` at every observation's own prefix, through the cache.

    Args:
        store: open store (``reference_cache`` table); lm: ``LoadedModel`` in precision ``dtype``.
        observations: their ``prompt_ids`` and ``ref_ids`` are scored.
        top_k: alternatives per position; batch_size: sequences per forward.
        progress: ``progress(done, total)`` after each batch (sequences).

    Returns:
        ``reference.scoring.ScoredContinuation`` per observation (``token_ids == ref_ids``).
    """
    from auditor.store import queries as q
    from reference.scoring import ScoredContinuation, score_continuations

    keys = [q.reference_cache_key(lm.revision, dtype, o.prompt_ids, o.ref_ids, top_k) for o in observations]
    with store.session() as s:
        cached = q.reference_cache_get_many(s, keys)
    out: list[Any] = [None] * len(observations)
    todo = []
    for i, (o, k) in enumerate(zip(observations, keys)):
        if not o.ref_ids:
            out[i] = ScoredContinuation([], np.zeros(0), np.zeros((0, top_k), np.int64), np.zeros((0, top_k)), None)
        elif k in cached:
            try:
                out[i] = _unpack(cached[k], o.ref_ids)
            except (ValueError, KeyError, OSError):
                todo.append(i)
        else:
            todo.append(i)
    todo.sort(key=lambda i: len(observations[i].prompt_ids) + len(observations[i].ref_ids))
    done = len(observations) - len(todo)
    if progress is not None:
        progress(done, len(observations))
    for b in range(0, len(todo), batch_size):
        idx = todo[b : b + batch_size]
        res = score_continuations(
            lm, [observations[i].prompt_ids for i in idx], [observations[i].ref_ids for i in idx],
            top_k=top_k, batch_size=batch_size,
        )
        with store.session() as s:
            for i, sc in zip(idx, res):
                out[i] = sc
                q.reference_cache_put(s, keys[i], lm.revision, _pack(sc))
        done += len(idx)
        if progress is not None:
            progress(done, len(observations))
    return out


# ------------------------------------------------------------------------------------------ evidence
def _byte_vocab(tokenizer: Any) -> Any:
    from probes.align import _byte_vocab as bv

    return bv(tokenizer)


def _alt_id(bv: Any, tok: str, b: bytes | None) -> int | None:
    if b is None:
        return None
    if b == b"":
        return bv.special.get(tok)
    return bv.by_bytes.get(b)


@dataclass
class EvidenceIndex:
    """Where each evidence position came from: ``(observation index, provider token index)``."""

    rows: list[tuple[int, int]]


def build_evidence(
    observations: Sequence[Observation],
    scored: Sequence[Any] | None,
    tokenizer: Any,
) -> tuple[Any, EvidenceIndex]:
    """One ``EvidenceBatch`` over every comparable position (provider token mapping 1:1 onto a
    reference token, inside the aligned prefix).

    Args:
        observations: from :func:`load_observations`.
        scored: per observation the reference's ScoredContinuation over ``ref_ids`` (None = no
            reference: only the self-consistency detectors can run).
        tokenizer: the reference tokenizer (maps the provider's alternatives to reference ids).

    Returns:
        (EvidenceBatch, EvidenceIndex). Shapes: N positions; reference top-K = scored top_k;
        provider width M = the most alternatives any position listed.
    """
    from auditor.detectors import UNTRUSTED_LOGPROB_ANOMALIES, EvidenceBatch

    bv = _byte_vocab(tokenizer)
    rows: list[tuple[int, int]] = []
    ref_rows: list[int] = []
    for oi, o in enumerate(observations):
        if o.temperature > 0 and o.top_p < 1.0:
            continue  # sampling tests assume the full distribution (top_p = 1)
        for ti, tid in enumerate(o.one_to_one):
            if tid is None or o.spans[ti] is None:
                continue
            rows.append((oi, ti))
            ref_rows.append(o.spans[ti][0])
    n = len(rows)
    m = max((len(observations[oi].tokens[ti].top_logprobs) for oi, ti in rows), default=0)
    p_ids = np.full((n, m), -1, np.int64)
    p_lp = np.full((n, m), -np.inf)
    p_tok = np.empty(n, dtype=object)
    trusted = np.ones(n, bool)
    prompt_ids, positions, token_ids, temps, texts = [], [], [], [], []
    for j, (oi, ti) in enumerate(rows):
        o = observations[oi]
        t = o.tokens[ti]
        prompt_ids.append(o.probe_key)
        positions.append(ti)
        token_ids.append(int(o.one_to_one[ti]))
        temps.append(o.temperature)
        texts.append(t.token)
        p_tok[j] = t.logprob
        if set(t.anomalies or ()) & UNTRUSTED_LOGPROB_ANOMALIES:
            trusted[j] = False
        c = 0
        for tok, b, lp in t.top_logprobs:
            aid = _alt_id(bv, tok, b)
            if aid is None or lp is None:
                continue
            p_ids[j, c] = aid
            p_lp[j, c] = float(lp)
            c += 1
    kw: dict[str, Any] = {}
    if scored is not None:
        k = max((s.top_ids.shape[1] for s in scored if s is not None and len(s.token_ids)), default=REFERENCE_TOP_K)
        rt_ids = np.full((n, k), -1, np.int64)
        rt_lp = np.full((n, k), -np.inf)
        rt_tok = np.full(n, np.nan)
        for j, ((oi, _ti), s_idx) in enumerate(zip(rows, ref_rows)):
            sc = scored[oi]
            kk = sc.top_ids.shape[1]
            rt_ids[j, :kk] = sc.top_ids[s_idx]
            rt_lp[j, :kk] = sc.top_logprobs[s_idx]
            rt_tok[j] = sc.logprobs[s_idx]
        kw = {"ref_top_ids": rt_ids, "ref_top_logprobs": rt_lp, "ref_token_logprobs": rt_tok}
    batch = EvidenceBatch.from_arrays(
        prompt_ids=prompt_ids or np.zeros(0, object),
        positions=np.asarray(positions, np.int64),
        token_ids=np.asarray(token_ids, np.int64),
        temperatures=np.asarray(temps, np.float64),
        provider_top_ids=p_ids,
        provider_top_logprobs=p_lp,
        provider_token_logprobs=p_tok,
        provider_trusted=trusted,
        token_texts=texts if texts else None,
        **kw,
    )
    return batch, EvidenceIndex(rows)


# ------------------------------------------------------------------------------------------ detectors
def run_reference_detectors(
    batches: Mapping[str, Any],
    floors: Any,
    *,
    seed: int = 0,
    self_batch: Any | None = None,
) -> list[Any]:
    """Run every detector against every reference precision and combine (intersection–union).

    Args:
        batches: reference dtype → EvidenceBatch (same positions, different reference rows).
        floors: ``auditor.noise.FloorSet`` (a floor per reference dtype), or None.
        seed: seeds every detector's randomization.
        self_batch: batch for the self-consistency detectors (default: the first batch). When
            ``batches`` is empty the self sampling tests run too (no reference available).

    Returns:
        One DetectorResult per detector (registry order). For the reference detectors the result
        kept is the one with the largest p-value over the references (the nearest honest
        reference), with ``details['nearest_reference']`` and ``details['by_reference']``
        (p_value, statistic, effect, n per reference).
    """
    from auditor.detectors import (
        DETECTORS,
        REFERENCE_DETECTORS,
        SELF_SAMPLING_DETECTORS,
        run_detectors,
    )

    out: dict[str, Any] = {}
    per_ref: dict[str, dict[str, Any]] = {}
    for r, batch in batches.items():
        floor = floors.floors.get(r) if floors is not None else None
        names = [k for k in REFERENCE_DETECTORS if k != "logprob-divergence"]
        res_all = run_detectors(batch, floor, names=names, seed=seed)
        # the logprob floor is measured on greedy continuations: compare like with like (T = 0)
        greedy = batch.subset(batch.temperatures <= LOGPROB_TEST_MAX_TEMPERATURE)
        res_all += run_detectors(greedy, floor, names=["logprob-divergence"], seed=seed)
        for res in res_all:
            per_ref.setdefault(res.name, {})[r] = res
    for name, by in per_ref.items():
        ran = {r: res for r, res in by.items() if res.ran}
        if not ran:
            best_r = next(iter(by))
            out[name] = by[best_r]
            continue
        best_r = max(ran, key=lambda r: (ran[r].p_value, -list(batches).index(r)))
        best = ran[best_r]
        det = dict(best.details or {})
        det["nearest_reference"] = best_r
        det["by_reference"] = {
            r: {"p_value": _f(res.p_value), "statistic": _f(res.statistic), "effect": _f(res.effect), "n": res.n}
            for r, res in by.items()
        }
        out[name] = replace(best, details=det)
    sb = self_batch if self_batch is not None else (next(iter(batches.values())) if batches else None)
    if sb is not None:
        self_names = ["self-greedy"] + ([] if batches else list(SELF_SAMPLING_DETECTORS))
        lenient = floors.most_lenient() if floors is not None else None
        for res in run_detectors(sb, lenient, names=self_names, seed=seed):
            out[res.name] = res
    return [out[k] for k in DETECTORS if k in out]


def _f(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


# ------------------------------------------------------------------------------------------ summary
def speed_summary(store: Any, run_id: str) -> dict:
    """Speed figures of a run from its final successful attempts.

    Returns a dict with ``ttft_median_s`` (s, streamed requests), ``tpot_median_s`` (s per output
    token after the first: (latency − TTFT)/(tokens − 1), streamed requests with ≥ 2 tokens),
    ``tokens_per_s`` (Σ completion tokens / Σ request latency), ``latency_median_s``,
    ``tokens_per_chunk`` ({tokens in a stream chunk: chunks}) and ``mean_tokens_per_chunk``
    (> 1 means the server releases several tokens per step: speculative decoding). Missing
    measurements are None.
    """
    from auditor.store import queries as q

    ttft, tpot, lat = [], [], []
    tok_sum, lat_sum = 0, 0.0
    chunks: Counter[int] = Counter()
    with store.session() as s:
        finals = _final_attempts(s, run_id)
        for p in q.list_probes(s, run_id, status="done"):
            a = finals.get(p.id)
            if a is None:
                continue
            n_tok = None
            if p.usage and p.usage.get("completion_tokens") is not None:
                n_tok = int(p.usage["completion_tokens"])
            if n_tok is None:
                n_tok = len(q.tokens_for_probe(s, p.id))
            if a.latency_s is not None and a.latency_s > 0:
                lat.append(float(a.latency_s))
                tok_sum += n_tok
                lat_sum += float(a.latency_s)
            if a.ttft_s is not None:
                ttft.append(float(a.ttft_s))
                if a.latency_s is not None and n_tok >= 2:
                    tpot.append(max(0.0, float(a.latency_s) - float(a.ttft_s)) / (n_tok - 1))
            for c in a.tokens_per_chunk or []:
                if isinstance(c, (int, float)) and c >= 0:
                    chunks[int(c)] += 1

    def med(x: list[float]) -> float | None:
        return float(statistics.median(x)) if x else None

    n_chunks = sum(chunks.values())
    return {
        "ttft_median_s": med(ttft),
        "tpot_median_s": med(tpot),
        "tokens_per_s": (tok_sum / lat_sum) if lat_sum > 0 else None,
        "latency_median_s": med(lat),
        "tokens_per_chunk": {str(k): v for k, v in sorted(chunks.items())} or None,
        "mean_tokens_per_chunk": (sum(k * v for k, v in chunks.items()) / n_chunks) if n_chunks else None,
    }


def _token_text(bv: Any, tid: int) -> str:
    b = bv.id_bytes.get(int(tid))
    if b is None:
        for s, i in bv.special.items():
            if i == tid:
                return s
        return f"#{tid}"
    return b.decode("utf-8", errors="replace")


def _enrich_evidence(results: list[Any], observations: Sequence[Observation], tokenizer: Any) -> list[Any]:
    """Add token texts (``token``, ``ref_top5_tokens``, ``provider_top5_tokens``) and the
    preceding provider text (``context``) to every evidence row, so reports need no tokenizer."""
    bv = _byte_vocab(tokenizer)
    by_key = {o.probe_key: o for o in observations}
    out = []
    for r in results:
        ev = []
        for e in r.evidence or []:
            e = dict(e)
            o = by_key.get(str(e.get("prompt_id")))
            pos = e.get("position")
            if o is not None and isinstance(pos, int) and 0 <= pos < len(o.tokens):
                e.setdefault("token", o.tokens[pos].token)
                prev = b"".join((t.bytes or t.token.encode("utf-8", "replace")) for t in o.tokens[max(0, pos - 24) : pos])
                e["context"] = prev.decode("utf-8", errors="replace")[-EVIDENCE_CONTEXT_CHARS:]
            if e.get("ref_top5"):
                e["ref_top5_tokens"] = [_token_text(bv, int(x[0])) for x in e["ref_top5"]]
            if e.get("provider_top5"):
                e["provider_top5_tokens"] = [_token_text(bv, int(x[0])) for x in e["provider_top5"]]
            if isinstance(e.get("provider_top1"), int):
                e["provider_top1_token"] = _token_text(bv, e["provider_top1"])
            ev.append(e)
        out.append(replace(r, evidence=ev))
    return out


# ------------------------------------------------------------------------------------------ analysis
@dataclass
class _Stage:
    """A progress reporter: rich progress bar (console) or callback; no-op by default."""

    progress: Any = None
    console: Any = None
    _bar: Any = None
    _tasks: dict = field(default_factory=dict)

    def __enter__(self) -> _Stage:
        if self.progress is True:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console or Console(stderr=True))
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, stage: str, done: int, total: int) -> None:
        if self._bar is not None:
            if stage not in self._tasks:
                self._tasks[stage] = self._bar.add_task(stage, total=total)
            self._bar.update(self._tasks[stage], completed=done, total=total)
        elif callable(self.progress):
            self.progress(stage, done, total)


def analyze_run(
    store: Any,
    run_id: str,
    config: Any,
    *,
    alpha: float = 0.05,
    seed: int = 0,
    reference_dtypes: Sequence[str] | None = None,
    progress: Any = None,
    console: Any = None,
    wall_start: float | None = None,
    floors_cache_dir: str | None = None,
    reference_models: Mapping[str, Any] | None = None,
    power: float | None = None,
) -> AuditReport:
    """Steps 3–6 of the pipeline on a run whose probes are stored; stores and returns the report.

    Args:
        store: open store; run_id: the run; config: its ProviderConfig.
        alpha: family-wise level for Holm. seed: detector randomization seed.
        reference_dtypes: honest precisions to compare with (default ``auditor.noise.REFERENCE_DTYPES``).
        progress: True (rich bars on stderr via ``console``), a ``callback(stage, done, total)``, or None.
        wall_start: ``time.perf_counter()`` at the start of the check (for ``wall_s``).
        floors_cache_dir: noise floor cache directory (default ``auditor.noise.noise_cache_dir()``).
        reference_models: reference dtype → LoadedModel to use instead of loading
            ``config.reference`` (tests, calibration).
        power: power a PASS needs against the verdict's target effects (None: its default;
            ``--budget-tokens auto`` raises it for early stops, auditor/sequential.py).

    Raises:
        AuditError: no probe produced tokens (connection/config problem).
    """
    from auditor.noise import get_floors
    from auditor.store import queries as q
    from auditor.verdict import decide_verdict

    t0 = wall_start if wall_start is not None else time.perf_counter()
    lms = dict(reference_models) if reference_models else get_reference_models(config.reference, reference_dtypes)
    first = next(iter(lms.values()))
    tokenizer = first.tokenizer
    with _Stage(progress, console) as stage:
        floors = get_floors(lms, cache_dir=floors_cache_dir, progress=stage.update)
        observations = load_observations(store, run_id, config, tokenizer)
        if not observations:
            raise AuditError(
                f"run {run_id}: no probe returned any token, nothing to audit. Fix: check the provider's "
                f"base_url/model/key, then `auditor check --provider {config.name} --resume {run_id}`."
            )
        scored: dict[str, list[Any]] = {}
        for dt, lm in lms.items():
            scored[dt] = score_observations(
                store, lm, dt, observations, progress=lambda d, t, dt=dt: stage.update(f"reference scoring ({dt})", d, t)
            )
    batches = {dt: build_evidence(observations, scored[dt], tokenizer)[0] for dt in lms}
    results = run_reference_detectors(batches, floors, seed=seed)
    results = _enrich_evidence(results, observations, tokenizer)
    lp_floor = None
    lp = next((r for r in results if r.name == "logprob-divergence" and r.ran), None)
    if lp is not None:
        lp_floor = floors.floors.get(lp.details.get("nearest_reference"))
    verdict = decide_verdict(results, alpha, floor=lp_floor or floors.floors.get(next(iter(lms))),
                             **({} if power is None else {"power": power}))
    adj = {r.name: r for r in verdict.results}

    # ---- headline figures (against the float32 reference, the model as published)
    ref0 = next(iter(lms))
    n_pos = len(next(iter(batches.values())))
    n_tok = sum(len(o.tokens) for o in observations)
    summary = speed_summary(store, run_id)
    g = adj.get("greedy-match")
    summary["mean_kl"] = _by_ref_effect(lp, ref0) if lp is not None else None
    summary["noise_floor"] = _floor_mean_kl(floors, ref0, lp)
    summary["clear_mismatch_rate"] = _by_ref_effect(g, ref0) if g is not None and g.ran else None
    summary["nearest_reference"] = lp.details.get("nearest_reference") if lp is not None else (
        g.details.get("nearest_reference") if g is not None and g.ran else None)
    summary["scored_positions"] = n_pos
    summary["seed"] = seed
    tokens_extra = {
        "scored_positions": n_pos,
        "aligned_positions": sum(1 for o in observations for x in o.one_to_one if x is not None),
        "unaligned_positions": n_tok - sum(1 for o in observations for s in o.spans if s is not None),
        "provider_tokens": n_tok,
    }
    details = dict(verdict.details)
    details["report"] = {
        "detectors": {r.name: {"details": r.details} for r in verdict.results},
        "reference_variants": list(lms),
        "noise_floor": floors.summary(),
        "tokens_extra": tokens_extra,
        "wall_s": round(time.perf_counter() - t0, 3),
    }
    with store.session() as s:
        q.store_detector_results(s, run_id, verdict.results)
        q.store_verdict(s, run_id, verdict.verdict, verdict.reason, details)
        run = q.get_run(s, run_id)
        prev = dict(run.summary or {})
        prev.pop("runner", None)
        prev.update(summary)
        q.update_run(
            s, run_id, alpha=alpha, summary=prev, reference_model=config.reference, reference_revision=first.revision,
            reference_dtype="+".join(lms),
        )
        q.set_run_status(s, run_id, "completed")
    with store.session() as s:
        rep = report_from_store(s, run_id)
    rep.wall_s = details["report"]["wall_s"]
    return rep


def _by_ref_effect(r: Any, ref: str) -> float | None:
    if r is None or not r.ran:
        return None
    by = (r.details or {}).get("by_reference") or {}
    if ref in by and by[ref].get("effect") is not None:
        return float(by[ref]["effect"])
    return _f(r.effect)


def _floor_mean_kl(floors: Any, ref: str, lp: Any) -> float | None:
    fl = floors.floors.get(ref) if floors is not None else None
    if fl is None:
        return None
    m = (lp.details or {}).get("m") if lp is not None else None
    try:
        return float(fl.kl_floor(int(m)).mean_kl) if m is not None else float(fl.kl_floor(fl.available_m()[-1]).mean_kl)
    except (KeyError, IndexError):
        return None


# ------------------------------------------------------------------------------------------ entry point
def run_check(
    provider_name: str,
    *,
    suite: str | None = None,
    budget_tokens: int | None = None,
    alpha: float = 0.05,
    db_url: str | None = None,
    config_path: str | None = None,
    resume: str | None = None,
    progress: Any = None,
    console: Any = None,
    seed: int = 0,
    provider_config: Any = None,
    reference_dtypes: Sequence[str] | None = None,
    floors_cache_dir: str | None = None,
    reference_models: Mapping[str, Any] | None = None,
    power: float | None = None,
) -> AuditReport:
    """Audit one provider end to end (see the module docstring) and return its report.

    Args:
        provider_name: the ``[providers.NAME]`` entry to audit.
        suite: packaged suite name or suite JSON file (default ``default``).
        budget_tokens: cap on planned completion tokens (None = the whole suite).
        alpha: family-wise significance level, in (0, 1).
        db_url: database URL (default ``$AUDITOR_DB_URL`` or the user data dir SQLite file).
        config_path: providers file (default ``./providers.toml`` or the user config dir).
        resume: RUN_ID (or a unique prefix) of an interrupted audit to continue.
        progress: True for rich progress bars (stderr), a callback ``(stage, done, total)``, or None.
        console: rich Console for progress output.
        seed: detector randomization seed (recorded in the run summary).
        provider_config: a ``ProviderConfig`` to use instead of reading ``config_path``.
        reference_dtypes: honest reference precisions (default float32 and bfloat16).
        floors_cache_dir: override the noise-floor cache directory.
        reference_models: reference dtype → LoadedModel (instead of loading ``config.reference``).
        power: power a PASS needs against the target effects (None: the verdict's default).

    Returns:
        AuditReport (``exit_code``: 0 PASS, 1 deviation, 2 INCONCLUSIVE).

    Raises:
        AuditError: config/suite/database/connection/budget problems (exit code 3).
        AuditInterrupted: Ctrl-C (a KeyboardInterrupt; the run is marked ``interrupted``; continue with
            ``resume=exc.run_id``).
    """
    from auditor.runner import RunnerError, run_probes
    from auditor.store import StoreError, open_store
    from auditor.store import queries as q
    from probes.config import ConfigError, get_provider

    t0 = time.perf_counter()
    if not 0 < alpha < 1:
        raise AuditError(f"--alpha {alpha}: must be in (0, 1), e.g. 0.05")
    try:
        cfg = provider_config if provider_config is not None else get_provider(provider_name, config_path)
        cfg.resolve_api_key()
    except ConfigError as exc:
        raise AuditError(str(exc)) from None
    st = plan_budget(load_suite_spec(suite), budget_tokens)
    try:
        store = open_store(db_url)
    except StoreError as exc:
        raise AuditError(str(exc)) from None
    started: dict[str, str] = {}
    try:
        try:
            rid = run_probes(
                store, cfg, st, run_id=resume, resume=resume is not None, progress=progress if progress is True else None,
                kind="audit", console=console, on_start=lambda r, _res: started.setdefault("run_id", r),
            )
        except RunnerError as exc:
            raise AuditError(str(exc)) from None
        except KeyboardInterrupt:
            raise AuditInterrupted(started.get("run_id")) from None
        with store.session() as s:
            run = q.get_run(s, rid)
            status = run.status
            counts = q.probe_counts(s, rid)
            if budget_tokens is not None:
                q.update_run(s, rid, budget_tokens=int(budget_tokens))
            q.update_run(s, rid, alpha=alpha)
        if status == "failed" or not counts.get("done"):
            with store.session() as s:
                errs = Counter(
                    str(a.error).split(":", 1)[0]
                    for p in q.list_probes(s, rid)
                    for a in q.attempts_for_probe(s, p.id)
                    if a.error
                )
            what = ", ".join(f"{k}={v}" for k, v in errs.most_common()) or "no response"
            raise AuditError(
                f"provider {cfg.name!r} at {cfg.base_url}: no probe succeeded ({what}). Fix: check that the server "
                f"is running and its base_url/model/api_key_env, then `auditor check --provider {cfg.name} --resume {rid}`."
            )
        with store.session() as s:
            q.set_run_status(s, rid, "running")
        try:
            rep = analyze_run(
                store, rid, cfg, alpha=alpha, seed=seed, reference_dtypes=reference_dtypes, progress=progress,
                console=console, wall_start=t0, floors_cache_dir=floors_cache_dir,
                reference_models=reference_models, power=power,
            )
        except KeyboardInterrupt:
            with contextlib.suppress(Exception), store.session() as s:
                q.set_run_status(s, rid, "interrupted")
            raise AuditInterrupted(rid) from None
        except BaseException:
            with contextlib.suppress(Exception), store.session() as s:
                q.set_run_status(s, rid, "failed")
            raise
        return rep
    finally:
        store.close()
