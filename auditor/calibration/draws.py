"""Audits resampled from a pool: probe mixes, budget-faithful draws, evidence and the verdict.

An audit at budget B draws requests from the pool without replacement in the proportions of a
probe mix (:class:`AuditMix`), charging each request its ``max_tokens`` exactly as ``auditor check
--budget-tokens`` does (:class:`AuditDrawer`), builds the detectors' evidence
(:func:`evidence_for`) and decides with the pipeline's own functions (:func:`audit_verdict`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from auditor.check.run_detectors import run_reference_detectors
from auditor.detectors import DetectorName, EvidenceBatch
from auditor.verdict.decide import decide_verdict
from auditor.verdict.kinds import Verdict
from auditor.verdict.power import DEFAULT_POWER, power_effect
from auditor.verdict.precision_estimate import estimate_precision, profile_precision
from probes.suites import load_suite

if TYPE_CHECKING:
    from auditor.calibration.pool import Pool
    from auditor.check.measured_floors import FloorSet

__all__ = [
    "DEFAULT_AUDITS",
    "DEFAULT_BUDGETS",
    "MODES",
    "SPAN_NAMED",
    "AuditDraw",
    "AuditDrawer",
    "AuditMix",
    "AuditOutcome",
    "audit_verdict",
    "default_mix",
    "draw_audit",
    "evidence_for",
    "floor_references",
    "run_audits",
    "span_tokens",
    "verdict_estimate",
]

#: Completion-token budgets per audit and resampled audits per cell of the benchmark.
DEFAULT_BUDGETS = (100, 300, 1000, 3000)
DEFAULT_AUDITS = 200
#: Probe modes: greedy and logprob are temperature-0 requests, sampling temperature 1.
MODES = ("greedy", "logprob", "sampling")


@dataclass(frozen=True)
class AuditMix:
    """How an audit of B planned tokens is spent, per probe mode (as ``auditor.check.planning.plan_budget`` does).

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
    s = load_suite(suite)
    tok: Counter = Counter()
    m: dict[str, int] = dict.fromkeys(MODES, 0)
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

    Budget semantics are ``auditor check --budget-tokens``'s (``auditor.check.planning.plan_budget``): a
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
        self.tokens = dict.fromkeys(MODES, 0)
        self.planned = dict.fromkeys(MODES, 0)
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


def evidence_for(pool: Pool, draw: AuditDraw, mix: AuditMix, reference: str = "float32") -> EvidenceBatch:
    """The detectors' :class:`~auditor.detectors.EvidenceBatch` for one drawn audit.

    Each item is one probe (``prompt_id`` = its request key, so positions of one continuation are
    grouped as the detectors expect); the provider's top list is cut to the mode's
    ``top_logprobs`` width and its token logprob dropped when the mode asks for none. In a
    reasoning-mode pool (``pool.token_span``) every position carries its span (``reasoning`` /
    ``answer``) and its stream step (``pool.step_final``), and the close tag's positions are left out,
    as ``auditor.check.evidence.build_evidence`` leaves out think tags; a plain pool's batch has neither.

    Args:
        reference: which reference precision's rows to use (a key of ``pool.ref_top_ids``).

    Raises:
        KeyError: the pool was not scored with that reference.
    """
    if reference not in pool.ref_top_ids:
        raise KeyError(f"pool {pool.profile!r} has no {reference!r} reference rows (has {pool.references})")
    items = np.array([i for i, *_ in draw.items], np.int64)
    lens = np.array([n for _, n, *_ in draw.items], np.int64)
    first = np.repeat(np.cumsum(lens) - lens, lens)  # each position's item starts here in the batch
    within = np.arange(int(lens.sum())) - first  # position within its item (continuation)
    sel = np.repeat(pool.item_offsets[items].astype(np.int64), lens) + within  # pool rows
    pids = np.repeat(np.array([str(pool.item_keys[i]) + (f"~{rnd}" if rnd else "") for i, _, _, rnd in draw.items],
                              dtype=object), lens)
    w = np.repeat(np.array([int(mix.top_m.get(mode, 0)) for _, _, mode, _ in draw.items], np.int64), lens)
    M = int(w.max()) if w.size else 0
    p_ids = pool.prov_top_ids[sel, :M].copy()
    p_lp = pool.prov_top_lp[sel, :M].copy()
    if M:
        cut = np.arange(M)[None, :] >= w[:, None]
        p_ids[cut] = -1
        p_lp[cut] = -np.inf
    p_tok = np.where(w > 0, pool.prov_logprob[sel], np.nan)
    temps = np.repeat(pool.item_temperature[items], lens)
    extra: dict = {}
    if pool.token_span is not None:  # reasoning mode: span labels and stream steps; no close-tag position
        keep = pool.token_span[sel] != "close"
        pids, within, sel, p_ids, p_lp, p_tok, temps = (a[keep] for a in (pids, within, sel, p_ids, p_lp, p_tok, temps))
        spans = pool.token_span[sel].astype(object)
        extra["token_spans"] = spans if (spans == "reasoning").any() else None
        if pool.step_final is not None and np.isfinite(pool.step_final[sel]).any():
            extra["step_final"] = pool.step_final[sel]
    return EvidenceBatch.from_arrays(
        prompt_ids=pids,
        positions=within,
        token_ids=pool.token_ids[sel],
        temperatures=temps,
        ref_top_ids=pool.ref_top_ids[reference][sel],
        ref_top_logprobs=pool.ref_top_lp[reference][sel],
        ref_token_logprobs=pool.ref_token_lp[reference][sel],
        provider_top_ids=p_ids,
        provider_top_logprobs=p_lp,
        provider_token_logprobs=p_tok,
        **extra,
    )


