"""Deterministic demo data for the dashboard tests (test-only; not shipped in the package).

:func:`seed_demo` writes three simulated providers with several audit runs each — runs,
probes with raw responses and stream timing, normalized tokens, detector results (with
token-level evidence), verdicts and calibration rows — shaped exactly like what the ``check``
pipeline stores, so the dashboard can be built and tested before the pipeline exists.

The three providers mirror the simulator profiles the demo uses:

- ``sim-honest``: original precision, strict speculative verification → PASS every time.
- ``sim-int4``: PASS twice, then silently quantized (the May-quantization story) →
  QUANTIZATION: KL far above the noise floor, a verdict change.
- ``sim-relaxed``: lossy (relaxed) speculative verification → RELAXED_VERIFICATION: greedy
  clear mismatches where the reference margin is large, big tokens-per-chunk; one failed run.

Figures are made up but internally consistent (units: tokens/s, seconds, nats, USD). One
provider token is a hostile HTML string (``<img src=x onerror=alert(1)>``) so tests can check
that provider-controlled text is rendered escaped.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from auditor.check.stored_figures import store_figures
from auditor.store import models as orm

__all__ = ["DEMO_PROVIDERS", "HOSTILE_MARKUP", "HOSTILE_TOKEN", "seed_demo"]

#: A provider-controlled token that must never be rendered as HTML.
HOSTILE_TOKEN = "<img src=x onerror=alert(1)>"
#: A second provider-controlled token carrying every other kind of active markup (issue 38, item 9): a
#: script, a remote image (the port is closed: a fetch would show in the browser's requests), a
#: ``javascript:`` link and raw HTML. Shown as text on every page, never executed or fetched.
HOSTILE_MARKUP = ("<script>window.__pwned=1</script>![x](http://127.0.0.1:9/pwned.png)"
                  "[click](javascript:window.__pwned=2)<b onmouseover=alert(3)>hi</b>")

#: name → (verdict per run, oldest first; None = failed run), speed/fidelity profile.
DEMO_PROVIDERS: dict[str, dict[str, Any]] = {
    "sim-honest": {
        "verdicts": ["PASS", "PASS", "PASS", "PASS"],
        "tokens_per_s": 96.0,
        "mean_kl": 0.0041,
        "clear_mismatch_rate": 0.0,
        "ttft_s": 0.085,
        "tpot_s": 0.0104,
        "chunk_weights": [0.35, 0.25, 0.2, 0.12, 0.08],  # tokens per chunk 1..5 (lossless spec)
        "usd_per_1m": (0.10, 0.30),
    },
    "sim-int4": {
        "verdicts": ["PASS", "PASS", "QUANTIZATION", "QUANTIZATION"],
        "tokens_per_s": 158.0,
        "mean_kl": 0.094,
        "clear_mismatch_rate": 0.004,
        "ttft_s": 0.061,
        "tpot_s": 0.0063,
        "chunk_weights": [1.0],
        "usd_per_1m": (0.05, 0.15),
    },
    "sim-relaxed": {
        "verdicts": ["RELAXED_VERIFICATION", None, "RELAXED_VERIFICATION", "RELAXED_VERIFICATION"],
        "tokens_per_s": 214.0,
        "mean_kl": 0.021,
        "clear_mismatch_rate": 0.062,
        "ttft_s": 0.072,
        "tpot_s": 0.0047,
        "chunk_weights": [0.1, 0.12, 0.18, 0.25, 0.35],
        "usd_per_1m": (0.08, 0.24),
    },
}

_MODEL = "smollm2-135m-instruct"
_NOISE_FLOOR = 0.0052  # nats, honest-vs-honest mean KL at this budget
_SUITE, _SUITE_VERSION = "core", "1"
_REASONS = {
    "PASS": "No detector rejected at alpha=0.01 after Holm correction; KL within the noise floor.",
    "QUANTIZATION": "logprob-kl: mean KL {kl:.3f} nats vs noise floor {floor:.4f} (p_adj={p:.1e}); "
    "greedy clear mismatches rare: consistent with reduced precision, not relaxed verification.",
    "RELAXED_VERIFICATION": "greedy-match: {rate:.1%} clear mismatches where the reference margin "
    "exceeds 2 nats (p_adj={p:.1e}); chunk sizes show speculative decoding.",
}
_PROMPTS = [
    (
        "arith",
        "What is 17 + 25? Explain briefly.",
        (
            " The answer is 42. Adding 17 and 25 gives 42 because 7 plus 5 is 12, so we carry"
            " the 1 and add 1 plus 2 plus 1 which is 4."
        ),
    ),
    (
        "capital",
        "Name the capital of France and say one fact about it.",
        (
            " Paris is the capital of France. It is known for the Eiffel Tower, which was built"
            " for the World Fair in 1889 and is now one of the most visited monuments."
        ),
    ),
    (
        "code",
        "Write a Python function that squares a number.",
        (
            " Here is a simple function: def square(x): return x ** 2 and you can call it with"
            " square(3) to get 9 as the result."
        ),
    ),
    (
        "story",
        "Continue: Once upon a time",
        (
            " there was a small robot who loved to read books. Every night it climbed the tall"
            " shelf in the library and read until the sun came up over the hills."
        ),
    ),
]
_ALT = [" the", " a", " is", ",", ".", " and", " of", " to", " in", " it"]


def _split_tokens(text: str) -> list[str]:
    return re.findall(r"\s?[^\s]+", text)


def _chunks(rng: random.Random, n_tokens: int, weights: list[float]) -> list[int]:
    sizes: list[int] = []
    left = n_tokens
    while left > 0:
        k = rng.choices(range(1, len(weights) + 1), weights=weights)[0]
        k = min(k, left)
        sizes.append(k)
        left -= k
    return sizes


def _chat_body(text: str, tokens: list[str], logprobs: list[float], model: str, usage: dict) -> str:
    body = {
        "id": "chatcmpl-demo",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": {
                    "content": [
                        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                        for t, lp in zip(tokens, logprobs, strict=True)
                    ]
                },
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
    }
    return json.dumps(body, indent=1)


def seed_demo(
    session: Session,
    *,
    now: dt.datetime | None = None,
    seed: int = 0,
    runs_every_days: float = 3.0,
    calibration: bool = True,
) -> dict[str, Any]:
    """Insert the demo providers, runs and calibration rows into ``session`` (flushes, no commit).

    Args:
        session: an open session on a migrated database (the caller commits).
        now: time of the newest runs (aware UTC; default: now, rounded down to the minute).
            Older runs are ``runs_every_days`` days apart.
        seed: seed of the jitter applied to figures (same seed → same database content).
        runs_every_days: spacing of the runs of one provider, days.
        calibration: also insert ``calibration_results`` rows.

    Returns:
        ``{"providers": [names], "runs": {name: [run_id, ...] oldest first},
        "latest_verdicts": {name: verdict}, "changes": [(name, previous, new, run_id)]}``.
    """
    rng = random.Random(seed)
    if now is None:
        now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    elif now.tzinfo is None:
        now = now.replace(tzinfo=dt.UTC)
    out: dict[str, Any] = {"providers": [], "runs": {}, "latest_verdicts": {}, "changes": []}
    vocab: dict[str, int] = {}

    def tid(text: str) -> int:
        """A made-up reference token id per token text (stands in for the tokenizer)."""
        return vocab.setdefault(text, 1000 + len(vocab))

    for p_index, (name, prof) in enumerate(DEMO_PROVIDERS.items()):
        provider = orm.Provider(
            name=name,
            base_url=f"http://127.0.0.1:{8101 + p_index}/v1",
            model=_MODEL,
            api="chat",
            config_json={"name": name, "model": _MODEL, "api_key_env": None, "timeout_s": 60},
            created_at=now - dt.timedelta(days=30),
            updated_at=now - dt.timedelta(days=30),
        )
        session.add(provider)
        session.flush()
        out["providers"].append(name)
        out["runs"][name] = []
        previous: str | None = None
        n_runs = len(prof["verdicts"])
        for r_index, verdict in enumerate(prof["verdicts"]):
            started = now - dt.timedelta(days=runs_every_days * (n_runs - 1 - r_index), minutes=7 * p_index)
            run_id = _seed_run(session, rng, tid, provider, name, prof, verdict, started)
            out["runs"][name].append(run_id)
            if verdict is not None:
                if previous is not None and verdict != previous:
                    out["changes"].append((name, previous, verdict, run_id))
                previous = verdict
        out["latest_verdicts"][name] = previous
    session.flush()
    for run_id in (rid for rids in out["runs"].values() for rid in rids):
        run = session.get(orm.AuditRun, run_id)
        if run is not None and run.verdict:
            store_figures(session, run_id)  # as the check pipeline does when it stores a verdict
    if calibration:
        for profile, rate, cause in (
            ("honest", 0.008, None),
            ("int4", 0.97, 0.95),
            ("int8", 0.41, 0.88),
            ("relaxed-threshold-0.3", 0.99, 0.97),
        ):
            audits = 200
            half = 1.96 * (rate * (1 - rate) / audits) ** 0.5 + 0.5 / audits
            session.add(
                orm.CalibrationResult(
                    model=_MODEL,
                    profile=profile,
                    budget_tokens=20000,
                    audits=audits,
                    rejection_rate=rate,
                    ci_low=max(0.0, rate - half),
                    ci_high=min(1.0, rate + half),
                    cause_correct_rate=cause,
                    details={"alpha": 0.01, "method": "wilson"},
                    created_at=now - dt.timedelta(days=1),
                )
            )
    session.flush()
    return out


def _seed_run(
    session: Session,
    rng: random.Random,
    tid: Callable[[str], int],
    provider: orm.Provider,
    name: str,
    prof: dict[str, Any],
    verdict: str | None,
    started: dt.datetime,
) -> str:
    # A provider quantized only from its first QUANTIZATION verdict on: earlier runs were honest.
    degraded = verdict not in (None, "PASS")
    jitter = lambda x, rel=0.08: x * (1.0 + rng.uniform(-rel, rel))
    kl = jitter(prof["mean_kl"]) if degraded or name == "sim-honest" else jitter(0.0045)
    mismatch = prof["clear_mismatch_rate"] if degraded else 0.0
    tps = jitter(prof["tokens_per_s"] if degraded or name == "sim-honest" else 97.0, 0.05)
    chunk_w = (
        prof["chunk_weights"] if degraded or name == "sim-honest" else DEMO_PROVIDERS["sim-honest"]["chunk_weights"]
    )
    failed = verdict is None
    run = orm.AuditRun(
        provider_id=provider.id,
        provider_name=name,
        model=_MODEL,
        kind="audit",
        suite=_SUITE,
        suite_version=_SUITE_VERSION,
        code_version="0.1.0",
        reference_model=_MODEL,
        reference_revision="3f2a9c1d0b7e4a55",
        reference_dtype="float32",
        config_snapshot=dict(provider.config_json),
        status="failed" if failed else "completed",
        verdict=verdict,
        verdict_reason=None,
        alpha=0.01,
        budget_tokens=20000,
        started_at=started,
        finished_at=started + dt.timedelta(minutes=4, seconds=rng.randint(0, 50)),
    )
    session.add(run)
    session.flush()

    usd_in, usd_out = prof["usd_per_1m"]
    prompt_tokens = completion_tokens = 0
    all_chunks: list[int] = []
    evidence_tokens: list[dict[str, Any]] = []
    probes = _PROMPTS[:2] if failed else _PROMPTS
    for j, (pid, prompt, answer) in enumerate(probes):
        mode = ("greedy", "greedy", "logprob", "sampling")[j]
        tokens = _split_tokens(answer)
        # The relaxed provider swaps a token where the reference is confident.
        swap_at = None
        if degraded and name == "sim-relaxed" and mode == "greedy":
            swap_at = min(3 + 6 * j, len(tokens) - 1)
            if j:
                rng.choice(_ALT)  # drawn as before (the second swap was an ordinary word), so later figures stay
            swap = HOSTILE_TOKEN if j == 0 else HOSTILE_MARKUP
            ref_tok = tokens[swap_at]
            tokens = tokens[:swap_at] + [swap] + tokens[swap_at + 1 :]
            margin = round(rng.uniform(2.4, 5.0), 3)
            top1 = -round(rng.uniform(0.01, 0.08), 4)
            ref_top5 = [[tid(ref_tok), top1], [tid(swap), round(top1 - margin, 4)]]
            ref_top5 += [[tid(alt), round(top1 - margin - 0.5 * (k + 1), 4)] for k, alt in enumerate(_ALT[:3])]
            evidence_tokens.append(
                {
                    "prompt_id": f"{pid}-01#0",
                    "position": swap_at,
                    "token_id": tid(swap),
                    "token": swap,
                    "ref_top5": ref_top5,
                    "ref_margin": margin,
                    "ref_token_logprob": round(top1 - margin, 4),
                    "provider_top5": [[tid(swap), -0.02], [tid(ref_tok), -4.1]],
                    "provider_token_logprob": -0.02,
                    "gap": margin,
                    "margin": margin,
                    "clear": True,
                }
            )
        logprobs = [round(-abs(rng.gauss(0.05, 0.08)), 4) for _ in tokens]
        text = "".join(tokens)
        n_prompt = len(prompt.split()) + 12
        usage = {"prompt_tokens": n_prompt, "completion_tokens": len(tokens), "total_tokens": n_prompt + len(tokens)}
        prompt_tokens += n_prompt
        completion_tokens += len(tokens)
        stream = mode != "sampling"
        probe = orm.Probe(
            run_id=run.id,
            probe_key=f"{pid}-01#0",
            workload=pid,
            mode=mode,
            request_json={
                "model": _MODEL,
                "messages": [{"role": "user", "content": prompt}],
                "temperature": 0.0 if mode != "sampling" else 1.0,
                "max_tokens": 32,
                "logprobs": True,
                "top_logprobs": 5 if mode == "logprob" else 0,
                "stream": stream,
            },
            status="failed" if failed and j == 1 else "done",
            n_attempts=1,
            text=text,
            finish_reason="stop",
            anomalies=["logprobs_missing"] if failed else [],
            usage=usage,
            created_at=started,
            completed_at=started + dt.timedelta(seconds=2 + j),
        )
        session.add(probe)
        session.flush()
        chunks = _chunks(rng, len(tokens), chunk_w) if stream else None
        if chunks:
            all_chunks.extend(chunks)
        ttft = jitter(prof["ttft_s"], 0.2)
        session.add(
            orm.ProbeAttempt(
                probe_id=probe.id,
                run_id=run.id,
                attempt_no=1,
                started_at=started + dt.timedelta(seconds=1 + j),
                latency_s=round(ttft + len(tokens) / tps, 4),
                http_status=503 if (failed and j == 1) else 200,
                error="HTTP 503: upstream overloaded" if (failed and j == 1) else None,
                response_text=(
                    '{"error": {"message": "upstream overloaded", "code": 503}}'
                    if (failed and j == 1)
                    else _chat_body(text, tokens, logprobs, _MODEL, usage)
                ),
                ttft_s=round(ttft, 4) if stream else None,
                chunk_gaps_s=[round(k / tps, 4) for k in chunks] if chunks else None,
                tokens_per_chunk=chunks,
            )
        )
        for pos, (tok, lp) in enumerate(zip(tokens, logprobs, strict=True)):
            top = [[tok, lp]] + [[alt, round(lp - 1.5 - k, 4)] for k, alt in enumerate(_ALT[:4])]
            session.add(
                orm.NormalizedToken(
                    probe_id=probe.id,
                    position=pos,
                    token=tok,
                    token_bytes=tok.encode(),
                    logprob=lp,
                    top_logprobs=top if mode == "logprob" else [],
                    ref_token_id=tid(tok),
                    anomalies=[],
                )
            )

    run.prompt_tokens = prompt_tokens
    run.completion_tokens = completion_tokens
    run.cost_usd = round(prompt_tokens * usd_in / 1e6 + completion_tokens * usd_out / 1e6, 8)
    if failed:
        run.summary = {"error": "3 of 4 probes failed (HTTP 503)"}
        return run.id

    hist: dict[str, int] = {}
    for k in all_chunks:
        hist[str(k)] = hist.get(str(k), 0) + 1
    tpot = 1.0 / tps
    run.summary = {
        "tokens_per_s": round(tps, 2),
        "ttft_median_s": round(jitter(prof["ttft_s"], 0.1), 4),
        "tpot_median_s": round(tpot, 5),
        "mean_kl": round(kl, 5),
        "noise_floor": _NOISE_FLOOR,
        "clear_mismatch_rate": round(mismatch, 4),
        "tokens_per_chunk": hist,
        "n_probes": len(probes),
    }

    # Detector results: p-values consistent with the verdict.
    quant = verdict == "QUANTIZATION"
    relaxed = verdict == "RELAXED_VERIFICATION"
    p_greedy = 10 ** -rng.uniform(7, 9) if relaxed else rng.uniform(0.2, 0.95)
    p_kl = 10 ** -rng.uniform(8, 11) if quant else (10 ** -rng.uniform(2.5, 3.5) if relaxed else rng.uniform(0.1, 0.9))
    p_gof = 10 ** -rng.uniform(3, 5) if (quant or relaxed) else rng.uniform(0.05, 0.9)
    p_self = rng.uniform(0.1, 0.9)
    kl_evidence = []
    if quant:
        for pos in sorted(rng.sample(range(1, 12), 3)):
            top1 = -round(rng.uniform(0.2, 0.6), 3)
            story = _split_tokens(_PROMPTS[3][2])
            ref_top5 = [[tid(story[pos]), top1]] + [
                [tid(t), round(top1 - 0.7 * (i + 1), 3)] for i, t in enumerate(_ALT[:4])
            ]
            kl_evidence.append(
                {
                    "prompt_id": "story-01#0",
                    "position": pos,
                    "token_id": tid(story[pos]),
                    "token": story[pos],
                    "ref_top5": ref_top5,
                    "ref_margin": 0.7,
                    "provider_top5": [[tid(story[pos]), round(top1 + 0.25, 3)], [tid(_ALT[0]), round(top1 - 1.6, 3)]],
                    "kl": round(rng.uniform(0.15, 0.4), 4),
                    "margin": 0.7,
                }
            )
    raw = [
        ("greedy-match", float(len(evidence_tokens)), p_greedy, mismatch, 48, evidence_tokens),
        ("logprob-kl", kl / _NOISE_FLOOR, p_kl, kl - _NOISE_FLOOR, 64, kl_evidence),
        (
            "sampling-gof",
            rng.uniform(20, 60) if (quant or relaxed) else rng.uniform(2, 12),
            p_gof,
            rng.uniform(0.01, 0.2),
            200,
            [],
        ),
        ("self-consistency", rng.uniform(0, 2), p_self, rng.uniform(-0.01, 0.01), 32, []),
    ]
    m = len(raw)
    # Holm step-down adjusted p-values.
    order = sorted(range(m), key=lambda i: raw[i][2])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * raw[i][2]))
        adjusted[i] = running
    for i, (dname, stat, p, eff, n, ev) in enumerate(raw):
        session.add(
            orm.DetectorResultRow(
                run_id=run.id,
                name=dname,
                statistic=round(stat, 4),
                p_value=p,
                p_adjusted=adjusted[i],
                effect=round(eff, 5),
                effect_ci_low=round(eff - abs(eff) * 0.3 - 0.001, 5),
                effect_ci_high=round(eff + abs(eff) * 0.3 + 0.001, 5),
                n=n,
                ran=True,
                reason=None,
                evidence=ev,
            )
        )
    p_min = min(adjusted)
    reason = _REASONS[verdict].format(kl=kl, floor=_NOISE_FLOOR, p=p_min, rate=mismatch)
    run.verdict_reason = reason
    session.add(
        orm.VerdictRow(
            run_id=run.id,
            verdict=verdict,
            reason=reason,
            details={
                "alpha": 0.01,
                "holm": True,
                "rejected": [r[0] for r, a in zip(raw, adjusted, strict=True) if a < 0.01],
            },
            created_at=run.finished_at,
        )
    )
    return run.id
