"""Simulator compliance-fault options (issue 13): ``ignore_seed``, ``forced_top_k`` (``--server-top-k``)
and ``inject_system_prompt``, on the profile, the engine and the ``auditor serve`` command line."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from auditor.cli import app
from simulator.engine import SimulatorEngine
from simulator.profiles import get_profile


def test_serve_flags_reach_the_profile(monkeypatch):
    import simulator.server as server

    seen = {}

    def fake_create_app(prof, **kw):
        seen["profile"] = prof
        raise RuntimeError("stop here")

    monkeypatch.setattr(server, "create_app", fake_create_app)
    r = CliRunner().invoke(app, ["serve", "--ignore-seed", "--server-top-k", "7",
                                 "--inject-system-prompt", "Be brief."])
    p = seen["profile"]
    assert p.ignore_seed is True and p.forced_top_k == 7 and p.inject_system_prompt == "Be brief."
    assert r.exit_code != 0  # the fake stopped it
    r = CliRunner().invoke(app, ["serve", "--server-top-k", "0"])
    assert r.exit_code != 0 and "server-top-k" in r.output


def test_profile_validates_forced_top_k():
    with pytest.raises(ValueError, match="forced_top_k"):
        get_profile("honest-fp32", forced_top_k=0)


def test_inject_system_prompt_changes_the_rendered_prompt(tiny_lm):
    msgs = [{"role": "user", "content": "hi"}]
    honest = SimulatorEngine(get_profile("honest-fp32"), tiny_lm)
    inj = SimulatorEngine(get_profile("honest-fp32", inject_system_prompt="SECRET RULES"), tiny_lm)
    a, b = honest.encode_chat(msgs), inj.encode_chat(msgs)
    assert a != b and "SECRET RULES" in tiny_lm.tokenizer.decode(b)
    # in front of the request's own system message, which is kept
    c = inj.encode_chat([{"role": "system", "content": "Own system."}, *msgs])
    text = tiny_lm.tokenizer.decode(c)
    assert text.index("SECRET RULES") < text.index("Own system.")
    assert msgs == [{"role": "user", "content": "hi"}]  # the caller's list is not modified


def test_ignore_seed_breaks_reproducibility(tiny_lm):
    honest = SimulatorEngine(get_profile("honest-fp32"), tiny_lm)
    bad = SimulatorEngine(get_profile("honest-fp32", ignore_seed=True), tiny_lm)
    ids = honest.encode_chat([{"role": "user", "content": "Tell me something."}])

    def run(e):
        return [t.token_id for t in e.generate(ids, max_tokens=12, temperature=1.0, seed=42).tokens]

    assert run(honest) == run(honest)
    assert run(bad) != run(bad)


def test_forced_top_k_applies_only_without_a_requested_top_k(tiny_lm):
    e = SimulatorEngine(get_profile("honest-fp32", forced_top_k=3), tiny_lm)
    assert e.effective_sampling(1.0, 1.0, 0)["top_k"] == 3
    assert e.effective_sampling(1.0, 1.0, 10)["top_k"] == 10
    assert e.effective_sampling(0.0, 1.0, 0)["top_k"] == 0
    ids = e.encode_chat([{"role": "user", "content": "Tell me something."}])
    res = e.generate(ids, max_tokens=16, temperature=1.0, seed=3, top_n=5)
    assert all(t.token_id in t.top_ids[:3] for t in res.tokens)
