"""Issue 35 item 4: a provider that fixes its sampling parameters (temperature = 1.0, top_p = 0.95, as
Kimi's API does) or refuses one with HTTP 400, audited end to end on the simulator's ``enforce`` /
``reject`` options (tiny model): the audit plans no greedy test, tests the sampled tokens against the
declared law, and says plainly what could not be tested and why."""

from __future__ import annotations

import pytest

from auditor.check.pipeline import run_check

from .conftest import providers_toml

CASES = {  # provider: (simulator enforce, [providers.NAME.enforced] lines)
    "sim-t1": ({"temperature": 1.0}, 'temperature = 1.0\nrejected = ["seed"]\n'),
    "sim-kimi": ({"temperature": 1.0, "top_p": 0.95}, 'temperature = 1.0\ntop_p = 0.95\nrejected = ["seed"]\n'),
}


@pytest.fixture
def enforced_env(tmp_path, tiny_sims, tiny_lm, small_floors, monkeypatch):
    from auditor.check import reference_setup

    monkeypatch.setitem(reference_setup._MODELS, ("tiny-ref", "float32"), tiny_lm)
    urls = {name: tiny_sims.url("honest-fp32", enforce=enf, reject=("seed",)) for name, (enf, _) in CASES.items()}
    toml = providers_toml(urls, "tiny", reference="tiny-ref")
    for name, (_, lines) in CASES.items():
        toml += f"[providers.{name}.enforced]\n{lines}\n"
    cfg = tmp_path / "providers.toml"
    cfg.write_text(toml)
    return {"config": str(cfg), "db": f"sqlite:///{tmp_path / 'r.db'}"}


def _check(env, name):
    rep = run_check(name, suite="default", budget_tokens=600, db_url=env["db"], config_path=env["config"])
    print(rep.verdict, rep.verdict_reason, rep.tokens)
    for d in rep.detectors:
        print(d["name"], d["ran"], d.get("p_adjusted"), d.get("reason"))
    return rep


def test_honest_provider_enforcing_temperature_passes_saying_greedy_was_impossible(enforced_env) -> None:
    rep = _check(enforced_env, "sim-t1")
    assert rep.status == "completed"
    assert rep.verdict == "PASS", rep.verdict_reason
    assert "greedy-match and the greedy near-tie tests were impossible" in rep.verdict_reason
    assert "temperature = 1" in rep.verdict_reason and "rejects seed" in rep.verdict_reason


def test_tiny_model_top_p_law_unknown_is_inconclusive_with_the_reason(enforced_env) -> None:
    """The tiny random model's top-20 never reaches 0.95: the law of each sample is unknown, and the
    audit says so instead of accusing."""
    rep = _check(enforced_env, "sim-kimi")
    assert rep.verdict == "INCONCLUSIVE", rep.verdict_reason
    assert "greedy-match and the greedy near-tie tests were impossible" in rep.verdict_reason
    gof = rep.detector("sampling-gof")
    assert not gof["ran"] and "does not reach the provider's enforced top_p" in gof["reason"], gof["reason"]
