"""Resumable probe runs against the provider simulator and a small fault-injecting server.

- the simulator (``simulator``, tiny model) with 20% faults (429 + Retry-After, 500,
  slow past the timeout, truncated streams, malformed JSON): a 200-probe run completes; the
  database holds every attempt; no probe is missing or duplicated; retries are visible;
- a run killed with SIGKILL mid-way (subprocess ``python -m auditor probe``) and resumed ends with
  exactly the probes of an uninterrupted run;
- no API key value appears in the database file or the captured output/logs;
- the own fault server (``conftest.make_fault_app``, known answers) checks stored tokens,
  logprobs, usage and USD exactly, in-process interruption/resume, and PostgreSQL.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from auditor.check.runner import RunnerError, plan_suite, run_probes, summarize_run
from auditor.store import open_store
from auditor.store import queries as q
from auditor.store.models import ProbeAttempt
from probes.config import Capabilities, ConfigError, Pricing, ProviderConfig, RateLimits, RetryPolicy
from probes.suites import Probe, Suite

from .conftest import _completion_tokens

REPO = Path(__file__).resolve().parents[2]
FAULTS = {"fault_rate": 0.2, "slow_s": 2.3}  # slow = past the 2 s client timeout


def make_suite(n_requests: int, name: str = "store-test") -> Suite:
    """A suite of exactly ``n_requests`` requests: greedy, logprob and sampling probes (2 samples)."""
    probes = []
    i = 0
    total = 0
    while total < n_requests:
        mode = ("greedy", "logprob", "sampling")[i % 3]
        n = 2 if mode == "sampling" and n_requests - total >= 2 else 1
        if mode == "sampling" and n == 1:
            mode = "greedy"
        probes.append(
            Probe(
                id=f"chat-{mode}-{i:03d}",
                workload="chat",
                mode=mode,
                messages=[{"role": "user", "content": f"Say something about item {i}."}],
                max_tokens=6 + i % 5,
                temperature=1.0 if mode == "sampling" else 0.0,
                top_logprobs=5 if mode == "logprob" else (2 if mode == "sampling" else None),
                n_samples=n,
                seed=1000 + i if mode == "sampling" else None,
            )
        )
        total += n
        i += 1
    return Suite(name=name, version="1", description="test", probes=probes)


def make_config(
    base_url: str, *, key_env: str | None = None, concurrency: int = 8, model: str = "tiny"
) -> ProviderConfig:
    return ProviderConfig(
        name="fault-sim",
        base_url=base_url,
        model=model,
        api="chat",
        api_key_env=key_env,
        capabilities=Capabilities(max_top_logprobs=5, seed=True, streaming=True),
        rate_limits=RateLimits(concurrency=concurrency),
        retry=RetryPolicy(max_attempts=10, backoff_initial_s=0.01, backoff_max_s=0.05, max_retry_after_s=0.1),
        timeout_s=2.0,
        pricing=Pricing(usd_per_1m_input=1.0, usd_per_1m_output=2.0),
    )


def _probe_fingerprint(store, run_id: str) -> dict[str, tuple]:
    """{probe_key: (status, text, [(token, logprob)...])} of a run."""
    out = {}
    with store.session() as s:
        toks = q.tokens_per_probe(s, run_id, status=None)
        for p in q.list_probes(s, run_id):
            out[p.probe_key] = (p.status, p.text, [(t.token, t.logprob) for t in toks.get(p.probe_key, [])])
    return out


def _check_attempt_invariants(store, run_id: str) -> Counter:
    """Every probe: attempts numbered 1..n without gaps, n == probes.n_attempts, exactly the last
    attempt succeeded for a done probe, every earlier one failed. Returns error kinds seen."""
    kinds: Counter = Counter()
    with store.session() as s:
        for p in q.list_probes(s, run_id):
            atts = q.attempts_for_probe(s, p.id)
            assert [a.attempt_no for a in atts] == list(range(1, len(atts) + 1)), p.probe_key
            assert len(atts) == p.n_attempts >= 1, p.probe_key
            assert p.status == "done", (p.probe_key, p.status)
            assert atts[-1].error is None and atts[-1].http_status == 200
            for a in atts[:-1]:
                assert a.error is not None
                kinds[a.error.split(":", 1)[0]] += 1
    return kinds


@pytest.mark.parametrize("sim_server", [dict(rate=0.2)], indirect=True)
def test_200_probe_simulator_run_with_faults(sim_server, sqlite_url, monkeypatch):
    """The simulator (tiny model) with 20% faults: the run completes, the database holds every
    attempt the server saw, no probe is missing or duplicated, retries are visible."""
    key = "sk-" + secrets.token_hex(16)
    monkeypatch.setenv("FAULT_SIM_KEY", key)
    suite = make_suite(200)
    plan_keys = [it.probe_key for it in plan_suite(suite)]
    assert len(plan_keys) == len(set(plan_keys)) == 200
    store = open_store(sqlite_url)
    t0 = time.perf_counter()
    rid = run_probes(
        store, make_config(sim_server.base_url, key_env="FAULT_SIM_KEY", model=sim_server.model), suite, progress=None
    )
    elapsed = time.perf_counter() - t0
    with store.session() as s:
        keys = [p.probe_key for p in q.list_probes(s, rid)]
        n_att = s.scalar(sa.select(sa.func.count()).select_from(ProbeAttempt).where(ProbeAttempt.run_id == rid))
    assert sorted(keys) == sorted(plan_keys)  # none missing, none duplicated
    kinds = _check_attempt_invariants(store, rid)
    # every attempt the server saw is stored; the only extra ones allowed are client timeouts
    # (beyond the injected slow answers) whose request never reached the server under load
    unseen = n_att - sim_server.faults.n_requests
    assert 0 <= unseen <= kinds["timeout"] - sim_server.faults.counts.get("slow", 0), (unseen, kinds)
    assert {"rate_limited", "server_error", "timeout", "malformed_json"} <= set(kinds), kinds
    assert kinds["truncated_stream"] + kinds["malformed_json"] >= sim_server.faults.counts.get("truncated", 0)
    summ = summarize_run(store, rid)
    assert summ.status == "completed" and summ.probes_ok == 200 and summ.probes_pending == 0
    # every injected fault cost one failed attempt and one retry (load may add client timeouts)
    assert summ.retries == summ.failed_attempts == n_att - 200 >= sum(sim_server.faults.counts.values()) > 20
    assert summ.http_status_counts.get("429", 0) == sim_server.faults.counts.get("rate_limit", 0)
    assert summ.http_status_counts.get("500", 0) == sim_server.faults.counts.get("server_error", 0)
    assert summ.tokens > 0 and summ.completion_tokens > 0
    store.close()
    _assert_no_secret_in_files(sqlite_url, key)
    print(
        f"simulator fault run: {n_att} attempts for 200 probes, faults={sim_server.faults.counts}, "
        f"error kinds={dict(kinds)}, {elapsed:.1f}s"
    )


@pytest.mark.parametrize("fault_server", [FAULTS], indirect=True)
def test_fault_run_stores_exact_responses_and_costs(fault_server, sqlite_url, monkeypatch):
    """Own fault server (known answers): stored tokens/logprobs, usage and USD are exact."""
    key = "sk-" + secrets.token_hex(16)
    monkeypatch.setenv("FAULT_SIM_KEY", key)
    suite = make_suite(60)
    plan_keys = [it.probe_key for it in plan_suite(suite)]
    assert len(plan_keys) == 60
    cfg = make_config(fault_server.base_url, key_env="FAULT_SIM_KEY")
    store = open_store(sqlite_url)
    seen = []
    rid = run_probes(store, cfg, suite, progress=lambda st: seen.append(st.done))

    with store.session() as s:
        keys = [p.probe_key for p in q.list_probes(s, rid)]
        n_att = s.scalar(sa.select(sa.func.count()).select_from(ProbeAttempt).where(ProbeAttempt.run_id == rid))
        assert q.get_run(s, rid).status == "completed"
    assert sorted(keys) == sorted(plan_keys) and len(set(keys)) == 60  # none missing, none duplicated
    server_requests = sum(fault_server.counts.values())
    kinds = _check_attempt_invariants(store, rid)
    unseen = n_att - server_requests  # as in the simulator test: only unseen client timeouts
    assert 0 <= unseen <= kinds["timeout"] - fault_server.counts.get("slow", 0), (unseen, kinds)
    # retries are visible, for every fault kind the server injected
    # each injected fault is stored as a failed attempt of the matching kind (load may add timeouts)
    c = fault_server.counts
    assert (kinds["rate_limited"], kinds["server_error"], kinds["malformed_json"]) == (
        c.get("429", 0),
        c.get("500", 0),
        c.get("malformed", 0),
    ), (kinds, c)
    assert kinds["timeout"] >= c.get("slow", 0) and kinds["truncated_stream"] >= c.get("truncated", 0)
    assert sum(kinds.values()) >= 5
    summ = summarize_run(store, rid)
    assert summ.probes_ok == 60 and summ.probes_failed == 0 and summ.probes_pending == 0
    assert summ.attempts == n_att and summ.retries == n_att - 60 > 3
    assert summ.http_status_counts.get("429", 0) == fault_server.counts.get("429", 0)
    # normalized tokens match what the server generated
    fp = _probe_fingerprint(store, rid)
    payloads = {k: json.loads(json.dumps(v)) for k, v in ((p.probe_key, p.request_json) for p in _probes(store, rid))}
    n_tokens = n_completion = 0
    for k, (_status, text, toks) in fp.items():
        want = _completion_tokens(payloads[k])
        assert text == "".join(t for t, _, _ in want)
        n_completion += len(want)
        if payloads[k].get("logprobs"):  # per-token records exist only where logprobs were asked
            assert [t for t, _ in toks] == [t for t, _, _ in want]
            assert [lp for _, lp in toks] == pytest.approx([lp for _, lp, _ in want])
            n_tokens += len(want)
        else:
            assert toks == []
    assert summ.tokens == n_tokens > 0
    assert summ.completion_tokens == n_completion and summ.prompt_tokens == 60 * 11
    assert summ.cost_usd == pytest.approx((60 * 11 * 1.0 + n_completion * 2.0) / 1e6)
    assert seen and seen[-1] == 60 and seen == sorted(seen)
    # the key was sent (so the scan below is meaningful) and never stored
    assert all(h.get("authorization") == f"Bearer {key}" for h in fault_server.headers_seen)
    store.close()
    _assert_no_secret_in_files(sqlite_url, key)


def _fingerprint_attempts(store) -> list[str]:
    """Error kind of every stored failed attempt (all runs)."""
    with store.session() as s:
        return [
            e.split(":", 1)[0] for e in s.scalars(sa.select(ProbeAttempt.error).where(ProbeAttempt.error.is_not(None)))
        ]


def _probes(store, rid):
    with store.session() as s:
        return q.list_probes(s, rid)


def _assert_no_secret_in_files(sqlite_url: str, key: str) -> None:
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    files = [p for p in path.parent.iterdir() if p.name.startswith(path.name)]
    assert files
    for f in files:
        blob = f.read_bytes()
        assert key.encode() not in blob, f
        assert key[3:].encode() not in blob, f


@pytest.mark.parametrize("fault_server", [FAULTS], indirect=True)
def test_interrupted_run_resumes_to_the_same_probes(fault_server, tmp_path, monkeypatch, caplog):
    """In-process: a KeyboardInterrupt after 25 probes, an automatic resume, and an
    uninterrupted run end with identical probes; mismatched configs refuse to resume."""
    caplog.set_level(logging.DEBUG)
    key = "sk-" + secrets.token_hex(16)
    monkeypatch.setenv("FAULT_SIM_KEY", key)
    suite = make_suite(60)
    cfg = make_config(fault_server.base_url, key_env="FAULT_SIM_KEY", concurrency=4)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    store = open_store(url)

    def stop_after_25(st):
        if st.done >= 25:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_probes(store, cfg, suite, progress=stop_after_25)
    with store.session() as s:
        (run,) = q.list_runs(s)
        rid = run.id
        assert run.status == "interrupted"
        counts = q.probe_counts(s, rid)
        assert counts.get("pending", 0) > 0 and counts.get("done", 0) >= 25 and sum(counts.values()) == 60

    # a changed provider config (different request bodies) refuses to resume that run
    other = cfg.model_copy(update={"extra_body": {"top_k": 1}})
    with pytest.raises(RunnerError, match="differs"):
        run_probes(store, other, suite, run_id=rid, progress=None)
    with pytest.raises(RunnerError, match="no run"):
        run_probes(store, cfg, suite, run_id="ffffffffffff", progress=None)

    resumed = []
    rid2 = run_probes(store, cfg, suite, progress=None, on_start=lambda r, res: resumed.append((r, res)))
    assert rid2 == rid and resumed == [(rid, True)]
    fresh = run_probes(store, cfg, suite, resume=False, progress=None)
    assert fresh != rid
    _check_attempt_invariants(store, rid)
    assert _probe_fingerprint(store, rid) == _probe_fingerprint(store, fresh)
    with store.session() as s:
        assert q.get_run(s, rid).status == "completed"
    # nothing to resume now: a third call starts a new run
    third = run_probes(store, cfg, suite, progress=None)
    assert third not in (rid, fresh)
    store.close()
    assert key not in caplog.text
    _assert_no_secret_in_files(url, key)


def test_missing_api_key_env_fails_before_writing(tmp_path, monkeypatch):
    monkeypatch.delenv("NOPE_KEY_XYZ", raising=False)
    store = open_store(f"sqlite:///{tmp_path / 'k.db'}")
    cfg = make_config("http://127.0.0.1:9/v1", key_env="NOPE_KEY_XYZ")
    with pytest.raises(ConfigError, match="NOPE_KEY_XYZ"):
        run_probes(store, cfg, make_suite(3), progress=None)
    with store.session() as s:
        assert q.list_runs(s) == []
    store.close()


def _write_inputs(tmp_path: Path, base_url: str, suite: Suite) -> tuple[Path, Path]:
    toml = tmp_path / "providers.toml"
    toml.write_text(
        f"""
