"""Speed profile: TTFT, TPOT and output tokens/s per workload and concurrency, with the speculation
fingerprint per cell (``auditor speed --provider NAME``).

A buyer's question after "is it lossless" is "how fast on my workload, at my traffic". Each *cell*
is one workload suite (``code``, ``math``, ``chat``, ``repetition``; ``probes/suites``) at one
concurrency level (1, 4, 16 by default, capped by the provider's ``rate_limits.concurrency``): its
greedy prompts are streamed (``stream = true``, ``logprobs = true`` when the provider supports it
so that tokens per chunk are exact) and each response's timing is recorded.

Figures per cell (medians over successful responses; seconds):

- ``ttft_median_s`` — request start to the first token-bearing chunk;
- ``tpot_median_s`` — (latency − TTFT) / (output tokens − 1), the time per output token after the first;
- ``tokens_per_s_median`` — output tokens / latency of one request; ``throughput_tokens_per_s`` —
  all output tokens of the cell / the cell's wall time (what the provider delivers at that load);
- ``tpot_ratio_vs_chat`` — TPOT of chat over TPOT of this workload at the same concurrency
  (without speculation TPOT does not depend on the text, so a ratio well above 1 on repetition is
  speculation paying);
- ``speculation`` — :func:`auditor.detectors.speculation.estimate_speculation` over the cell.

The run is cheap and bounded: :func:`plan_speed` states the requests, the token budget (prompt
tokens estimated at 3 characters per token plus the chat template, completion tokens at
``max_tokens``) and its cost at the provider's list prices up front; ``budget_tokens`` caps it.
Results are stored as an ``audit_runs`` row of kind ``speed`` (``summary`` = :meth:`SpeedReport.to_dict`).
TTFT/TPOT definitions: vLLM benchmarks (``benchmarks/benchmark_serving.py``), MLPerf Inference LLM rules.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from auditor.detectors.speculation import StreamTiming, estimate_speculation
from probes.client import ProbeClient, ProbeResult
from probes.config import ProviderConfig
from probes.suites import WORKLOADS, Probe, load_suite
from probes.wire import build_payload

__all__ = [
    "DEFAULT_CONCURRENCY",
    "SpeedError",
    "SpeedPlan",
    "SpeedReport",
    "measure_speed",
    "plan_speed",
    "run_speed",
    "store_speed",
]

DEFAULT_CONCURRENCY = (1, 4, 16)
#: Characters per token assumed for the up-front prompt estimate (English ~4, code ~3: conservative).
_CHARS_PER_TOKEN = 3.0
#: Tokens added by a chat template per request (role markers, generation prompt).
_TEMPLATE_TOKENS = 16


class SpeedError(ValueError):
    """A speed run that cannot be planned (bad levels, budget too small); the message names the fix."""


@dataclass
class SpeedCell:
    """One (workload, concurrency) cell of the plan: the probes it sends, in order."""

    workload: str
    concurrency: int
    probes: list[Probe]


@dataclass
class SpeedPlan:
    """What a speed run will send and what it may cost (stated before anything is sent).

    Attributes:
        provider, model: the provider's name and model.
        workloads, concurrency: the grid (concurrency levels above the provider's limit dropped).
        requests_per_cell, max_tokens: per cell / per request.
        requests: total requests; prompt_tokens_est: estimated prompt tokens (tokens);
        completion_tokens_max: requests × max_tokens; budget_tokens: their sum (the cap);
        cost_usd_max: that budget at the provider's list prices (USD).
        notes: adjustments made (levels dropped, requests reduced to fit the budget).
    """

    provider: str
    model: str
    workloads: tuple[str, ...]
    concurrency: tuple[int, ...]
    requests_per_cell: dict[int, int]
    max_tokens: int
    cells: list[SpeedCell]
    prompt_tokens_est: int
    completion_tokens_max: int
    cost_usd_max: float
    notes: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return sum(len(c.probes) for c in self.cells)

    @property
    def budget_tokens(self) -> int:
        return self.prompt_tokens_est + self.completion_tokens_max

    def to_dict(self) -> dict:
        """JSON-ready summary (no probe texts)."""
        return {
            "provider": self.provider, "model": self.model, "workloads": list(self.workloads),
            "concurrency": list(self.concurrency),
            "requests_per_cell": {str(k): v for k, v in self.requests_per_cell.items()},
            "max_tokens": self.max_tokens, "requests": self.requests, "prompt_tokens_est": self.prompt_tokens_est,
            "completion_tokens_max": self.completion_tokens_max, "budget_tokens": self.budget_tokens,
            "cost_usd_max": self.cost_usd_max, "notes": list(self.notes),
        }


def _prompt_tokens_est(p: Probe) -> int:
    text = "".join(m.get("content", "") for m in p.chat_messages()) if p.messages else (p.prompt or "")
    return math.ceil(len(text) / _CHARS_PER_TOKEN) + _TEMPLATE_TOKENS


def _workload_probes(workload: str) -> list[Probe]:
    """Temperature-0 prompts of a workload (distinct prompts first; greedy before logprob)."""
    suite = load_suite(workload)
    ps = [p for p in suite.probes if p.workload == workload and p.temperature == 0.0]
    if not ps:
        raise SpeedError(f"suite {workload!r} has no temperature-0 probes of workload {workload!r}")
    seen, out = set(), []
    for p in sorted(ps, key=lambda p: p.mode != "greedy"):
        txt = str(p.messages or p.prompt)
        if txt not in seen:
            seen.add(txt)
            out.append(p)
    return out


def plan_speed(
    config: ProviderConfig,
    *,
    workloads: Sequence[str] = WORKLOADS,
    concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
    requests_per_cell: int | None = None,
    max_tokens: int = 64,
    budget_tokens: int | None = None,
) -> SpeedPlan:
    """Plan a speed run: the cells, requests, token budget and maximum cost.

    Args:
        config: the provider (its ``rate_limits.concurrency`` caps the levels; its ``pricing``
            prices the budget).
        workloads: suites to measure (each a workload name under ``probes/suites``).
        concurrency: levels (requests in flight); each cell sends ``max(level, requests_per_cell)``
            requests so the level is reached.
        requests_per_cell: requests per cell at least (default 4).
        max_tokens: completion budget per request (tokens, 8..4096).
        budget_tokens: cap on estimated prompt + maximum completion tokens; requests per cell are
            reduced (never below the level) to fit.

    Returns:
        SpeedPlan.

    Raises:
        SpeedError: unknown workload, bad level, or a budget below the smallest possible run
            (the message gives the minimum).
    """
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad or not workloads:
        raise SpeedError(f"workloads {bad or '(none)'}: use some of {', '.join(WORKLOADS)}")
    if any(int(c) < 1 for c in concurrency) or not concurrency:
        raise SpeedError(f"concurrency {list(concurrency)}: give levels >= 1, e.g. --concurrency 1,4,16")
    if not 8 <= max_tokens <= 4096:
        raise SpeedError(f"max_tokens={max_tokens}: use 8..4096 (TPOT needs several tokens per response)")
    if requests_per_cell is not None and requests_per_cell < 2:
        raise SpeedError(f"requests_per_cell={requests_per_cell}: use >= 2 (the interval needs several responses)")
    limit = config.rate_limits.concurrency
    notes = []
    levels = tuple(sorted({int(c) for c in concurrency if int(c) <= limit}))
    dropped = sorted({int(c) for c in concurrency if int(c) > limit})
    if dropped:
        notes.append(f"concurrency {dropped} above the provider's limit ({limit}) dropped")
    if not levels:
        levels = (limit,)
        notes.append(f"measuring at the provider's limit ({limit}) only")
    base = requests_per_cell or 4
    pools = {w: _workload_probes(w) for w in workloads}
    per_level = {c: max(c, base) for c in levels}

    def build() -> tuple[list[SpeedCell], int, int]:
        cells, ptok, ctok = [], 0, 0
        for c in levels:
            for w in workloads:
                pool = pools[w]
                ps = [pool[i % len(pool)] for i in range(per_level[c])]
                cells.append(SpeedCell(w, c, ps))
                ptok += sum(_prompt_tokens_est(p) for p in ps)
                ctok += max_tokens * len(ps)
        return cells, ptok, ctok

    cells, ptok, ctok = build()
    if budget_tokens is not None:
        while ptok + ctok > budget_tokens and any(per_level[c] > max(c, 2) for c in levels):
            c = max((c for c in levels if per_level[c] > max(c, 2)), key=lambda c: per_level[c])
            per_level[c] -= 1
            cells, ptok, ctok = build()
        if ptok + ctok > budget_tokens:
            raise SpeedError(f"budget_tokens={budget_tokens} is below the smallest run of this grid "
                             f"({ptok + ctok} tokens); raise --budget-tokens, lower --max-tokens or drop "
                             "high concurrency levels / workloads")
        if per_level != {c: max(c, base) for c in levels}:
            notes.append(f"requests per cell reduced to {per_level} to fit {budget_tokens} tokens")
    cost = config.pricing.cost_usd(ptok, ctok)
    return SpeedPlan(config.name, config.model, tuple(workloads), levels, per_level, max_tokens, cells, ptok, ctok,
                     cost, notes)


# -- measurement ----------------------------------------------------------------------------------

@dataclass
class CellResult:
    """Measured figures of one cell (see the module doc for definitions; seconds, tokens/s)."""

    workload: str
    concurrency: int
    n_ok: int
    n_failed: int
    ttft_median_s: float | None
    tpot_median_s: float | None
    tokens_per_s_median: float | None
    throughput_tokens_per_s: float | None
    wall_s: float
    prompt_tokens: int
    completion_tokens: int
    mean_tokens_per_chunk: float | None
    errors: list[str]
    speculation: dict
    tpot_ratio_vs_chat: float | None = None


@dataclass
class SpeedReport:
    """A finished speed run: the plan, the cells, the pooled fingerprint and the spend."""

    plan: SpeedPlan
    cells: list[CellResult]
    speculation: dict
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    wall_s: float
    run_id: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready summary (stored as ``audit_runs.summary`` of the ``speed`` run)."""
        c1 = [c for c in self.cells if c.concurrency == min(self.plan.concurrency) and c.tokens_per_s_median]
        return {
            "kind": "speed-profile",
            "plan": self.plan.to_dict(),
            "cells": [asdict(c) for c in self.cells],
            "speculation": self.speculation,
            "announced": {"budget_tokens": self.plan.budget_tokens, "cost_usd_max": self.plan.cost_usd_max},
            "actual": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                       "total_tokens": self.prompt_tokens + self.completion_tokens, "cost_usd": self.cost_usd},
            "tokens_per_s": statistics.median([c.tokens_per_s_median for c in c1 if c.tokens_per_s_median is not None])
            if c1 else None,
            "ttft_median_s": _median([c.ttft_median_s for c in c1]),
            "tpot_median_s": _median([c.tpot_median_s for c in c1]),
            "wall_s": self.wall_s,
        }


