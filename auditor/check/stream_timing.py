"""Stream timing of a run (stage 9s of ``auditor check``, between detection and the verdict): TTFT,
TPOT, tokens/s and tokens per stream chunk from the run's final successful attempts, with the
speculation fingerprint (:func:`auditor.detectors.speculation.estimate_speculation`) that the verdict
reads (rule 4, issue 37 item 8) and the summary stores.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import TYPE_CHECKING, Any

from auditor.detectors.speculation import StreamTiming, estimate_speculation

if TYPE_CHECKING:  # pragma: no cover
    from sqlalchemy.orm import Session

    from auditor.store import Store
    from auditor.store.models import ProbeAttempt

__all__ = ["speed_summary"]


def _final_attempts(session: Session, run_id: str) -> dict[int, ProbeAttempt]:
    """probe_id → its last successful attempt."""
    from sqlalchemy import select

    from auditor.store.models import ProbeAttempt

    out: dict[int, ProbeAttempt] = {}
    rows = session.scalars(
        select(ProbeAttempt)
        .where(ProbeAttempt.run_id == run_id, ProbeAttempt.error.is_(None))
        .order_by(ProbeAttempt.probe_id, ProbeAttempt.attempt_no)
    )
    for a in rows:
        out[a.probe_id] = a
    return out


def speed_summary(store: Store, run_id: str) -> dict[str, Any]:
    """Speed figures of a run from its final successful attempts.

    Returns a dict with ``ttft_median_s`` (s, streamed requests), ``tpot_median_s`` (s per output
    token after the first: (latency − TTFT)/(tokens − 1), streamed requests with ≥ 2 tokens),
    ``tokens_per_s`` (Σ completion tokens / Σ request latency), ``latency_median_s``,
    ``tokens_per_chunk`` ({tokens in a stream chunk: chunks}) and ``mean_tokens_per_chunk``
    (> 1 means the server releases several tokens per step: speculative decoding), and
    ``speculation`` (the fingerprint of :func:`auditor.detectors.speculation.estimate_speculation`:
    ``{detected, mean_accepted_tokens_per_step, ci95, evidence}``). Missing measurements are None.
    """
    from auditor.store import queries as q

    ttft, tpot, lat = [], [], []
    tok_sum, lat_sum = 0, 0.0
    chunks: Counter[int] = Counter()
    streams: list[StreamTiming] = []  # speculation fingerprint (auditor.detectors.speculation)
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
            if a.tokens_per_chunk:
                streams.append(StreamTiming(list(a.chunk_gaps_s or []), list(a.tokens_per_chunk), p.workload, n_tok,
                                            a.ttft_s, p.probe_key))
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
        "speculation": estimate_speculation(streams).to_dict(),
    }
