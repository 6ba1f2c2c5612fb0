"""Reference-path stage of ``auditor check``: the provider teacher-forced on the reference's own text (echo).

Verdict rule 2 tells a quantized copy from a different model by the margin-conditioned flip ratio
(``auditor.detectors.logprob.margin_flip_stats``). Measured along the *provider's* own generated
continuations that statistic does not separate the two causes (docs/detectors.md, rule 2: a
different model walks into text where the reference is rarely confident); measured along the
*reference's* own greedy continuation it does. Legacy completions with ``echo = true`` and
``logprobs = N`` return the provider's logprobs and top alternatives of the prompt tokens — teacher
forcing of any text — so this stage, run with the probes (after the pre-flight, before the noise
floor), sends one echo request per prompt:

1. Up to :data:`REFERENCE_PATH_PROMPTS` distinct temperature-0 prompts of the run (plan order).
2. The reference's greedy continuation of each (``ReferenceBackend.greedy``, at most
   :data:`REFERENCE_PATH_MAX_TOKENS` tokens, stopped at EOS; cut before any special token and to
   whole UTF-8 characters).
3. One request per prompt through ``probes.client.ProbeClient`` (retries, rate limits): prompt =
   prompt text + continuation text, ``echo = true``, ``logprobs = min(5, max_top_logprobs)``,
   ``max_tokens = 1``, temperature 0; each answer normalized once, here; the echoed tokens and
   request stored in ``audit_runs.summary["reference_path"]`` (``resume`` re-reads them).
4. The echoed tokens aligned to the reference ids of the continuation through bytes
   (``probes.align``): a position is kept only when the provider token covers exactly the bytes
   of one continuation token and maps 1:1 onto that id.
5. The reference teacher-forced on prompt + continuation (``auditor.check.reference_scoring.score_observations``:
   top-20, through the reference cache) and ``margin_flip_stats`` over the kept positions (σ̂ from
   these rows themselves).

Runs only when the provider's api is ``completions``, ``capabilities.echo`` is true, it lists at
least 2 alternatives, and the reference can generate (not ``reference = "none"``). Provider
failures and ignored echoes are counted as evidence and never fail the audit; when nothing usable
came back the test is "not available" with the reason (:attr:`ReferencePath.reason`). The result is
a cause feature for rule 2 (``auditor.verdict.cause``), put into ``logprob-divergence``'s details
under ``reference_path_*`` keys (:attr:`ReferencePath.details`); it is no test of its own and does
not enter the Holm family.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from probes.records import TokenRecord

if TYPE_CHECKING:  # pragma: no cover
    from auditor.check.reference_setup import ReferenceSetup
    from auditor.store import Store
    from probes.config import ProviderConfig

__all__ = [
    "ECHO_UNAVAILABLE",
    "REFERENCE_PATH_MAX_TOKENS",
    "REFERENCE_PATH_PROMPTS",
    "REFERENCE_PATH_TOP",
    "ReferencePath",
    "align_echo",
    "evaluate_reference_path",
    "make_result",
    "reference_path_stage",
]

#: Distinct temperature-0 prompts of the run teacher-forced through echo.
REFERENCE_PATH_PROMPTS = 16
#: Tokens of the reference's greedy continuation per prompt.
REFERENCE_PATH_MAX_TOKENS = 48
#: Alternatives asked per echoed token (legacy completions allow at most 5).
REFERENCE_PATH_TOP = 5
#: Key of the stored exchanges in the run summary.
SUMMARY_KEY = "reference_path"
#: The reason when the provider cannot return echo logprobs (verdict wording).
ECHO_UNAVAILABLE = "the provider does not return echo logprobs"


@dataclass(frozen=True)
class ReferencePath:
    """The reference-path cause feature of one run (build with :func:`make_result`).

    Attributes:
        available: the statistic could be computed (echo answered with usable positions).
        reason: why not, when not available (one sentence).
        stats: ``margin_flip_stats`` over the reference-path positions (+ ``top1_agreement``), or None.
        counts: prompts, requests sent, failed, echo ignored, positions kept and dropped.
        details: the ``reference_path_*`` keys for ``logprob-divergence``'s details (JSON-able; a
            plain field, so that the pipeline reads it without calling back into this stage).
    """

    available: bool
    reason: str | None = None
    stats: Mapping[str, Any] | None = None
    counts: Mapping[str, Any] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)


def make_result(available: bool, reason: str | None, stats: Mapping[str, Any] | None,
                counts: Mapping[str, Any]) -> ReferencePath:
    """A :class:`ReferencePath` with its ``details`` filled in."""
    s = stats or {}
    details: dict[str, Any] = {
        "reference_path_available": available, "reference_path_reason": reason,
        "reference_path_flip_ratio": s.get("confident_flip_ratio"),
        "reference_path_flips": s.get("confident_flips"),
        "reference_path_flips_expected": s.get("confident_flips_expected"),
        "reference_path_n_confident": int(s.get("n_confident") or 0),
        "reference_path_sigma_hat": s.get("sigma_hat"),
        "reference_path_flip_p": s.get("confident_flip_p"),
        "reference_path_margin_sigmas": s.get("confident_margin_sigmas"),
        "reference_path_top1_agreement": s.get("top1_agreement"),
        "reference_path_margin_bins": list(s.get("margin_bins") or []),
        "reference_path_n_positions": int(counts.get("positions") or 0),
        "reference_path_counts": dict(counts),
    }
    return ReferencePath(available, reason, stats, dict(counts), details)


def _unavailable(reason: str, **counts: Any) -> ReferencePath:
    return make_result(False, reason, None, counts)


def static_reason(config: ProviderConfig, ref: ReferenceSetup) -> str | None:
    """Why the test cannot run for this provider and reference (None: it can)."""
    caps = config.capabilities
    if config.api != "completions":
        return f"{ECHO_UNAVAILABLE} (api = {config.api!r}; echo is a legacy completions feature)"
    if not caps.echo:
        return f"{ECHO_UNAVAILABLE} (capabilities.echo = false)"
    if not caps.logprobs or caps.max_top_logprobs < 2:
        return "the provider lists fewer than 2 alternatives per token (capabilities.max_top_logprobs)"
    if ref.kind == "none" or not ref.scorers or _greedy_fn(ref) is None:
        return "no reference that can generate (reference = 'none')"
    return None


def _greedy_fn(ref: ReferenceSetup) -> Any:
    be: Any = ref.backend
    if be is not None and callable(getattr(be, "greedy", None)) and getattr(be, "available", True):
        return be.greedy
    if ref.lms:
        from reference.backends.local import LocalBackend

        lm = ref.lms.get("float32") or next(iter(ref.lms.values()))
        return LocalBackend(lm).greedy
    return None


# ------------------------------------------------------------------------------------------ plan + send
def _prompts(store: Store, run_id: str, n: int) -> list[str]:
    from auditor.store import queries as q

    out: list[str] = []
    with store.session() as s:
        for p in q.list_probes(s, run_id):
            req = dict(p.request_json or {})
            prompt = req.get("prompt")
            prompt = prompt[0] if isinstance(prompt, list) and len(prompt) == 1 else prompt
            if float(req.get("temperature") or 0.0) == 0.0 and isinstance(prompt, str) and prompt and prompt not in out:
                out.append(prompt)
                if len(out) >= n:
                    break
    return out


def _continuation(prompt: str, ref: ReferenceSetup, greedy: Any, max_tokens: int) -> tuple[list[int], list[int], str]:
    """(prompt ids, continuation ids, continuation text): ``greedy`` (the reference backend's greedy
    operation), cut before specials and to whole characters."""
    from probes.align import _byte_vocab
    from reference.scoring import encode_prompt

    bv = _byte_vocab(ref.tokenizer)
    pids = list(encode_prompt(ref.tokenizer, prompt, chat=False))
    ids = list(greedy(pids, max_tokens, stop_at_eos=True))
    cut = next((i for i, t in enumerate(ids) if not bv.id_bytes.get(int(t))), len(ids))
    ids = ids[:cut]
    while ids:
        try:
            return pids, ids, b"".join(bv.id_bytes[int(t)] for t in ids).decode("utf-8")
        except UnicodeDecodeError:
            ids = ids[:-1]
    return pids, [], ""


def _pack_tokens(tokens: Sequence[TokenRecord]) -> list[dict[str, Any]]:
    return [{"t": t.token, "b": None if t.bytes is None else t.bytes.hex(), "lp": t.logprob,
             "alts": [[a, None if b is None else b.hex(), lp] for a, b, lp in t.top_logprobs],
             "an": list(t.anomalies)} for t in tokens]


def _unpack_tokens(rows: Sequence[Mapping[str, Any]]) -> list[TokenRecord]:
    def hx(h: Any) -> bytes | None:
        return None if h is None else bytes.fromhex(str(h))

    return [TokenRecord.model_construct(index=i, token=str(r.get("t", "")), bytes=hx(r.get("b")), logprob=r.get("lp"),
                                        top_logprobs=[(str(a[0]), hx(a[1]), a[2]) for a in r.get("alts") or []],
                                        anomalies=list(r.get("an") or []))
            for i, r in enumerate(rows)]


async def _send(config: ProviderConfig, bodies: Sequence[dict[str, Any]], transport: Any) -> list[Any]:
    from probes.client import ProbeClient

    async with ProbeClient(config, transport=transport) as client:
        return list(await asyncio.gather(*(client.send(b, key=f"reference-path-{i}", stream=False)
                                           for i, b in enumerate(bodies))))


def run_reference_path(config: ProviderConfig, ref: ReferenceSetup, prompts: Sequence[str], *,
                       transport: Any = None, max_tokens: int = REFERENCE_PATH_MAX_TOKENS) -> list[dict[str, Any]]:
    """Generate the reference continuations, send the echo requests, normalize each answer once.

    Returns:
        One JSON-able item per prompt with a continuation: ``prompt``, ``prompt_ids``,
        ``continuation_ids``, ``request``, ``ok``, ``error``, ``error_kind``, ``http_status``,
        ``anomalies`` and the echoed prompt ``tokens`` (packed records).
    """
    from probes.normalize import normalize_response

    k = min(REFERENCE_PATH_TOP, config.capabilities.max_top_logprobs)
    items: list[dict[str, Any]] = []
    bodies: list[dict[str, Any]] = []
    greedy = _greedy_fn(ref)
    for p in prompts:
        pids, cont, text = _continuation(p, ref, greedy, max_tokens)
        if len(cont) < 2:
            continue
        body = {**config.extra_body, "model": config.model, "prompt": p + text, "echo": True, "logprobs": k,
                "max_tokens": 1, "temperature": 0.0}
        body.pop("stream", None)
        items.append({"prompt": p, "prompt_ids": pids, "continuation_ids": cont, "request": body})
        bodies.append(body)
    results = asyncio.run(_send(config, bodies, transport)) if bodies else []
    for it, res in zip(items, results, strict=True):
        it.update(ok=bool(res.success), error=res.error, error_kind=res.error_kind, http_status=res.http_status,
                  anomalies=[], tokens=[])
        if res.success:
            norm = normalize_response("completions", it["request"], response=res.json,
                                      response_text=None if res.json is not None else res.response_text,
                                      max_top_logprobs=k)
            it["anomalies"] = list(norm.anomalies)
            it["tokens"] = _pack_tokens(norm.prompt_tokens)
    return items


# ------------------------------------------------------------------------------------------ evaluate
def align_echo(tokens: Sequence[TokenRecord], prompt: str, continuation_ids: Sequence[int],
               tokenizer: Any) -> list[tuple[int, int]]:
    """``(provider token index, continuation position)`` pairs where the echoed token covers exactly
    the bytes of one continuation token and maps 1:1 onto its id (every other position dropped)."""
    from probes.align import _byte_vocab, align_to_reference

    bv = _byte_vocab(tokenizer)
    start = len(prompt.encode("utf-8"))
    spans: dict[tuple[int, int], int] = {}
    for j, tid in enumerate(continuation_ids):
        b = bv.id_bytes.get(int(tid)) or b""
        spans[(start, start + len(b))] = j
        start += len(b)
    one = align_to_reference(list(tokens), bv).ref_token_ids
    out: list[tuple[int, int]] = []
    off = 0
    for i, t in enumerate(tokens):
        if t.bytes is None:
            break  # unknown bytes: every later offset is unknown
        s, off = off, off + len(t.bytes)
        pos = spans.get((s, off))
        rid = one[i]
        if pos is not None and off > s and rid is not None and int(rid) == int(continuation_ids[pos]):
            out.append((i, pos))
    return out


def evaluate_reference_path(items: Sequence[Mapping[str, Any]], ref: ReferenceSetup, store: Store) -> ReferencePath:
    """The statistic from stored items (see the module docstring, steps 4–5)."""
    from auditor.check.evidence import _alt_id
    from auditor.check.observations import Observation
    from auditor.check.reference_scoring import REFERENCE_TOP_K, score_observations
    from auditor.detectors import UNTRUSTED_LOGPROB_ANOMALIES, EvidenceBatch
    from auditor.detectors.logprob import margin_flip_stats
    from probes.align import _byte_vocab

    counts: dict[str, Any] = {"prompts": len(items), "sent": len(items),
                              "failed": sum(1 for it in items if not it.get("ok")),
                              "echo_ignored": sum(1 for it in items if it.get("ok") and not it.get("tokens")),
                              "failure_kinds": {}}
    for it in items:
        if not it.get("ok"):
            kind = str(it.get("error_kind") or "error")
            counts["failure_kinds"][kind] = counts["failure_kinds"].get(kind, 0) + 1
    usable = [it for it in items if it.get("ok") and it.get("tokens")]
    if not usable:
        why = (f"{ECHO_UNAVAILABLE} (echo ignored)" if counts["echo_ignored"] else
               "every echo request failed" if items else "no temperature-0 prompt with a reference continuation")
        return _unavailable(why, **counts, positions=0, dropped=0)
    bv = _byte_vocab(ref.tokenizer)
    obs = [Observation(probe_id=-1, probe_key=f"reference-path-{i}", mode=None, workload=None, temperature=0.0,
                       top_p=1.0, request={}, prompt_ids=list(it["prompt_ids"]), tokens=[],
                       ref_ids=[int(x) for x in it["continuation_ids"]], spans=[], one_to_one=[])
           for i, it in enumerate(usable)]
    scorer = next(iter(ref.scorers.values()))
    scored = score_observations(store, scorer, obs, top_k=REFERENCE_TOP_K)
    rows: list[tuple[int, TokenRecord, int]] = []
    dropped = 0
    for k, it in enumerate(usable):
        toks = _unpack_tokens(it["tokens"])
        pairs = align_echo(toks, str(it["prompt"]), it["continuation_ids"], ref.tokenizer)
        dropped += len(it["continuation_ids"]) - len(pairs)
        rows.extend((k, toks[i], j) for i, j in pairs)
    counts.update(positions=len(rows), dropped=dropped)
    if not rows:
        return _unavailable("no echoed position aligned with the reference's continuation", **counts)
    m = max(len(t.top_logprobs) for _, t, _ in rows) or 1
    kk = max(s.top_ids.shape[1] for s in scored)
    p_ids, p_lp = np.full((len(rows), m), -1, np.int64), np.full((len(rows), m), -np.inf)
    r_ids, r_lp = np.full((len(rows), kk), -1, np.int64), np.full((len(rows), kk), -np.inf)
    r_tok, p_tok, trusted, tids, pkeys = np.full(len(rows), np.nan), [], [], [], []
    for n, (k, t, j) in enumerate(rows):
        sc = scored[k]
        r_ids[n, : sc.top_ids.shape[1]], r_lp[n, : sc.top_ids.shape[1]] = sc.top_ids[j], sc.top_logprobs[j]
        r_tok[n] = sc.logprobs[j]
        c = 0
        for tok, b, lp in t.top_logprobs:
            aid = _alt_id(bv, tok, b)
            if aid is not None and lp is not None:
                p_ids[n, c], p_lp[n, c] = aid, float(lp)
                c += 1
        p_tok.append(t.logprob)
        trusted.append(not (set(t.anomalies or ()) & UNTRUSTED_LOGPROB_ANOMALIES))
        tids.append(int(usable[k]["continuation_ids"][j]))
        pkeys.append(obs[k].probe_key)
    batch = EvidenceBatch.from_arrays(
        prompt_ids=pkeys, token_ids=tids, temperatures=0.0, ref_top_ids=r_ids, ref_top_logprobs=r_lp,
        ref_token_logprobs=r_tok, provider_top_ids=p_ids, provider_top_logprobs=p_lp,
        provider_token_logprobs=np.asarray(p_tok, dtype=object), provider_trusted=np.asarray(trusted, bool))
    idx = np.flatnonzero(batch.provider_trusted & (batch.provider_listed >= 1))
    counts["positions"] = int(idx.size)
    if idx.size == 0:
        return _unavailable("no echoed position carried trusted alternatives", **counts)
    r = batch.reference()
    stats = margin_flip_stats(r.top_logprobs[idx], r.top_ids[idx, 0], batch.provider_top_ids[idx, 0],
                              batch.provider_top_logprobs[idx], r.at_provider_top[idx])
    stats["top1_agreement"] = float((batch.provider_top_ids[idx, 0] == r.top_ids[idx, 0]).mean())
    if stats.get("confident_flip_ratio") is None:
        return make_result(False, "the logit-noise scale could not be estimated on the echoed positions", stats, counts)
    return make_result(True, None, stats, counts)


# ------------------------------------------------------------------------------------------ stage
def reference_path_stage(store: Store, run_id: str, config: ProviderConfig, ref: ReferenceSetup, *,
                         run_requests: bool = True, transport: Any = None,
                         n_prompts: int = REFERENCE_PATH_PROMPTS) -> ReferencePath:
    """The pipeline stage: send (or re-read, on resume) the echo requests of ``run_id`` and compute
    the reference-path statistic. ``run_requests=False`` — or ``SPEC_AUDITOR_PREFLIGHT=0`` — sends
    nothing (offline re-analysis). Never raises on provider or reference errors (the test is then
    not available, with the reason)."""
    from auditor.store import queries as q

    if os.environ.get("SPEC_AUDITOR_PREFLIGHT", "1") == "0":
        run_requests = False
    why = static_reason(config, ref)
    if why is not None:
        return _unavailable(why)
    with store.session() as s:
        run = q.get_run(s, run_id)
        summary = dict((run.summary if run is not None else None) or {})
    try:
        if SUMMARY_KEY in summary:
            items = list(summary[SUMMARY_KEY].get("items") or [])
        elif run_requests:
            items = run_reference_path(config, ref, _prompts(store, run_id, n_prompts), transport=transport)
            with store.session() as s:
                run = q.get_run(s, run_id)
                cur = dict((run.summary if run is not None else None) or {})
                cur[SUMMARY_KEY] = {"items": items}
                q.update_run(s, run_id, summary=cur)
        else:
            return _unavailable("echo requests not sent (offline re-analysis)")
        return evaluate_reference_path(items, ref, store)
    except Exception as exc:  # a hostile provider or a failing reference must not end the audit
        return _unavailable(f"reference-path test failed: {exc!r}")