def span_tokens(pool: Pool, draw: AuditDraw) -> dict[str, int]:
    """Completion tokens of a drawn audit per span (``reasoning`` / ``close`` / ``answer``) in a reasoning-mode
    pool; {} for a plain pool."""
    if pool.token_span is None or not draw.items:
        return {}
    labels = np.concatenate([pool.token_span[pool.item_offsets[i]:pool.item_offsets[i] + n] for i, n, *_ in draw.items])
    return {str(k): int(c) for k, c in zip(*np.unique(labels, return_counts=True), strict=True)}


#: What a verdict's reason says when it places the evidence inside the reasoning span
#: (``auditor.verdict.cause.span_clause``, rules 1s / 3n / 6s).
SPAN_NAMED = "inside the reasoning span"


def audit_verdict(
    batches: Mapping[str, EvidenceBatch] | EvidenceBatch,
    floors: FloorSet,
    *,
    alpha: float = 0.05,
    seed: int = 0,
    power: float | None = None,
    card: Mapping[str, Any] | None = None,
) -> Verdict:
    """Per-position evidence → detector results → verdict, exactly as ``auditor check`` decides.

    Calls the pipeline's ``auditor.check.run_detectors.run_reference_detectors`` (every detector against every
    honest reference precision with that precision's noise floor, combined as an
    intersection–union test: per detector the nearest reference's result) and then
    ``auditor.verdict.decide.decide_verdict`` with the floor of the reference nearest in
    logprob-divergence — the same steps as ``auditor.check.pipeline.analyze_run``.

    Args:
        batches: reference dtype → EvidenceBatch (same positions), or one batch (float32).
        floors: ``auditor.check.measured_floors.FloorSet``.
        alpha: family-wise level (Holm).
        seed: detector randomisation seed.
        power: power a PASS needs against the target effects (None: the verdict's default).
        card: a calibration under a model card: ``{"card_bits", "card_recipe", "model"}``
            (``auditor.check.reference_setup.card_fields`` and the reference model), passed to ``decide_verdict`` as
            the pipeline passes them, so that a PASS's rules-out list (and ``--budget-tokens auto``'s stopping rule)
            are the card's; None = the float32 reference.

    Returns:
        ``auditor.verdict.kinds.Verdict`` (its ``results`` carry the Holm-adjusted p-values).
    """
    if not isinstance(batches, Mapping):
        batches = {"float32": batches}
    results = run_reference_detectors(batches, floors, seed=seed)
    fl = getattr(floors, "floors", None) or {}
    lp = next((r for r in results if r.name == DetectorName.LOGPROB_DIVERGENCE and r.ran), None)
    lp_floor = fl.get(lp.details.get("nearest_reference")) if lp is not None else None
    c = card or {}
    return decide_verdict(results, alpha, floor=lp_floor or fl.get(next(iter(batches))),
                          power=DEFAULT_POWER if power is None else power, card_bits=c.get("card_bits"),
                          card_recipe=c.get("card_recipe"), model=c.get("model"))


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
    #: detector → its effect in the unit of its power target (``auditor.verdict.power.power_effect``)
    effects: dict[str, float] = field(default_factory=dict)
    #: reasoning-mode pools: completion tokens per span (:func:`span_tokens`), and whether the verdict's reason
    #: places the evidence inside the reasoning span (:data:`SPAN_NAMED`); {} and False for plain pools
    spans: dict[str, int] = field(default_factory=dict)
    span_named: bool = False
    #: the precision estimate the audit's report gives (``auditor.verdict.precision_estimate.estimate_precision``):
    #: its ``best`` precision class ("4-bit weights or activations") and nearest class key (``int4``); None where the
    #: report has none (a verdict outside ``ESTIMATED_VERDICTS``, logprob-divergence did not run)
    estimate: str | None = None
    estimate_class: str | None = None
    #: the precision class the profile serves below the card (``profile_precision``), None where it has none
    true_precision: str | None = None


