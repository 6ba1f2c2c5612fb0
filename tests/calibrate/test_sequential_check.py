"""`--budget-tokens auto` end to end: rounds of probes on one run against a loopback simulator."""

from __future__ import annotations

import pytest


@pytest.fixture
def sim_env(tmp_path, tiny_lm, tiny_refs, monkeypatch):
    from auditor.check import measured_floors as noise
    from auditor.check import reference_setup
    from simulator.server import ServerThread, create_app

    monkeypatch.setattr(noise, "FLOOR_PROMPTS", 4)
    monkeypatch.setattr(noise, "FLOOR_MAX_NEW_TOKENS", 8)
    monkeypatch.setattr(noise, "noise_cache_dir", lambda: tmp_path / "noise")
    for dt, lm in tiny_refs.items():
        monkeypatch.setitem(reference_setup._MODELS, ("tiny-ref", dt), lm)
    srv = ServerThread(create_app("honest-fp32", lm=tiny_lm, served_model_name="tiny", seed=0), timeout=120).start()
    cfg = tmp_path / "providers.toml"
    cfg.write_text(
        f'[providers.sim]\nbase_url = "{srv.base_url}"\nmodel = "tiny"\napi = "chat"\nreference = "tiny-ref"\n'
        "timeout_s = 300\n\n[providers.sim.capabilities]\nmax_top_logprobs = 20\nlogprobs = true\nseed = true\n"
        "streaming = true\n\n[providers.sim.rate_limits]\nconcurrency = 2\n"
    )
    yield {"config": str(cfg), "db": f"sqlite:///{tmp_path / 'seq.db'}"}
    srv.stop()


def test_sequential_check_probes_in_rounds_on_one_run(sim_env):
    from auditor.check.auto_budget import SequentialDesign, run_sequential_check
    from auditor.report.render import report_from_store
    from auditor.store import open_store
    from auditor.store import queries as q
    from auditor.store import run_detail_queries as rdq

    looks = []
    design = SequentialDesign((40, 80), spending="pocock")
    rep, seq = run_sequential_check(
        "sim", design=design, suite="smoke", db_url=sim_env["db"], config_path=sim_env["config"], on_look=looks.append
    )
    assert looks and looks[-1].stop and seq.done
    assert rep.verdict in ("PASS", "INCONCLUSIVE")  # an honest provider is never accused here
    assert seq.alpha_spent <= 0.05 + 1e-12
    st = open_store(sim_env["db"])
    with st.session() as s:
        runs = q.list_runs(s, provider="sim")
        assert len(runs) == 1  # every round resumed the same run
        run = q.get_run(s, rep.run_id)
        assert run.summary["sequential"]["design"]["looks"] == [40, 80]
        assert run.alpha == pytest.approx(0.05)
        assert run.verdict == rep.verdict  # a last-look PASS turned INCONCLUSIVE (rules out) is stored so
        if rep.verdict == "PASS":
            assert "rules_out" in rep.verdict_details and all(
                r["status"] != "not ruled out" for r in rep.verdict_details["rules_out"])
        n_probes = sum(q.probe_counts(s, rep.run_id).values())
        # the dashboard's stored figures follow the sequential decision: what `auditor report RUN_ID` renders
        shown = rdq.run_detail(s, rep.run_id)
        again = report_from_store(s, rep.run_id)
    assert shown is not None and shown["verdict"] == rep.verdict
    assert shown["questions"] == [a.to_dict() for a in again.questions] and shown["headline"] == again.headline
    if len(looks) == 2:  # the second round added requests to the same run
        assert looks[1].tokens > looks[0].tokens
    assert n_probes >= 1


