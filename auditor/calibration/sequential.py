"""Sequential audits (``auditor check --budget-tokens auto``) simulated on a pool.

Each simulated audit grows one nested draw (:class:`~auditor.calibration.draws.AuditDrawer`) look
by look of a :class:`auditor.check.auto_budget.SequentialDesign` and decides at the look's spent α, as
``auditor.check.auto_budget.SequentialAudit`` does in the pipeline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from auditor.calibration.draws import (
    DEFAULT_AUDITS,
    AuditDrawer,
    AuditMix,
    audit_verdict,
    default_mix,
    evidence_for,
    floor_references,
)
from auditor.calibration.metrics import verdict_rates
from auditor.check.auto_budget import SequentialAudit, SequentialDesign
from simulator.profiles import get_profile

if TYPE_CHECKING:
    from auditor.calibration.pool import Pool
    from auditor.check.measured_floors import FloorSet
    from auditor.verdict.kinds import Verdict

__all__ = ["run_sequential_audits"]


def run_sequential_audits(
    pool: Pool,
    floor: FloorSet,
    design: SequentialDesign,
    *,
    audits: int = DEFAULT_AUDITS,
    mix: AuditMix | None = None,
    seed: int = 0,
    card: Mapping[str, Any] | None = None,
) -> dict:
    """Simulate ``audits`` sequential audits (``auditor.check.auto_budget``) on one pool (``card``: as
    ``auditor.calibration.draws.audit_verdict``'s: the rules-out list the stopping rule reads is the card's).

    Each audit draws nested evidence (:class:`AuditDrawer`) and looks at the design's token
    counts, deciding at the look's spent α.

    Returns:
        A JSON-able record: profile, design, audits, rejection_rate with Clopper–Pearson CI,
        cause_correct_rate, verdicts, mean/median planned tokens used at the stopping look,
        mean completion tokens returned, tokens_saved (1 − mean/max), stop-look histogram.
    """
    mix = mix or default_mix()
    prof = get_profile(pool.profile)
    refs = floor_references(pool, floor)
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

            def verdict_at(a: float, power: float | None = None, _b: dict = batches, _j: int = j) -> Verdict:
                return audit_verdict(_b, floor, alpha=a, seed=seed * 1_000_003 + _j, power=power, card=card)

            dec = seq.update(d.planned_total, verdict_at)
            if dec.stop:
                break
        last = seq.decisions[-1]
        used.append(last.tokens)
        actual.append(d.total)
        verdicts[last.verdict] += 1
        stops[last.look] += 1
    n = audits
    return {
        "profile": prof.name,
        "family": prof.family,
        "honest": prof.honest,
        "expected_verdict": prof.expected_verdict,
        "design": design.to_dict(),
        "max_tokens": design.max_tokens,
        "audits": n,
        **verdict_rates(verdicts, prof),
        "mean_tokens": float(np.mean(used)),
        "mean_completion_tokens": float(np.mean(actual)),
        "median_tokens": float(np.median(used)),
        "tokens_saved": 1.0 - float(np.mean(used)) / design.max_tokens,
        "stop_look": {str(k): v for k, v in sorted(stops.items())},
        "mix": mix.name,
    }
