"""The check pipeline end to end on a tiny random model served by in-process simulators:
storage, alignment, reference cache, summary figures, report re-rendering, resume, CLI, errors.
(Verdicts on the real model and real profiles: test_profiles.py.)"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

from auditor.check.pipeline import AuditError, CheckOptions, run_check
from auditor.cli import app
from auditor.report.junit import render_junit
from auditor.report.markdown import render_markdown
from auditor.report.render import load_report, render_json
from auditor.store import dashboard_queries as dq
from auditor.store import open_store
from auditor.store import queries as q
from auditor.store import run_detail_queries as rdq

from .conftest import providers_toml


@pytest.fixture
def tiny_env(tmp_path, tiny_sims, tiny_lm, small_floors, monkeypatch):
    """A providers file with an honest tiny simulator ('sim') and a dead port ('dead'); the reference
    'tiny-ref' resolves to the tiny model."""
    from auditor.check import reference_setup
    from reference.loopback import free_port

    monkeypatch.setitem(reference_setup._MODELS, ("tiny-ref", "float32"), tiny_lm)
    url = tiny_sims.url("honest-fp32")
    cfg = tmp_path / "providers.toml"
    dead = f"http://127.0.0.1:{free_port()}/v1"
    cfg.write_text(providers_toml({"sim": url, "dead": dead}, "tiny", reference="tiny-ref")
                   + "[providers.dead.retry]\nmax_attempts = 1\n")
    return {"config": str(cfg), "db": f"sqlite:///{tmp_path / 'a.db'}", "tmp": tmp_path}


def test_run_check_stores_everything_and_rerenders_identically(tiny_env) -> None:
    seen: list[str] = []
    rep = run_check("sim", suite="smoke", budget_tokens=96, db_url=tiny_env["db"], config_path=tiny_env["config"],
                    progress=lambda stage, done, total: seen.append(stage))
    # issue 38 item 12: a suite that cannot decide says so before it probes
    assert seen[0].startswith("note: suite smoke is a wire check") and "--suite default" in seen[0]
    assert rep.status == "completed" and rep.verdict in ("PASS", "INCONCLUSIVE")  # tiny model: power is tiny
    assert rep.tokens["budget"] == 96 and rep.tokens["completion"] <= 96 and rep.tokens["prompt"] > 0
    assert rep.tokens["scored_positions"] > 0 and rep.cost_usd > 0
    assert rep.reference["model"] == "tiny-ref" and rep.reference["revision"] == "tiny-llama-seed0"
    names = [d["name"] for d in rep.detectors]
    assert names[:2] == ["greedy-match", "logprob-divergence"] and "self-greedy" in names
    for d in rep.detectors:
        assert d["ran"] == (d["reason"] is None or d["p_value"] is not None)
        if d["ran"]:
            assert 0 <= d["p_value"] <= d["p_adjusted"] <= 1
    gm = rep.detector("greedy-match")
    assert gm["details"]["nearest_reference"] == "float32"
    # speed figures from the stream timing
    s = rep.summary
    assert s["ttft_median_s"] > 0 and s["tpot_median_s"] >= 0 and s["tokens_per_s"] > 0
    assert s["mean_tokens_per_chunk"] >= 1 and sum(s["tokens_per_chunk"].values()) > 0
    assert s["noise_floor"] is not None and "clear_mismatch_rate" in s
    # stored: run fields, detector rows, verdict, aligned ids, reference cache
    st = open_store(tiny_env["db"])
    with st.session() as ses:
        run = q.get_run(ses, rep.run_id)
        assert run.kind == "audit" and run.verdict == rep.verdict and run.alpha == 0.05 and run.budget_tokens == 96
        assert run.reference_revision == "tiny-llama-seed0" and run.reference_dtype == "float32"
        assert len(q.detector_results_for_run(ses, rep.run_id)) == len(rep.detectors)
        toks = q.tokens_per_probe(ses, rep.run_id)
        assert toks and all(t.ref_token_id is not None for ts in toks.values() for t in ts)
        n_cache = ses.query(q.ReferenceCache).count()
        n_attempts = q.run_detail(ses, rep.run_id).n_attempts
    assert n_cache == sum(1 for _ in toks)
    # re-rendered from the database: the same report, in every format
    again = load_report(rep.run_id[:8], tiny_env["db"])
    assert again.to_dict() == rep.to_dict()
    assert json.loads(render_json(again)) == json.loads(render_json(rep))
    assert render_markdown(again) == render_markdown(rep)
    ET.fromstring(render_junit(again).split("\n", 1)[1])
    # the dashboard shows the answers, headline and standing stored with the verdict (issue 34): the report's
    with st.session() as ses:
        shown = rdq.run_detail(ses, rep.run_id)
        (row,) = dq.provider_overview(ses)
    assert shown is not None and shown["not_stored"] is None
    assert shown["questions"] == rep.to_dict()["questions"] and shown["headline"] == rep.headline
    assert row["standing"] == rep.verdict and row["standing_suites"] == ["smoke"]
    # resume of a finished audit: no new requests, reference scores from the cache, same verdict
    rep2 = run_check("sim", suite="smoke", budget_tokens=96, db_url=tiny_env["db"], config_path=tiny_env["config"],
                     resume=rep.run_id)
    assert rep2.run_id == rep.run_id and rep2.verdict == rep.verdict
    with st.session() as ses:
        assert q.run_detail(ses, rep.run_id).n_attempts == n_attempts
        assert ses.query(q.ReferenceCache).count() == n_cache
    st.close()


def test_cli_check_formats_report_and_exit_codes(tiny_env) -> None:
    runner = CliRunner()
    jpath = tiny_env["tmp"] / "r.json"
    base = ["check", "--provider", "sim", "--suite", "smoke", "--budget-tokens", "64", "--config", tiny_env["config"],
            "--db", tiny_env["db"], "--no-progress"]
    res = runner.invoke(app, base + ["--format", "json", "--json", str(jpath)])
    d = json.loads(res.stdout)
    assert res.exit_code == {"PASS": 0, "INCONCLUSIVE": 2}[d["verdict"]] == d["exit_code"]
    assert json.loads(jpath.read_text()) == d
    rid = d["run_id"]
    for fmt in ("markdown", "json", "junit", "text"):
        r = runner.invoke(app, ["report", rid, "--format", fmt, "--db", tiny_env["db"]])
        assert r.exit_code == 0, r.output
        if fmt == "json":
            assert json.loads(r.stdout) == d
        elif fmt == "junit":
            ET.fromstring(r.stdout.split("\n", 1)[1])
        elif fmt == "markdown":
            assert r.stdout.startswith(f"# Inference audit: sim — **{d['verdict']}**") and rid in r.stdout
        else:
            assert f"verdict: {d['verdict']}" in r.stdout
    out = tiny_env["tmp"] / "r.md"
    assert runner.invoke(app, ["report", rid, "-f", "markdown", "-o", str(out), "--db", tiny_env["db"]]).exit_code == 0
    assert "## Token-level evidence" in out.read_text()
    # an inconclusive audit (too small to have power) exits 2
    res = runner.invoke(app, base[:6] + ["16"] + base[7:] + ["--format", "junit"])
    assert res.exit_code == 2, res.output
    assert ET.fromstring(res.stdout.split("\n", 1)[1]).find("testsuite").get("errors") == "1"


def _one_line_error(res) -> str:
    lines = [x for x in res.output.strip().splitlines() if x.strip()]
    assert res.exit_code == 3, res.output
    assert "Traceback" not in res.output
    assert lines and lines[0].startswith("error: ")
    return res.output


def test_cli_errors_exit_3_with_a_clear_message(tiny_env, tmp_path) -> None:
    runner = CliRunner()
    bad = tmp_path / "bad.toml"
    bad.write_text('[providers.x]\nbase_url = "ftp://nowhere"\nmodel = "m"\n')
    out = _one_line_error(runner.invoke(app, ["check", "--provider", "x", "--config", str(bad), "--db", tiny_env["db"]]))
    assert "providers.x.base_url" in out and "Fix" in out
    bad.write_text('[providers.x]\nbase_url = "http://127.0.0.1:1/v1"\nmodel = "m"\ncapabilites = {}\n')
    out = _one_line_error(runner.invoke(app, ["check", "--provider", "x", "--config", str(bad)]))
    assert "capabilites" in out and "did you mean 'capabilities'" in out
    out = _one_line_error(runner.invoke(app, ["check", "--provider", "nope", "--config", tiny_env["config"]]))
    assert "no provider named 'nope'" in out
    out = _one_line_error(runner.invoke(app, ["check", "--provider", "sim", "--config", str(tmp_path / "missing.toml")]))
    assert "missing.toml" in out
    out = _one_line_error(runner.invoke(app, ["check", "--provider", "sim", "--config", tiny_env["config"], "--suite", "nosuch"]))
    assert "no suite named 'nosuch'" in out
    out = _one_line_error(runner.invoke(app, ["check", "--provider", "sim", "--config", tiny_env["config"], "--alpha", "1.5"]))
    assert "--alpha" in out
    out = _one_line_error(runner.invoke(app, ["check", "--provider", "sim", "--config", tiny_env["config"], "--format", "pdf"]))
    assert "--format" in out
    out = _one_line_error(runner.invoke(app, ["report", "feedfacecafe", "--db", tiny_env["db"]]))
    assert "no run 'feedfacecafe'" in out
    res = runner.invoke(app, ["check", "--provider", "dead", "--suite", "smoke", "--config", tiny_env["config"],
                              "--db", tiny_env["db"], "--no-progress"])
    out = _one_line_error(res)
    assert "no probe succeeded" in out and "dead" in out
    assert "auditor check --provider dead --resume " in out  # the CLI words the library error
    out = _one_line_error(runner.invoke(app, ["check", "--provider", "sim", "--suite", "smoke", "--config",
                                              tiny_env["config"], "--budget-tokens", "3"]))
    assert "--budget-tokens 3 is smaller" in out and "Fix: --budget-tokens " in out and "budget_tokens=" not in out


def test_run_check_api_errors(tiny_env) -> None:
    with pytest.raises(AuditError, match="budget_tokens=3 is smaller"):
        run_check("sim", suite="smoke", budget_tokens=3, db_url=tiny_env["db"], config_path=tiny_env["config"])
    with pytest.raises(AuditError, match="alpha") as ei:
        run_check("sim", alpha=0.0, db_url=tiny_env["db"], config_path=tiny_env["config"])
    assert ei.value.parameter == "alpha"
    with pytest.raises(TypeError):
        run_check("sim", CheckOptions(), no_such_option=1)


def test_each_response_is_normalized_once_and_ids_are_written_at_the_end(tiny_env, monkeypatch) -> None:
    """The runner stores every token field later stages need (alternatives' bytes included); the
    analysis never normalizes again and reads the store without writing to it until its final
    transaction, which sets ``normalized_tokens.ref_token_id``."""
    import ast
    from pathlib import Path

    import probes.normalize
    from auditor.check import evidence

    rep = run_check("sim", suite="smoke", budget_tokens=64, db_url=tiny_env["db"], config_path=tiny_env["config"])
    st = open_store(tiny_env["db"])
    with st.session() as ses:
        toks = [t for ts in q.tokens_per_probe(ses, rep.run_id).values() for t in ts]
        with_alts = [t for t in toks if t.top_logprobs]
        assert with_alts and all(len(t.top_logprobs_bytes) == len(t.top_logprobs) for t in with_alts)
        # the stored bytes are the normalizer's (checked here by normalizing one stored body again)
        probe = next(p for p in q.list_probes(ses, rep.run_id, status="done") if q.tokens_for_probe(ses, p.id)[0].top_logprobs)
        body = [a for a in q.attempts_for_probe(ses, probe.id) if a.error is None][-1].response_text
        req = probe.request_json
        norm = probes.normalize.normalize_response("chat", req, response_text=body, stream=bool(req.get("stream")),
                                                   max_top_logprobs=20)
        stored = q.tokens_for_probe(ses, probe.id)
        assert [[None if b is None else b.hex() for _t, b, _lp in r.top_logprobs] for r in norm.tokens] == [
            t.top_logprobs_bytes for t in stored]
        for t in toks:  # forget the aligned ids
            t.ref_token_id = None
    # the analysis stages import no normalizer...
    for mod in ("pipeline", "observations", "evidence", "reference_scoring", "run_detectors", "summary"):
        tree = ast.parse((Path(evidence.__file__).parent / f"{mod}.py").read_text())
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        normalizer = {"probes.normalize", "probes.logprob_entries", "probes.reasoning_spans", "probes.token_checks"}
        assert not normalizer & names, mod

    # ...and call none: re-analyse the finished run with the normalizer disabled
    def boom(*a, **k):
        raise AssertionError("normalize_response called after the probe stage")

    monkeypatch.setattr(probes.normalize, "normalize_response", boom)
    cfg = __import__("probes.providers_file", fromlist=["get_provider"]).get_provider("sim", tiny_env["config"])
    obs = evidence.load_observations(st, rep.run_id, cfg, audit_lm(tiny_env).tokenizer)
    assert obs and all(o.one_to_one for o in obs)
    with st.session() as ses:  # loading wrote nothing
        assert all(t.ref_token_id is None for ts in q.tokens_per_probe(ses, rep.run_id).values() for t in ts)
    again = run_check("sim", suite="smoke", budget_tokens=64, db_url=tiny_env["db"], config_path=tiny_env["config"],
                      resume=rep.run_id)
    assert again.verdict == rep.verdict and again.to_dict()["detectors"] == rep.to_dict()["detectors"]
    with st.session() as ses:
        assert all(t.ref_token_id is not None for ts in q.tokens_per_probe(ses, rep.run_id).values() for t in ts)
    st.close()


def audit_lm(env):
    from auditor.check import reference_setup

    return reference_setup._MODELS[("tiny-ref", "float32")]


def test_check_follows_the_provider_down_through_each_stage_once(tiny_env) -> None:
    """Issue 11: following ``--provider`` through ``run_check`` visits each stage module once on the
    way down. Traced at run time (``sys.setprofile``): the project modules that ``auditor.check.pipeline``'s
    own functions call into, in call order, with consecutive repeats collapsed, contain no module
    twice (no climb back to a stage already left). Teardown is not a stage: ``close`` and
    ``__exit__`` (closing the reference's HTTP client at the very end) are left out of the trace.
    The normalizer runs only while probing: inside the runner (each probe response, in its attempt writer), the
    pre-flight (its own requests, sent right after the probes) and the reference-path stage (its
    echo requests, right after the pre-flight), and never once the pipeline has gone on to a
    later stage."""
    import sys
    import threading

    stages: list[str] = []
    normalize_callers: set[str] = set()
    normalize_during: set[str] = set()  # the pipeline stage entered last when the normalizer ran
    # infrastructure, not stages: the store, helpers, errors, and the memory guard each stage calls before it
    # starts (auditor.check.memory, issue 41: it checks the floor and the scoring stage, so it sits between them)
    infra = ("auditor.store", "auditor.util", "auditor.check.errors", "auditor.check.memory")
    teardown = ("close", "__exit__")

    def prof(frame, event, arg):
        if event != "call" or frame.f_code.co_name in teardown:
            return
        mod = frame.f_globals.get("__name__", "")
        back = frame.f_back
        caller = back.f_globals.get("__name__", "") if back is not None else ""
        if mod == "probes.normalize" and caller != "probes.normalize":
            # who is on the stack between auditor.check.pipeline and the normalizer
            f, chain = back, []
            while f is not None:
                chain.append(f.f_globals.get("__name__", ""))
                f = f.f_back
            normalize_callers.add(next((m for m in chain if m.startswith("auditor.")), caller))
            normalize_during.add(stages[-1] if stages else "")
        if (caller == "auditor.check.pipeline" and mod != "auditor.check.pipeline" and mod.split(".")[0] in ("auditor", "probes", "reference")
                and not mod.startswith(infra) and (not stages or stages[-1] != mod)):
            stages.append(mod)

    threading.setprofile(prof)  # the runner normalizes on its writer thread
    sys.setprofile(prof)
    try:
        run_check("sim", suite="smoke", budget_tokens=64, db_url=tiny_env["db"], config_path=tiny_env["config"])
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]  # None unsets it, as for sys.setprofile
    assert stages[:1] == ["auditor.check.planning"] or "auditor.check.planning" in stages, stages
    assert len(stages) == len(set(stages)), f"a stage module is entered twice from the pipeline: {stages}"
    for a, b in [("auditor.check.planning", "auditor.check.runner"), ("auditor.check.runner", "auditor.check.evidence"),
                 ("auditor.check.evidence", "auditor.check.run_detectors"), ("auditor.check.run_detectors", "auditor.verdict.decide")]:
        assert stages.index(a) < stages.index(b), stages
    # the runner's attempt writer (auditor.check.attempt_writer) normalizes each response on the runner's writer thread
    probing = {"auditor.check.runner", "auditor.check.attempt_writer", "auditor.check.preflight",
               "auditor.check.reference_path"}
    assert stages.index("auditor.check.preflight") == stages.index("auditor.check.runner") + 1, stages
    # the reference-path stage (echo on the reference's continuations) follows the pre-flight, before the floor
    assert stages.index("auditor.check.reference_path") == stages.index("auditor.check.preflight") + 1, stages
    assert stages.index("auditor.check.reference_path") < stages.index("auditor.check.measured_floors"), stages
    assert "auditor.check.attempt_writer" in normalize_callers and normalize_callers <= probing, normalize_callers
    assert normalize_during <= probing, normalize_during
