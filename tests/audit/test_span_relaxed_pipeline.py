"""Issue 35 item 3 end to end on a peaked tiny model (its distributions are peaked like a real model's):
``synthetic-acceptance:3`` (the drafter's tokens, a 1-layer early exit here, emitted unverified, 3 per step)
audited through the whole pipeline ends RELAXED_VERIFICATION (rule 1u: most clear contradictions lie 8 nats
or more below the provider's own top-1), the pre-flight's greedy-top1 rejection explained by it, and the reason
quotes the accepted length per streamed step that does not move with predictability (repetition ≈ chat).

(``relaxed-think`` on this model still ends DECODING_NONCOMPLIANT by the pre-flight's greedy-top1 check:
its 9 departures sit in the reasoning span, but the pre-flight's answers have too few answer-span
positions for rule 6s's Fisher test to show the span is where they are — see the issue 35 note.)"""

from __future__ import annotations

import pytest

from auditor.check.pipeline import run_check

from .conftest import SimFactory, providers_toml


@pytest.fixture
def span_env(tmp_path, peaked_lm, small_floors, monkeypatch):
    from auditor.check import reference_setup

    monkeypatch.setitem(reference_setup._MODELS, ("peaked-ref", "float32"), peaked_lm)
    sims = SimFactory(peaked_lm, "peaked")
    urls = {"sim-synthetic": sims.url("synthetic-acceptance:3", drafter="self:1")}
    toml = providers_toml(urls, "peaked", reference="peaked-ref")
    (tmp_path / "providers.toml").write_text(toml)
    yield {"config": str(tmp_path / "providers.toml"), "db": f"sqlite:///{tmp_path / 'r.db'}"}
    sims.stop()


@pytest.mark.parametrize("name", ["sim-synthetic"])
def test_span_relaxed_profiles(span_env, name) -> None:
    rep = run_check(name, suite="default", budget_tokens=600, db_url=span_env["db"], config_path=span_env["config"])
    print(name, rep.verdict, rep.verdict_details.get("rule"), rep.verdict_reason)
    sg = rep.detector("self-greedy")
    print({k: v for k, v in (sg.get("details") or {}).items() if k != "unverified_positions"})
    for d in rep.detectors:
        if d["ran"]:
            print(d["name"], d["p_adjusted"], (d.get("details") or {}).get("spans"))
    assert rep.verdict == "RELAXED_VERIFICATION", rep.verdict_reason
    assert rep.verdict_details.get("rule") == "1u-unverified-tokens" and sg["details"]["n_unverified"] > 0
    # the pre-flight's greedy-top1 check sees the same departures without stream steps: explained by the
    # unverified drafts, not a second, DECODING_NONCOMPLIANT cause (issue 35 with issue 37 item 6)
    assert "DECODING_NONCOMPLIANT" not in [c["verdict"] for c in rep.verdict_details["secondary_causes"]]
    pre = {f["detector"]: f for f in rep.verdict_details["findings"]}["preflight-greedy-top1"]
    assert pre["explained_by"] == "RELAXED_VERIFICATION", pre
    # the fingerprint: a fixed accepted length, the same on repetition and chat prompts (issue 35 item 3)
    fig = rep.verdict_details["speculation"]["by_predictability"]
    assert fig["trend"] == "flat", fig
    assert "does not move with predictability" in rep.verdict_reason
