"""Issue 35 item 3 on the real default model (SmolLM2-135M-Instruct): ``synthetic-acceptance:3`` (the
``self:8`` early-exit head's drafts emitted unverified, 3 per step) audited at 500 tokens ends
RELAXED_VERIFICATION by rule 1d: its greedy departures from its own top-1 sit inside the streamed steps and
never at a step's last token (the target's own pick). Rule 1u does not name it here: most of the drafts'
departures are a few nats, not UNVERIFIED_GAP_NATS, below the top-1 (21 of 75 measured). Small noise
floors (``small_floors``), as the measurement in the issue 35 note."""

from __future__ import annotations

import pytest

from auditor.check.pipeline import run_check

from .conftest import SimFactory, providers_toml

pytestmark = pytest.mark.real_model

MODEL = "smollm2-135m-instruct"


@pytest.fixture
def real_synthetic(real_lm, tmp_path, small_floors, monkeypatch):
    from auditor.check import reference_setup

    monkeypatch.setitem(reference_setup._MODELS, (MODEL, "float32"), real_lm)
    sims = SimFactory(real_lm, MODEL)
    tmp = tmp_path
    name = "sim-synthetic"
    toml = providers_toml({name: sims.url("synthetic-acceptance:3")}, MODEL)
    toml += f"[providers.{name}.response_limits]\nstall_timeout_s = 600\n\n"  # a busy 2-core machine stalls
    (tmp / "providers.toml").write_text(toml)
    yield {"config": str(tmp / "providers.toml"), "db": f"sqlite:///{tmp / 'a.db'}"}
    sims.stop()


def test_synthetic_acceptance_on_smollm2_names_unverified_drafts(real_synthetic) -> None:
    rep = run_check("sim-synthetic", suite="default", budget_tokens=500, db_url=real_synthetic["db"],
                    config_path=real_synthetic["config"])
    sg = rep.detector("self-greedy")["details"]
    print(rep.verdict, rep.verdict_details.get("rule"), sg.get("steps"), sg.get("n_unverified"), sg.get("n_clear"))
    assert rep.verdict == "RELAXED_VERIFICATION", rep.verdict_reason
    assert rep.verdict_details["rule"] == "1d-unverified-drafts", rep.verdict_reason
    st = sg["steps"]
    assert st["clear"] > 0 and st["clear_final"] < st["clear"] * st["final_positions"] / st["positions"]