[providers.fault-sim]
base_url = "{base_url}"
model = "tiny"
api = "chat"
api_key_env = "FAULT_SIM_KEY"
timeout_s = 2.0
[providers.fault-sim.capabilities]
max_top_logprobs = 5
seed = true
streaming = true
[providers.fault-sim.rate_limits]
concurrency = 4
[providers.fault-sim.retry]
max_attempts = 10
backoff_initial_s = 0.01
backoff_max_s = 0.05
max_retry_after_s = 0.1
[providers.fault-sim.pricing]
usd_per_1m_input = 1.0
usd_per_1m_output = 2.0
"""
    )
    sj = tmp_path / "suite.json"
    sj.write_text(suite.model_dump_json())
    return toml, sj


def _cli(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "auditor", "probe", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _done_count(url: str) -> tuple[str | None, int]:
    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            row = c.execute(
                sa.text("select run_id, count(*) from probes where status != 'pending' group by run_id")
            ).first()
            return (row[0], int(row[1])) if row else (None, 0)
    except sa.exc.OperationalError:
        return None, 0
    finally:
        eng.dispose()


@pytest.mark.parametrize("sim_server", [dict(rate=0.2)], indirect=True)
def test_sigkill_mid_run_then_resume_matches_uninterrupted(sim_server, tmp_path):
    key = "sk-" + secrets.token_hex(16)
    env = dict(os.environ, FAULT_SIM_KEY=key, PYTHONUNBUFFERED="1")
    env.pop("AUDITOR_DB_URL", None)
    suite = make_suite(100)
    toml, sj = _write_inputs(tmp_path, sim_server.base_url, suite)
    url = f"sqlite:///{tmp_path / 'kill.db'}"
    common = ["--provider", "fault-sim", "--suite", str(sj), "--config", str(toml), "--db", url, "--no-progress"]
    outputs = []

    # 1) start, SIGKILL once some probes are done (and well before the end)
    proc = _cli(common, env)
    deadline = time.time() + 120
    rid, done = None, 0
    while time.time() < deadline and done < 30:
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
        rid, done = _done_count(url)
    os.kill(proc.pid, signal.SIGKILL)
    outputs.append(proc.communicate(timeout=30)[0])
    assert proc.returncode == -signal.SIGKILL
    rid_after, done_after = _done_count(url)
    assert rid_after == rid and 30 <= done_after < 100

    # 2) resume explicitly by id
    res = subprocess.run(
        [sys.executable, "-m", "auditor", "probe", *common, "--resume", rid, "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    outputs += [res.stdout, res.stderr]
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads(res.stdout)
    assert summary["run_id"] == rid and summary["status"] == "completed"
    assert summary["probes_ok"] == 100 and summary["probes_pending"] == 0 and summary["retries"] > 0
    assert f"resuming run {rid}" in res.stderr

    # 3) an uninterrupted run of the same suite
    res2 = subprocess.run(
        [sys.executable, "-m", "auditor", "probe", *common, "--new"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    outputs += [res2.stdout, res2.stderr]
    assert res2.returncode == 0, res2.stdout + res2.stderr
    assert "100 ok, 0 failed, 0 pending" in res2.stdout

    store = open_store(url)
    with store.session() as s:
        runs = q.list_runs(s)
        assert len(runs) == 2
        fresh = next(r.id for r in runs if r.id != rid)
        assert all(r.status == "completed" for r in runs)
        assert q.get_run(s, rid).code_version and q.get_run(s, rid).suite_version == "1"
    _check_attempt_invariants(store, rid)
    a, b = _probe_fingerprint(store, rid), _probe_fingerprint(store, fresh)
    assert sorted(a) == sorted(it.probe_key for it in plan_suite(suite))
    assert a == b
    with store.session() as s:  # attempts in the DB == requests the server saw, except those
        n_att = s.scalar(sa.select(sa.func.count()).select_from(ProbeAttempt))  # in flight at the kill
    n_timeouts = sum(1 for p in _fingerprint_attempts(store) if p == "timeout")
    slack = max(0, n_timeouts - sim_server.faults.counts.get("slow", 0))
    assert sim_server.faults.n_requests - 4 <= n_att <= sim_server.faults.n_requests + slack
    assert summary["retries"] > 0
    store.close()
    joined = "\n".join(outputs)
    assert key not in joined and key[3:] not in joined
    _assert_no_secret_in_files(url, key)


@pytest.mark.postgres
@pytest.mark.parametrize("fault_server", [dict(FAULTS, slow_s=0.0)], indirect=True)
def test_fault_run_on_postgres(fault_server, pg_url, monkeypatch):
    """The same runner on PostgreSQL: every attempt stored, no probe missing or duplicated."""
    monkeypatch.setenv("FAULT_SIM_KEY", "sk-" + secrets.token_hex(8))
    suite = make_suite(40)
    store = open_store(pg_url)
    try:
        rid = run_probes(store, make_config(fault_server.base_url, key_env="FAULT_SIM_KEY"), suite, progress=None)
        _check_attempt_invariants(store, rid)
        summ = summarize_run(store, rid)
        assert summ.status == "completed" and summ.probes_ok == 40
        assert summ.attempts == sum(fault_server.counts.values()), (
            summ.error_kinds,
            summ.http_status_counts,
            fault_server.counts,
        )
        with store.session() as s:
            assert sorted(p.probe_key for p in q.list_probes(s, rid)) == sorted(
                it.probe_key for it in plan_suite(suite)
            )
    finally:
        store.close()
