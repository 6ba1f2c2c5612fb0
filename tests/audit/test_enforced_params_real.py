"""Issue 35 item 4 acceptance on the real default model (SmolLM2-135M-Instruct): a provider that enforces
temperature = 1.0 and top_p = 0.95 (Kimi's official API does) — honest → PASS stating that the greedy tests
were impossible; relaxed-threshold → the sampler deviates from the declared law and the verdict names lossy speculative acceptance
(RELAXED_VERIFICATION, or the undetermined pair RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT with the emission models
leaning to acceptance); never a crash, never INCONCLUSIVE without its reason.
The sampled tokens are tested against the declared law: the reference's distribution cut to its 0.95 nucleus.

Why the pair is accepted (stop 49): with temperature and top_p enforced there is no greedy test, so the mechanism
rests on the emission models alone, and under a declared 0.95 nucleus relaxed-threshold's emissions sit close to a
deeper truncation. Measured on this model: the acceptance law wins by 4.61 nats at 581 sampled tokens (this test,
default suite, 1,000 tokens), 5.20 at 603 (default, 2,000), 3.90 at 583 (verification, 1,000), 4.50 at 1,191
(verification, 2,000) — below the calibrated 5.5-nat margin — and 12.26 at 1,795 (verification, 3,000: decisive,
RELAXED_VERIFICATION by rule 4c). The exact verdict needs ~1,800 sampled tokens, about three times this test's
budget and time; stop 47's CI had passed the exact RELAXED_VERIFICATION at 1,000 tokens on numerics that happened to
land above the margin, and the same code fails it here."""

from __future__ import annotations

import pytest

from auditor.check.pipeline import run_check

from .conftest import SimFactory, providers_toml

pytestmark = pytest.mark.real_model

MODEL = "smollm2-135m-instruct"
ENFORCED = {"temperature": 1.0, "top_p": 0.95}
BUDGET = 1000


@pytest.fixture(scope="module")
def real_enforced(real_lm, tmp_path_factory):
    from auditor.check import reference_setup

    mp = pytest.MonkeyPatch()
    mp.setitem(reference_setup._MODELS, (MODEL, "float32"), real_lm)
    sims = SimFactory(real_lm, MODEL)
    tmp = tmp_path_factory.mktemp("enforced")
    urls = {f"sim-{p}": sims.url(p, enforce=ENFORCED) for p in ("honest-fp32", "relaxed-threshold")}
    toml = providers_toml(urls, MODEL)
    for name in urls:
        toml += f"[providers.{name}.enforced]\ntemperature = 1.0\ntop_p = 0.95\n\n"
        # a busy 2-core machine stalled 6 of 37 answers past the default 30 s (INCONCLUSIVE, provider failures)
        toml += f"[providers.{name}.response_limits]\nstall_timeout_s = 600\n\n"
    (tmp / "providers.toml").write_text(toml)
    yield {"config": str(tmp / "providers.toml"), "db": f"sqlite:///{tmp / 'a.db'}"}
    sims.stop()
    mp.undo()


RELAXED = ("RELAXED_VERIFICATION", "RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT")


@pytest.mark.parametrize(("profile", "expected"), [("honest-fp32", ("PASS",)), ("relaxed-threshold", RELAXED)])
def test_enforced_law_audit_on_smollm2(real_enforced, profile: str, expected: tuple[str, ...]) -> None:
    rep = run_check(f"sim-{profile}", suite="default", budget_tokens=BUDGET, db_url=real_enforced["db"],
                    config_path=real_enforced["config"])
    by = {d["name"]: d for d in rep.detectors}
    print(profile, rep.verdict, rep.verdict_reason, {k: (d["n"], d["p_adjusted"]) for k, d in by.items() if d["ran"]})
    assert rep.status == "completed"
    assert rep.verdict in expected, rep.verdict_reason
    if rep.verdict == "RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT":  # the pair only when acceptance is the lean
        emission = (by["sampling-tail"].get("details") or {}).get("emission") or {}
        assert float(emission["log_lik_ratio"]) < 0, emission
        assert "lossy speculative acceptance" in rep.verdict_reason
    assert "greedy-match and the greedy near-tie tests were impossible" in rep.verdict_reason
    assert "enforces top_p = 0.95" in rep.verdict_reason
    assert not by["greedy-match"]["ran"] and by["sampling-gof"]["ran"]
