"""Issue 35 item 2: an honest audit of the simulator in reasoning mode, end to end.

The simulator opens the assistant turn with ``<think>\\n``, lets the model reason for a token
budget, forces ``</think>`` and generates the answer; the provider config names the opener
(``reasoning_opener``) so the reference's prompt ends as the provider's does. An honest
simulator must PASS with at least 90% of its emitted tokens used as evidence, reasoning tokens
included, and evidence rows must say their span.
"""

from __future__ import annotations

import pytest

from auditor.check.pipeline import run_check
from auditor.report.render import render_markdown
from auditor.store import open_store
from auditor.store import queries as q

from .conftest import providers_toml

BUDGET = 16


@pytest.fixture
def reasoning_env(tmp_path, tiny_sims, tiny_lm, small_floors, monkeypatch):
    from auditor.check import reference_setup

    monkeypatch.setitem(reference_setup._MODELS, ("tiny-ref", "float32"), tiny_lm)
    urls = {f"sim-{mode}": tiny_sims.url("honest-fp32", reasoning=mode, reasoning_budget=BUDGET)
            for mode in ("field", "field-reasoning", "inline")}
    urls["sim-answer-only"] = tiny_sims.url("honest-fp32", reasoning="field", reasoning_logprobs="answer",
                                            reasoning_budget=BUDGET)
    toml = providers_toml(urls, "tiny", reference="tiny-ref").replace(
        'api = "chat"\n', 'api = "chat"\nreasoning_opener = "<think>\\n"\n')
    cfg = tmp_path / "providers.toml"
    cfg.write_text(toml)
    return {"config": str(cfg), "db": f"sqlite:///{tmp_path / 'r.db'}"}


@pytest.mark.parametrize("mode", ["field", "field-reasoning", "inline"])
def test_honest_reasoning_simulator_passes_on_its_reasoning_tokens(reasoning_env, mode: str) -> None:
    rep = run_check(f"sim-{mode}", suite="default", budget_tokens=480, db_url=reasoning_env["db"],
                    config_path=reasoning_env["config"])
    assert rep.status == "completed"
    assert rep.excluded_responses is None
    tk = rep.tokens
    emitted = tk["completion"]
    print(f"evidence {mode}: {tk['scored_positions']} of {emitted} emitted tokens; verdict {rep.verdict}")
    assert emitted > 0 and tk["scored_positions"] >= 0.9 * emitted, tk
    assert rep.verdict == "PASS", (rep.verdict, rep.verdict_reason)
    # with the reference comparisons in force: the pre-flight counts the opener in the prompt as the provider does
    pf = {c["name"]: c for c in rep.preflight_checks or []}
    assert pf["prompt-tokens"]["passed"] is True, pf.get("prompt-tokens")
    assert rep.detector("greedy-match")["ran"] and "set aside" not in rep.verdict_reason
    # reasoning tokens are evidence: stored with their span, and most scored positions are reasoning
    st = open_store(reasoning_env["db"])
    try:
        with st.session() as s:
            spans = [t.span for ts in q.tokens_per_probe(s, rep.run_id).values() for t in ts]
            probes = q.list_probes(s, rep.run_id, status="done")
            assert all(p.reasoning is not None and p.reasoning_coverage == "both" for p in probes)
    finally:
        st.close()
    assert spans.count("reasoning") > spans.count("answer") > 0 and None not in spans
    rows = [e for d in rep.detectors for e in d.get("evidence") or [] if "span" in e]
    assert rows and {e["span"] for e in rows} <= {"reasoning", "answer"} and any(e["span"] == "reasoning" for e in rows)
    assert "| reasoning span" in render_markdown(rep) or "reasoning span, " in render_markdown(rep)


def test_honest_reasoning_simulator_with_logprobs_over_the_answer_only(reasoning_env) -> None:
    """The reasoning is not covered, so no answer has an exact prefix: every response is excluded
    with that reason and the audit ends INCONCLUSIVE saying so, never accusing the honest provider."""
    from auditor.check.observations import REASONING_PREFIX_UNKNOWN

    rep = run_check("sim-answer-only", suite="default", budget_tokens=480, db_url=reasoning_env["db"],
                    config_path=reasoning_env["config"])
    assert rep.status == "completed"
    ex = rep.excluded_responses
    assert ex is not None and set(ex["reasons"]) == {REASONING_PREFIX_UNKNOWN}
    assert rep.verdict == "INCONCLUSIVE" and REASONING_PREFIX_UNKNOWN in rep.verdict_reason, rep.verdict_reason