def _median(xs: Sequence[float | None]) -> float | None:
    v = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(v) if v else None


def _n_tokens(r: ProbeResult) -> int:
    u = r.usage or {}
    n = u.get("completion_tokens") if isinstance(u, dict) else None
    return int(n) if isinstance(n, int) and n >= 0 else int(sum(r.tokens_per_chunk))


def _prompt_tokens(r: ProbeResult, est: int) -> int:
    u = r.usage or {}
    n = u.get("prompt_tokens") if isinstance(u, dict) else None
    return int(n) if isinstance(n, int) and n >= 0 else est


def summarize_cell(workload: str, concurrency: int, results: Sequence[ProbeResult], wall_s: float,
                   prompt_est: Sequence[int], *, seed: int = 0) -> CellResult:
    """Figures of one cell from its responses (failed ones counted, never raised)."""
    ok = [r for r in results if r.success and r.ttft_s is not None and r.tokens_per_chunk]
    errors = sorted({(r.error or "no streamed tokens")[:120] for r in results if r not in ok})
    ttft = [r.ttft_s for r in ok]
    tpot, tps = [], []
    for r in ok:
        n = _n_tokens(r)
        if n >= 2 and r.latency_s > r.ttft_s:  # type: ignore[operator]
            tpot.append((r.latency_s - r.ttft_s) / (n - 1))  # type: ignore[operator]
        if r.latency_s > 0:
            tps.append(n / r.latency_s)
    comp = sum(_n_tokens(r) for r in results if r.success)
    prompt = sum(_prompt_tokens(r, e) for r, e in zip(results, prompt_est, strict=True) if r.success)
    chunks = sum(len(r.tokens_per_chunk) for r in ok)
    streams = [StreamTiming(r.chunk_gaps_s, r.tokens_per_chunk, workload, _n_tokens(r), r.ttft_s, r.key) for r in ok]
    spec = estimate_speculation(streams, seed=seed, n_boot=1000).to_dict()
    return CellResult(
        workload, concurrency, len(ok), len(results) - len(ok), _median(ttft), _median(tpot), _median(tps),
        (sum(_n_tokens(r) for r in ok) / wall_s) if wall_s > 0 and ok else None, wall_s, prompt, comp,
        (sum(_n_tokens(r) for r in ok) / chunks) if chunks else None, errors, spec,
    )