def verdict_estimate(v: Verdict, alpha: float, card: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """(best precision class, nearest class key) of the precision estimate the report of verdict ``v`` gives, as
    ``auditor.report.common`` computes it (the logprob-divergence result, the power record, the card's fields);
    (None, None) without one."""
    c = card or {}
    dets = [{"name": r.name, "ran": r.ran, "statistic": r.statistic, "n": r.n, "details": r.details}
            for r in v.results if r.name == DetectorName.LOGPROB_DIVERGENCE]
    est = estimate_precision(str(v.verdict), dets, alpha=alpha, rules_out=v.details.get("rules_out") or None,
                             card_bits=c.get("card_bits"), card_recipe=c.get("card_recipe"), model=c.get("model"))
    return (None, None) if est is None else (est.best, est.best_class)


def _outcome(budget: int, draw: AuditDraw, v: Verdict, spans: dict[str, int] | None = None, *, alpha: float = 0.05,
             card: Mapping[str, Any] | None = None, true_precision: str | None = None) -> AuditOutcome:
    """The compact record of one audit's verdict (``spans``: its tokens per span in a reasoning-mode pool; ``alpha``,
    ``card``: the audit's, for its precision estimate; ``true_precision``: the profile's precision class)."""
    det = v.details.get("detectors", {})
    best, best_class = verdict_estimate(v, alpha, card)
    return AuditOutcome(
        estimate=best,
        estimate_class=best_class,
        true_precision=true_precision,
        spans=dict(spans or {}),
        span_named=bool(spans) and SPAN_NAMED in str(v.reason),
        budget=budget,
        verdict=str(v.verdict),
        rule=str(v.details.get("rule", "")),
        rejected=[k for k, d in det.items() if d.get("rejects")],
        ran=[k for k, d in det.items() if d.get("ran")],
        tokens=dict(draw.tokens),
        reused=draw.reused,
        prompt_tokens=draw.prompt_tokens,
        planned=dict(draw.planned),
        effects={r.name: e for r in v.results if (e := power_effect(r)) is not None},
    )


def floor_references(pool: Pool, floor: FloorSet) -> list[str]:
    """The pool's reference precisions that have a noise floor (the first one when none has)."""
    fl = getattr(floor, "floors", floor)
    return [r for r in pool.references if not isinstance(fl, dict) or r in fl] or pool.references[:1]


def run_audits(
    pool: Pool,
    floor: FloorSet,
    *,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    audits: int = DEFAULT_AUDITS,
    mix: AuditMix | None = None,
    alpha: float = 0.05,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    card: Mapping[str, Any] | None = None,
) -> list[AuditOutcome]:
    """Run ``audits`` resampled audits at each budget on one pool (``card``: :func:`audit_verdict`'s).

    Seeds: audit j at budget B draws with ``SeedSequence([seed, B, j])`` and seeds its detectors
    with ``seed * 1_000_003 + j`` — reproducible and independent of the other budgets. Each outcome carries its
    report's precision estimate and the precision class the pool's profile serves below the card
    (``auditor.verdict.precision_estimate.profile_precision``, found once per call).
    """
    mix = mix or default_mix()
    refs = floor_references(pool, floor)
    c = card or {}
    truth = profile_precision(pool.profile, card_bits=c.get("card_bits"), model=c.get("model"),
                              recipe=c.get("card_recipe"))
    out: list[AuditOutcome] = []
    for B in budgets:
        t = time.perf_counter()
        for j in range(audits):
            rng = np.random.default_rng(np.random.SeedSequence([seed, int(B), j]))
            d = draw_audit(pool, int(B), mix, rng)
            batches = {r: evidence_for(pool, d, mix, r) for r in refs}
            v = audit_verdict(batches, floor, alpha=alpha, seed=seed * 1_000_003 + j, card=card)
            out.append(_outcome(int(B), d, v, span_tokens(pool, d), alpha=alpha, card=card,
                                true_precision=None if truth is None else truth[1]))
        if progress:
            progress(f"{pool.profile}: {audits} audits at {B} tokens in {time.perf_counter() - t:.0f}s")
    return out
