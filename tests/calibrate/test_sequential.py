"""Sequential stopping: α spending, union-bound validity under H0, early stopping under H1."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from auditor.check.auto_budget import (
    SPENDING_FUNCTIONS,
    SequentialAudit,
    SequentialDesign,
    alpha_spent,
    run_sequential,
    tokens_saved,
)


@pytest.mark.parametrize("spending", SPENDING_FUNCTIONS)
def test_spending_functions_are_monotone_and_spend_alpha(spending):
    ts = np.linspace(0, 1, 101)
    a = [alpha_spent(t, 0.05, spending) for t in ts]
    assert a[0] == 0 and a[-1] == pytest.approx(0.05)
    assert all(y >= x - 1e-15 for x, y in itertools.pairwise(a))
    d = SequentialDesign.geometric(3000, 100, alpha=0.05, spending=spending)
    assert d.looks[0] == 100 and d.looks[-1] == 3000
    assert sum(d.look_alphas()) == pytest.approx(0.05)
    assert all(x >= 0 for x in d.look_alphas())


def test_obrien_fleming_spends_little_early():
    assert alpha_spent(0.1, 0.05) < 1e-6 < alpha_spent(0.5, 0.05) < alpha_spent(1.0, 0.05)
    assert alpha_spent(0.5, 0.05, "pocock") > alpha_spent(0.5, 0.05, "obrien-fleming")


def test_design_validation():
    with pytest.raises(ValueError, match="strictly increasing"):
        SequentialDesign((100, 100, 200))
    with pytest.raises(ValueError, match="spending"):
        SequentialDesign((100, 200), spending="haybittle")
    with pytest.raises(ValueError):
        SequentialDesign.geometric(50, first=100)
    with pytest.raises(ValueError, match="alpha"):
        alpha_spent(0.5, 1.5)


def _brownian_world(rng, drift, looks):
    """A z-statistic on cumulative data at each look (Brownian motion with drift per unit info)."""
    n_max = looks[-1]
    inc = rng.normal(drift, 1.0, size=n_max)
    cum = np.cumsum(inc)
    return {n: cum[n - 1] / math.sqrt(n) for n in looks}


def _verdict_for(z):
    def at(tokens, alpha):
        p = stats.norm.sf(z[tokens])
        if p <= alpha:
            return SimpleNamespace(verdict="QUANTIZATION")
        return SimpleNamespace(verdict="INCONCLUSIVE")

    return at


@pytest.mark.parametrize("spending", SPENDING_FUNCTIONS)
def test_false_rejection_rate_is_at_most_alpha_under_h0(spending):
    """Dependent looks (cumulative statistic), 2500 seeded worlds: rejection rate <= alpha."""
    design = SequentialDesign.geometric(800, 50, alpha=0.05, spending=spending)
    rng = np.random.default_rng(1)
    rej = 0
    n = 2500
    for _ in range(n):
        seq = run_sequential(design, _verdict_for(_brownian_world(rng, 0.0, design.looks)))
        rej += seq.final_verdict.verdict == "QUANTIZATION"
    rate = rej / n
    # union bound: at most alpha (plus binomial slack); conservative since looks are correlated
    assert rate <= 0.05 + 2.6 * math.sqrt(0.05 * 0.95 / n)
    assert rate > 0.01  # but not vacuous


def test_strong_effect_stops_early_and_saves_tokens():
    design = SequentialDesign.geometric(3200, 100, alpha=0.05, spending="pocock")
    rng = np.random.default_rng(2)
    used = []
    for _ in range(300):
        seq = run_sequential(design, _verdict_for(_brownian_world(rng, 0.5, design.looks)))
        assert seq.final_verdict.verdict == "QUANTIZATION"
        used.append(seq.decisions[-1].tokens)
    assert np.mean(used) < 0.2 * design.max_tokens
    assert tokens_saved(used, design.max_tokens) > 0.8


def test_accept_stops_and_last_look_is_final():
    design = SequentialDesign((100, 200, 400))
    calls = []

    def at(tokens, alpha):
        calls.append((tokens, alpha))
        return SimpleNamespace(verdict="PASS" if tokens >= 200 else "INCONCLUSIVE")

    seq = run_sequential(design, at)
    assert seq.final_verdict.verdict == "PASS" and [d.action for d in seq.decisions] == ["continue", "accept"]
    assert seq.alpha_spent <= 0.05
    seq2 = run_sequential(design, lambda t, a: SimpleNamespace(verdict="INCONCLUSIVE"))
    assert [d.action for d in seq2.decisions] == ["continue", "continue", "final"]
    assert seq2.alpha_spent == pytest.approx(0.05)
    with pytest.raises(RuntimeError, match="already finished"):
        seq2.update(400, lambda a: SimpleNamespace(verdict="PASS"))
    s = seq2.summary()
    assert s["tokens_used"] == 400 and len(s["looks"]) == 3


def test_overshooting_tokens_spend_the_rest():
    seq = SequentialAudit(SequentialDesign((100, 200, 400)))
    seq.update(120, lambda a: SimpleNamespace(verdict="INCONCLUSIVE"))
    d = seq.update(450, lambda a: SimpleNamespace(verdict="INCONCLUSIVE"))
    assert d.action == "final" and seq.alpha_spent == pytest.approx(0.05)


def test_accept_power_delays_early_acceptance():
    """With accept_power, an early PASS must hold at that power; the last look decides at the default."""
    calls = []

    def at(tokens, alpha, power=None):
        calls.append(power)
        # "adequately powered" only at the verdict's default power until the last look
        return SimpleNamespace(verdict="PASS" if power is None or tokens >= 400 else "INCONCLUSIVE")

    plain = run_sequential(SequentialDesign((100, 200, 400)), at)
    assert plain.decisions[-1].look == 1 and plain.final_verdict.verdict == "PASS"
    calls.clear()
    strict = run_sequential(SequentialDesign((100, 200, 400), accept_power=0.99), at)
    assert [d.action for d in strict.decisions] == ["continue", "continue", "accept"]
    assert calls == [0.99, 0.99, None]  # the last look is decided at the verdict's own power
    with pytest.raises(ValueError, match="accept_power"):
        SequentialDesign((100,), accept_power=1.5)


# --------------------------------------------------------------------------- issue 14: PASS rules out every class
def _greedy_audit(n):
    """A clean greedy-only audit on n positions (greedy-match and self-greedy, honest rate 1e-3)."""
    from auditor.detectors import DetectorResult

    return [DetectorResult(k, 0.0, 1.0, 0.0, (0.0, 0.0), n, [], details={"r0": 1e-3, "band": 0.2})
            for k in ("greedy-match", "self-greedy")]


def _decide(table=None):
    from auditor.verdict.decide import decide_verdict

    def at(tokens, alpha, power=None):
        kw = {} if power is None else {"power": power}
        return decide_verdict(_greedy_audit(tokens), alpha, effect_sizes=table, **kw)

    return at


def _table(**effects):
    """An effect-size table with one greedy-tested class per keyword (clear-mismatch rate)."""
    from auditor.verdict.rules_out import parse_effect_sizes

    return parse_effect_sizes({"source": "t", "model": "m", "generated": "now", "classes": {
        k: {"label": k, "question": "precision", "profile": k, "effects": {"greedy-match": e}}
        for k, e in effects.items()}})


def test_auto_does_not_accept_while_a_reachable_class_is_not_ruled_out():
    """A PASS that leaves a class the cap can rule out (projected at the first look) not ruled out does not
    stop the audit; when the positions per token then fall short, the cap's verdict is INCONCLUSIVE with the
    tokens still needed."""
    from auditor.verdict.decide import decide_verdict
    from auditor.verdict.rules_out import not_ruled_out

    table = _table(small=0.012)

    def at(tokens, alpha, power=None):  # the first look: 1 position per token; later looks only 1 in 4
        n = tokens if tokens <= 200 else tokens // 4
        kw = {} if power is None else {"power": power}
        return decide_verdict(_greedy_audit(n), alpha, effect_sizes=table, **kw)

    design = SequentialDesign((200, 400, 800), spending="pocock")
    plain = run_sequential(SequentialDesign((200, 400, 800), spending="pocock", require_rules_out=False), at)
    assert plain.final_verdict.verdict == "PASS" and plain.decisions[-1].look < 3  # the early PASS without the gate
    seq = run_sequential(design, at)
    assert [d.action for d in seq.decisions] == ["continue", "continue", "final"]
    assert [d.verdict for d in seq.decisions][:2] == ["PASS", "PASS"]  # PASSes that were not accepted
    assert seq.decisions[0].details["not_ruled_out"] == ["small"]
    v = seq.final_verdict
    assert v.verdict == "INCONCLUSIVE" and v.details["rule"] == "seq-not-ruled-out"
    assert v.details["previous_verdict"]["verdict"] == "PASS"
    need = v.details["suggested_budget_tokens"]
    assert need and need > 0 and f"about {need} more tokens" in v.reason and "small" in v.reason
    assert seq.alpha_spent == pytest.approx(0.05)
    # with one position per token throughout, the cap rules it out and the audit accepts
    ok = run_sequential(design, _decide(table))
    assert ok.final_verdict.verdict == "PASS" and not not_ruled_out(ok.final_verdict.details["rules_out"])


def test_auto_does_not_wait_for_a_class_beyond_its_cap():
    """A class whose effect is too small for the cap (projected at the first look) is reported as not ruled
    out and does not hold the PASS back: waiting could not change the answer."""
    from auditor.verdict.rules_out import not_ruled_out

    table = _table(big=0.08, tiny=0.002)
    seq = run_sequential(SequentialDesign((200, 400, 800), spending="pocock"), _decide(table))
    assert seq.final_verdict.verdict == "PASS" and seq.decisions[-1].action == "accept"
    assert seq.decisions[-1].look < 3
    assert seq.decisions[0].details["beyond_cap"] == ["tiny"]
    assert [r.key for r in not_ruled_out(seq.final_verdict.details["rules_out"])] == ["tiny"]
    assert "does not rule out tiny" in seq.final_verdict.reason


def test_auto_accepts_early_once_every_tested_class_is_ruled_out():
    from auditor.verdict.rules_out import parse_effect_sizes

    table = parse_effect_sizes({"source": "t", "model": "m", "generated": "now", "classes": {
        "int4": {"label": "int4", "question": "precision", "profile": "int4", "effects": {"greedy-match": 0.08}},
        "relaxed": {"label": "relaxed", "question": "verification", "profile": "r",
                    "effects": {"sampling-argmax": 0.12}}}})  # not tested by a greedy audit: does not hold it up
    seq = run_sequential(SequentialDesign((200, 400, 800), spending="pocock"), _decide(table))
    assert seq.final_verdict.verdict == "PASS" and seq.decisions[-1].action == "accept" and seq.decisions[-1].look < 3
    assert SequentialDesign((100,)).to_dict()["require_rules_out"] is True


def test_early_acceptance_needs_the_design_power_against_every_class():
    """With accept_power 0.99 an early PASS waits until every reachable class is ruled out at 99%, not 95%;
    the last look decides at RULE_OUT_POWER."""
    from auditor.check.auto_budget import _short_of

    recs = [{"key": "a", "label": "a", "question": "precision", "status": "ruled out", "ruled_out": True, "power": 0.96},
            {"key": "b", "label": "b", "question": "precision", "status": "ruled out", "ruled_out": True, "power": 0.999}]
    assert [r.key for r in _short_of(recs, 0.99)] == ["a"]
    assert _short_of(recs, None) == [] and _short_of(recs, 0.9) == []
    table = _table(small=0.012)
    strict = run_sequential(SequentialDesign((200, 400, 800, 1600), spending="pocock", accept_power=0.99), _decide(table))
    loose = run_sequential(SequentialDesign((200, 400, 800, 1600), spending="pocock"), _decide(table))
    assert strict.final_verdict.verdict == loose.final_verdict.verdict == "PASS"
    assert strict.decisions[-1].look >= loose.decisions[-1].look


# ----------------------------------------------------------------------------- resolve_cause
def _scripted(verdicts):
    """A callback returning the scripted verdict at each look (dataclass Verdicts, so details can be added)."""
    from auditor.verdict.kinds import Verdict

    it = iter(verdicts)

    def at(tokens, alpha, power=None):
        return Verdict(next(it), f"scripted at {tokens}", {"rule": "scripted", "tokens": tokens})

    return at


def test_an_undetermined_rejection_probes_on_until_a_look_names_the_cause():
    design = SequentialDesign((100, 200, 400, 800), spending="pocock", resolve_cause=True)
    seq = run_sequential(design, _scripted(["INCONCLUSIVE", "QUANTIZATION_OR_SUBSTITUTION", "QUANTIZATION_OR_SUBSTITUTION",
                                            "SUBSTITUTION"]))
    assert [d.action for d in seq.decisions] == ["continue", "reject-resolve", "resolve", "cause"]
    v = seq.final_verdict
    assert v.verdict == "SUBSTITUTION" and v.details["tokens"] == 800
    assert v.details["cause_resolved"] == {"rejected_at_look": 2, "rejected_at_tokens": 200,
                                           "rejected_verdict": "QUANTIZATION_OR_SUBSTITUTION"}
    assert seq.decisions[-1].details["rejected_at_look"] == 2
    assert seq.alpha_spent == pytest.approx(0.05)  # the union bound still covers every look taken
    # a determined cause stops at once (no resolving), as does any deviation with resolve_cause off
    now = run_sequential(design, _scripted(["QUANTIZATION"] * 4))
    assert [d.action for d in now.decisions] == ["reject"]
    off = SequentialDesign((100, 200, 400, 800), spending="pocock")  # the default: stop at the first rejection
    assert [d.action for d in run_sequential(off, _scripted(["QUANTIZATION_OR_SUBSTITUTION"] * 4)).decisions] == \
        ["reject"]
    assert SequentialDesign.geometric(800, 100, resolve_cause=True).resolve_cause is True
    assert design.to_dict()["resolve_cause"] is True


def test_a_quantization_named_as_the_milder_cause_is_resolved_too():
    from auditor.verdict.kinds import Verdict

    script = iter([("QUANTIZATION", False), ("QUANTIZATION", False), ("SUBSTITUTION", True)])

    def at(tokens, alpha, power=None):
        kind, established = next(script)
        return Verdict(kind, "scripted", {"rule": "scripted", "cause_established": established})

    seq = run_sequential(SequentialDesign((100, 200, 400), spending="pocock", resolve_cause=True), at)
    assert [d.action for d in seq.decisions] == ["reject-resolve", "resolve", "cause"]
    assert seq.final_verdict.verdict == "SUBSTITUTION"
    # an established QUANTIZATION stops at once
    est = run_sequential(SequentialDesign((100, 200), resolve_cause=True),
                         lambda t, a, power=None: Verdict("QUANTIZATION", "s", {"cause_established": True}))
    assert [d.action for d in est.decisions] == ["reject"]


def test_an_unresolved_rejection_stands_at_the_cap():
    design = SequentialDesign((100, 200, 400), spending="pocock", resolve_cause=True)
    # the last look still cannot tell: its (more informed) undetermined verdict is final
    seq = run_sequential(design, _scripted(["QUANTIZATION_OR_SUBSTITUTION"] * 3))
    assert [d.action for d in seq.decisions] == ["reject-resolve", "resolve", "reject"]
    assert seq.final_verdict.details["tokens"] == 400 and seq.final_verdict.verdict == "QUANTIZATION_OR_SUBSTITUTION"
    # the last look does not reject at its α_k: the rejecting look's verdict (and evidence) stands
    seq = run_sequential(design, _scripted(["QUANTIZATION_OR_SUBSTITUTION", "INCONCLUSIVE", "PASS"]))
    assert [d.action for d in seq.decisions] == ["reject-resolve", "resolve", "reject"]
    assert seq.final_verdict.verdict == "QUANTIZATION_OR_SUBSTITUTION" and seq.final_verdict.details["tokens"] == 100
    assert seq.summary()["verdict"] == "QUANTIZATION_OR_SUBSTITUTION" and seq.summary()["tokens_used"] == 400
    # at the last look an undetermined rejection is final at once
    one = run_sequential(SequentialDesign((100,), resolve_cause=True), _scripted(["QUANTIZATION_OR_SUBSTITUTION"]))
    assert [d.action for d in one.decisions] == ["reject"]


def test_the_resolving_looks_never_add_a_false_accusation():
    """Under H0 the resolving looks run only after a rejection: the rate of audits that end in a deviation
    equals the rate at which some look first rejects, <= alpha (union bound), with or without resolving."""
    design = SequentialDesign.geometric(3200, 100, alpha=0.05, spending="pocock", resolve_cause=True)
    off = SequentialDesign.geometric(3200, 100, alpha=0.05, spending="pocock")
    rng = np.random.default_rng(11)
    ends = {True: 0, False: 0}
    n = 1500
    for _ in range(n):
        world = _brownian_world(rng, 0.0, design.looks)
        for d, key in ((design, True), (off, False)):
            def undetermined(tokens, alpha, power=None, _w=world):
                v = _verdict_for(_w)(tokens, alpha)
                return SimpleNamespace(verdict="QUANTIZATION_OR_SUBSTITUTION" if v.verdict == "QUANTIZATION"
                                       else v.verdict)
            seq = run_sequential(d, undetermined)
            ends[key] += seq.final_verdict.verdict == "QUANTIZATION_OR_SUBSTITUTION"
    assert ends[True] == ends[False]
    assert ends[True] / n <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / n)
