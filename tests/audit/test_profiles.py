"""``auditor check`` on the real default model against the simulator's profiles (issue 5's proof).

Each case serves one profile in-process on loopback, runs ``auditor check`` through the CLI with a
small token budget on the default suite, and asserts the verdict, the exit code and the deciding
detector. The noise floor is measured once per test session (first case) into the session's own
directory (``tests/conftest.py``); the user's cache is never read.
Budgets: deviations are caught with large margins at 400 planned completion tokens; the
relaxed-threshold case needs about 250 sampled positions, so it runs at 600. PASS needs 80% power
in every family (auditor.verdict.decide); the tightest is acceptance (sampling-argmax: required positions
= (z_{alpha/m} + z_0.8)^2 * mean p(1-p) / 0.08^2, which moves with the sampled path). Measured on an
AMD EPYC (AVX-512) machine, honest-bf16 / honest-fp32: at 600 tokens n = 254 / 262 positions vs
282 / 241 required (bf16 INCONCLUSIVE by 28 — the issue-11 failure, 6 short on another CPU); at 800
326 / 321 vs 268 / 249 (+22% / +29%); at 1000 422 / 417 vs 259 / 250 (+63% / +67%). The required
count moved by 41 positions (241-282) and n by 8 between two sample paths at 600, so the honest
cases run at 1000 planned tokens: a margin of about 160 positions, four times the path-to-path
spread seen (the other families — model, truncation, decode-path — were adequate at every budget).
Run with ``-s`` to see the per-profile table (verdict, Holm p-values, tokens, wall time).
"""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from auditor.cli import app

from .conftest import SimFactory, providers_toml

pytestmark = pytest.mark.real_model

MODEL = "smollm2-135m-instruct"
CASES = [
    # profile, expected verdict, exit code, budget (planned completion tokens), detector that must reject
    ("honest-fp32", "PASS", 0, 1000, None),
    ("honest-bf16", "PASS", 0, 1000, None),
    ("int4", "QUANTIZATION", 1, 400, "logprob-divergence"),
    ("relaxed-threshold", "RELAXED_VERIFICATION", 1, 600, "sampling-argmax"),
    # at 400 tokens the flip test has few confident positions: the far divergence alone says "not the declared
    # weights at their precision" (rule 2-logprob-model-deviation) unless the flips already single out another model
    ("substituted", ("SUBSTITUTION", "QUANTIZATION_OR_SUBSTITUTION"), 1, 400, "logprob-divergence"),
    # greedy verification of sampling requests: the temperature is ignored (every sampled token is
    # the argmax) -> DECODING_NONCOMPLIANT by rule 4a (docs/detectors.md)
    ("greedy-verify", "DECODING_NONCOMPLIANT", 1, 400, "sampling-argmax"),
    ("decode-noncompliant", "DECODING_NONCOMPLIANT", 1, 400, "self-greedy"),
]

_RESULTS: list[dict] = []


@pytest.fixture(scope="module")
def real_env(real_lm, tmp_path_factory):
    from auditor.check import reference_setup

    mp = pytest.MonkeyPatch()
    mp.setitem(reference_setup._MODELS, (MODEL, "float32"), real_lm)  # share the session's model
    sims = SimFactory(real_lm, MODEL)
    yield {"sims": sims, "tmp": tmp_path_factory.mktemp("profiles")}
    sims.stop()
    mp.undo()
    if _RESULTS:
        print("\nprofile               verdict                 tokens  wall_s  Holm p (ran)")
        for r in _RESULTS:
            ps = ", ".join(f"{k}={v:.2g}" for k, v in r["p_adjusted"].items() if v is not None)
            print(f"{r['profile']:21s} {r['verdict']:23s} {r['tokens']:6d} {r['wall_s']:7.1f}  {ps}")


@pytest.mark.parametrize(("profile", "expected", "code", "budget", "rejecting"), CASES, ids=[c[0] for c in CASES])
def test_check_names_the_cause(real_env, profile, expected, code, budget, rejecting) -> None:
    tmp = real_env["tmp"]
    url = real_env["sims"].url(profile)
    cfg = tmp / f"{profile}.toml"
    cfg.write_text(providers_toml({f"sim-{profile}": url}, MODEL))
    jpath = tmp / f"{profile}.json"
    t0 = time.perf_counter()
    res = CliRunner().invoke(app, ["check", "--provider", f"sim-{profile}", "--budget-tokens", str(budget), "--config",
                                   str(cfg), "--db", f"sqlite:///{tmp / 'audits.db'}", "--json", str(jpath), "--no-progress"])
    wall = time.perf_counter() - t0
    real_env["sims"].stop(profile)
    assert jpath.exists(), res.output
    d = json.loads(jpath.read_text())
    _RESULTS.append({"profile": profile, "verdict": d["verdict"], "tokens": d["tokens"]["total"], "wall_s": wall,
                     "p_adjusted": {x["name"]: x["p_adjusted"] for x in d["detectors"] if x["ran"]}})
    assert d["verdict"] in ((expected,) if isinstance(expected, str) else expected), d["verdict_reason"]
    assert res.exit_code == code
    assert d["tokens"]["completion"] <= budget
    by = {x["name"]: x for x in d["detectors"]}
    if rejecting is None:
        assert not any(x["rejects"] for x in d["detectors"])
    else:
        assert by[rejecting]["rejects"], by[rejecting]
        ev = by[rejecting]["evidence"]
        assert ev and {"prompt_id", "position", "token_id", "token"} <= set(ev[0])
    if profile == "relaxed-threshold":  # the reported distribution is right; only the sampling law is not
        assert not by["logprob-divergence"]["rejects"] and by["logprob-divergence"]["ran"]
    if profile == "decode-noncompliant":
        assert not by["logprob-divergence"]["rejects"]
    if profile == "honest-bf16":  # measurably not fp32, yet within the honest floor
        assert by["logprob-divergence"]["effect"] > 1e-5