def test_cli_check_budget_auto(sim_env, monkeypatch):
    import json

    from typer.testing import CliRunner

    import auditor.check.auto_budget as sq
    from auditor.cli import app

    monkeypatch.setattr(sq, "AUTO_MAX_TOKENS", 80)
    monkeypatch.setattr(sq, "AUTO_FIRST_LOOK", 40)
    r = CliRunner().invoke(app, ["check", "--provider", "sim", "--suite", "smoke", "--budget-tokens", "auto",
                                 "--config", sim_env["config"], "--db", sim_env["db"], "--no-progress", "--format", "json"])
    assert r.exit_code in (0, 2), r.output
    assert "look 1:" in r.output
    rep = json.loads(r.output[r.output.index("{"):])
    assert rep["verdict"] in ("PASS", "INCONCLUSIVE")
    bad = CliRunner().invoke(app, ["check", "--provider", "sim", "--budget-tokens", "lots", "--config", sim_env["config"],
                                   "--db", sim_env["db"]])
    assert bad.exit_code == 3 and "'auto'" in bad.output


def test_sequential_check_returns_the_decided_report_not_the_last_looks(tmp_path, monkeypatch):
    """The report returned (and stored) is the sequential decision: here the look that rejected with an
    undetermined cause, when the last look does not reject at its own α_k."""
    from auditor.check import pipeline as audit
    from auditor.check.auto_budget import SequentialDesign, run_sequential_check
    from auditor.report.common import AuditReport

    script = iter([("QUANTIZATION_OR_SUBSTITUTION", "heavy quantization or another model"), ("PASS", "nothing rejects")])

    def fake_check(provider, **kw):
        verdict, reason = next(script)
        return AuditReport(run_id="r1", provider=provider, model="m", verdict=verdict, verdict_reason=reason,
                           alpha=kw["alpha"], verdict_details={"rule": "scripted"})

    monkeypatch.setattr(audit, "run_check", fake_check)
    looks = []
    rep, seq = run_sequential_check("sim", design=SequentialDesign((40, 80), spending="pocock", resolve_cause=True),
                                    suite="smoke", db_url=f"sqlite:///{tmp_path / 'x.db'}", on_look=looks.append)
    assert [d.action for d in looks] == ["reject-resolve", "reject"]
    assert rep.verdict == "QUANTIZATION_OR_SUBSTITUTION" and rep.verdict_reason == "heavy quantization or another model"
    assert seq.summary()["verdict"] == "QUANTIZATION_OR_SUBSTITUTION" and seq.final_verdict is rep


@pytest.mark.parametrize(("flag", "want"), [([], False), (["--resolve-cause"], True), (["--stop-at-rejection"], False)])
def test_cli_check_auto_passes_resolve_cause(tmp_path, monkeypatch, flag, want):
    from typer.testing import CliRunner

    import auditor.check.auto_budget as sq
    from auditor.cli import app
    from auditor.report.common import AuditReport

    seen = {}

    def fake(provider, **kw):
        seen.update(kw)
        return AuditReport(run_id="r1", provider=provider, model="m", verdict="PASS", verdict_reason="ok",
                           alpha=0.05), None

    monkeypatch.setattr(sq, "run_sequential_check", fake)
    r = CliRunner().invoke(app, ["check", "--provider", "sim", "--budget-tokens", "auto", "--no-progress",
                                 "--db", f"sqlite:///{tmp_path / 'x.db'}", "--format", "json", *flag])
    assert r.exit_code == 0, r.output
    assert seen["resolve_cause"] is want