async def _run_cell(config: ProviderConfig, cell: SpeedCell, max_tokens: int, logprobs: bool,
                    on_request: Callable[[ProbeResult], None] | None = None) -> tuple[list[ProbeResult], float]:
    cfg = config.model_copy(update={"rate_limits": config.rate_limits.model_copy(update={"concurrency": cell.concurrency})})
    jobs = []
    for i, p in enumerate(cell.probes):
        body = build_payload(cfg.api, p, cfg, sample=0, stream=True)
        body["max_tokens"] = max_tokens
        body.pop("top_logprobs", None)
        body.pop("logprobs", None)
        if logprobs:
            body["logprobs"] = True if cfg.api == "chat" else 0
        jobs.append((f"{p.id}@c{cell.concurrency}#{i}", body))
    t0 = time.perf_counter()
    out: list[ProbeResult] = []
    async with ProbeClient(cfg) as client:
        async for r in client.map(jobs):
            out.append(r)
            if on_request is not None:
                on_request(r)
    order = {k: i for i, (k, _) in enumerate(jobs)}
    out.sort(key=lambda r: order.get(r.key, 0))
    return out, time.perf_counter() - t0


def measure_speed(plan: SpeedPlan, config: ProviderConfig, *, logprobs: bool | None = None,
                  on_cell: Callable[[CellResult], None] | None = None,
                  on_request: Callable[[ProbeResult], None] | None = None, seed: int = 0) -> SpeedReport:
    """Run every cell of ``plan`` in order (blocking; one asyncio loop per cell).

    Args:
        plan: from :func:`plan_speed`.
        config: the same provider.
        logprobs: ask ``logprobs`` (exact tokens per chunk); default the provider's capability.
        on_cell: called after each cell; on_request: after each response (progress).
        seed: bootstrap seed of the fingerprints.

    Returns:
        SpeedReport (the pooled fingerprint uses the lowest concurrency level's responses).
    """
    lp = config.capabilities.logprobs if logprobs is None else bool(logprobs)
    t0 = time.perf_counter()
    cells, pooled = [], []
    for cell in plan.cells:
        results, wall = asyncio.run(_run_cell(config, cell, plan.max_tokens, lp, on_request))
        res = summarize_cell(cell.workload, cell.concurrency, results, wall,
                             [_prompt_tokens_est(p) for p in cell.probes], seed=seed)
        cells.append(res)
        if cell.concurrency == min(plan.concurrency):
            pooled += [StreamTiming(r.chunk_gaps_s, r.tokens_per_chunk, cell.workload, _n_tokens(r), r.ttft_s, r.key)
                       for r in results if r.success and r.tokens_per_chunk]
        if on_cell is not None:
            on_cell(res)
    chat = {c.concurrency: c.tpot_median_s for c in cells if c.workload == "chat"}
    for c in cells:
        ref = chat.get(c.concurrency)
        if ref and c.tpot_median_s:
            c.tpot_ratio_vs_chat = ref / c.tpot_median_s
    ptok = sum(c.prompt_tokens for c in cells)
    ctok = sum(c.completion_tokens for c in cells)
    spec = estimate_speculation(pooled, seed=seed).to_dict()
    return SpeedReport(plan, cells, spec, ptok, ctok, config.pricing.cost_usd(ptok, ctok), time.perf_counter() - t0)