def test_sequential_check_returns_inconclusive_when_the_cap_leaves_a_class_not_ruled_out(tmp_path, monkeypatch):
    """A PASS at the last look that does not rule out a class the cap could reach is INCONCLUSIVE in the
    returned report too (it used to come back as the look's raw PASS)."""
    from auditor.check import pipeline as audit
    from auditor.check.auto_budget import SequentialDesign, run_sequential_check
    from auditor.report.common import AuditReport

    rec = {"key": "int8", "label": "int8 weights", "question": "precision", "status": "not ruled out",
           "ruled_out": False, "power": 0.6, "detector": "logprob-divergence", "effect": 2.3, "n": 40,
           "required_positions": 60, "missing_positions": 30, "mode": "logprob"}

    def fake_check(provider, **kw):
        return AuditReport(run_id="r1", provider=provider, model="m", verdict="PASS", verdict_reason="nothing rejects",
                           alpha=kw["alpha"], verdict_details={"rule": "5-pass", "rules_out": [rec]})

    monkeypatch.setattr(audit, "run_check", fake_check)
    rep, seq = run_sequential_check("sim", design=SequentialDesign((40, 80), spending="pocock"), suite="smoke",
                                    db_url=f"sqlite:///{tmp_path / 'x.db'}")
    assert [d.action for d in seq.decisions] == ["continue", "final"]
    assert rep.verdict == "INCONCLUSIVE" and rep.verdict_details["rule"] == "seq-not-ruled-out"
    assert "int8 weights (power 60%)" in rep.verdict_reason


def test_sequential_check_writes_one_verdict_from_suite_objects(sim_env, monkeypatch):
    """Issue 34, item 3: each look hands its planned Suite object to the pipeline (no temporary suite file
    read back and planned again), and the run's verdict is committed once, by the decision, whatever the
    number of looks (it used to be written by every look, and again when the decision differed)."""
    from sqlalchemy import event, inspect
    from sqlalchemy.orm import Session

    from auditor.check import pipeline as audit
    from auditor.check.auto_budget import SequentialDesign, run_sequential_check
    from auditor.store import open_store
    from auditor.store import queries as q
    from auditor.store.models import VerdictRow
    from probes.suites import Suite

    suites = []
    real = audit.run_check

    def spy(provider, options=None, /, **kw):
        suites.append(kw.get("suite"))
        return real(provider, options, **kw)

    monkeypatch.setattr(audit, "run_check", spy)
    pending: dict[int, int] = {}
    committed: list[int] = []

    def on_flush(session, _ctx):
        # a verdict write: a new verdict row, or a stored one whose verdict/reason changed (the dashboard's
        # figures, auditor.check.stored_figures, update other columns of the same row and are not a verdict write)
        n = sum(isinstance(o, VerdictRow) for o in session.new) + sum(
            isinstance(o, VerdictRow) and any(inspect(o).attrs[a].history.has_changes() for a in ("verdict", "reason"))
            for o in session.dirty)
        pending[id(session)] = pending.get(id(session), 0) + n

    def on_commit(session):
        committed.append(pending.pop(id(session), 0))

    def on_rollback(session):
        pending.pop(id(session), None)

    hooks = [("after_flush", on_flush), ("after_commit", on_commit), ("after_rollback", on_rollback)]
    for name, fn in hooks:
        event.listen(Session, name, fn)
    try:
        looks = []
        rep, _seq = run_sequential_check("sim", design=SequentialDesign((40, 80), spending="pocock"), suite="smoke",
                                        db_url=sim_env["db"], config_path=sim_env["config"], on_look=looks.append)
    finally:
        for name, fn in hooks:
            event.remove(Session, name, fn)
    assert len(looks) == 2, [d.action for d in looks]  # the count below spans two looks
    assert len(suites) == 2 and all(isinstance(x, Suite) for x in suites)
    assert suites[1].max_completion_tokens() > suites[0].max_completion_tokens()
    assert sum(committed) == 1, committed
    st = open_store(sim_env["db"])
    with st.session() as s:
        assert s.query(VerdictRow).filter(VerdictRow.run_id == rep.run_id).count() == 1
        run = q.get_run(s, rep.run_id)
        assert (run.verdict, run.status) == (rep.verdict, "completed")
        assert run.summary["sequential"]["verdict"] == rep.verdict
        assert run.budget_tokens == looks[-1].tokens
        stored = q.get_verdict(s, rep.run_id)
        assert stored.reason == rep.verdict_reason and "report" in stored.details  # the report's extras are kept
    st.close()