def store_speed(report: SpeedReport, config: ProviderConfig, db_url: str | None = None) -> str:
    """Store the run as an ``audit_runs`` row of kind ``speed`` (summary = ``report.to_dict()``,
    token counts and spend in the run's columns); returns the run id."""
    from auditor.store import open_store
    from auditor.store import queries as q

    store = open_store(db_url)
    with store.session() as s:
        q.upsert_provider_config(s, config)
        run = q.create_run(s, provider_name=config.name, kind="speed", model=config.model, suite="speed-profile",
                           config_snapshot=config.model_dump(mode="json"), budget_tokens=report.plan.budget_tokens)
        q.add_run_usage(s, run.id, report.prompt_tokens, report.completion_tokens, report.cost_usd)
        q.update_run(s, run.id, summary=report.to_dict())
        q.set_run_status(s, run.id, "completed")
        run_id = run.id
    report.run_id = run_id
    return run_id


def run_speed(config: ProviderConfig, *, db_url: str | None = None, store: bool = True, **plan_kwargs: object) -> SpeedReport:
    """Plan, measure and (by default) store a speed run; see :func:`plan_speed` for ``plan_kwargs``."""
    plan = plan_speed(config, **plan_kwargs)  # type: ignore[arg-type]
    report = measure_speed(plan, config)
    if store:
        store_speed(report, config, db_url)
    return report
