"""The reference-path stage (auditor/check/reference_path.py): echo requests on the reference's own greedy
continuations, sent only when the provider can answer them, stored and re-read on resume, aligned
position by position; a provider that ignores echo leaves the test unavailable and the audit whole."""

from __future__ import annotations

import functools
import json

import httpx
import pytest

from auditor.check import reference_path as rpath
from auditor.check.pipeline import run_check
from auditor.store import open_store
from auditor.store import queries as q
from probes.records import TokenRecord


def _toml(name: str, url: str, *, api: str = "completions", echo: bool = True) -> str:
    return (f'[providers.{name}]\nbase_url = "{url}"\nmodel = "tiny"\napi = "{api}"\nreference = "tiny-ref"\n'
            f"timeout_s = 300\n\n[providers.{name}.capabilities]\nmax_top_logprobs = 5\nlogprobs = true\n"
            f"n = true\nseed = true\nstreaming = true\necho = {'true' if echo else 'false'}\n\n"
            f"[providers.{name}.rate_limits]\nconcurrency = 2\n\n")


@pytest.fixture
def env(tmp_path, tiny_sims, tiny_lm, small_floors, monkeypatch):
    from auditor.check import reference_setup

    monkeypatch.setitem(reference_setup._MODELS, ("tiny-ref", "float32"), tiny_lm)
    url = tiny_sims.url("int4")  # a perturbed copy: σ̂ > 0 along the echoed positions
    cfg = tmp_path / "providers.toml"
    cfg.write_text(_toml("echo", url) + _toml("noecho", url, echo=False) + _toml("chat", url, api="chat", echo=False))
    sent: list[dict] = []
    orig = rpath._send

    async def spy(config, bodies, transport):
        sent.extend(bodies)
        return await orig(config, bodies, transport)

    monkeypatch.setattr(rpath, "_send", spy)
    return {"config": str(cfg), "db": f"sqlite:///{tmp_path / 'a.db'}", "sent": sent}


def _run(env, provider, **kw):
    return run_check(provider, suite="smoke", budget_tokens=96, db_url=env["db"], config_path=env["config"], **kw)


def _summary(env, run_id) -> dict:
    st = open_store(env["db"])
    with st.session() as s:
        out = dict(q.get_run(s, run_id).summary or {})
    st.close()
    return out


def _lp_details(rep) -> dict:
    return rep.detector("logprob-divergence")["details"] or {}


def test_echo_sent_only_for_completions_with_echo_and_resume_rereads(env, monkeypatch) -> None:
    for name in ("chat", "noecho"):
        rep = _run(env, name)
        assert rep.status == "completed" and env["sent"] == [], name
        assert "reference_path" not in _summary(env, rep.run_id)
    rep = _run(env, "echo")
    sent = list(env["sent"])
    assert 1 <= len(sent) <= rpath.REFERENCE_PATH_PROMPTS
    assert all(b["echo"] is True and b["logprobs"] == 5 and b["max_tokens"] == 1 and b["temperature"] == 0.0
               for b in sent)
    prompts = [b["prompt"] for b in sent]
    assert len(set(prompts)) == len(prompts)
    items = _summary(env, rep.run_id)["reference_path"]["items"]
    assert len(items) == len(sent) and all(it["ok"] and it["tokens"] for it in items)
    for it, b in zip(items, sent, strict=True):
        assert b["prompt"].startswith(it["prompt"]) and len(it["continuation_ids"]) >= 2
    # the statistic, from the stored echoes, along the reference's continuations
    st = open_store(env["db"])
    from auditor.check.reference_setup import _MODELS, resolve_reference

    ref = resolve_reference("tiny-ref", models={"float32": _MODELS[("tiny-ref", "float32")]})
    res = rpath.evaluate_reference_path(items, ref, st)
    st.close()
    assert res.available and res.counts["positions"] > 0 and res.stats["sigma_hat"] is not None
    assert res.details["reference_path_n_positions"] == res.counts["positions"]
    assert rep.detector("logprob-divergence")["ran"]  # the feature rides in its details
    d = _lp_details(rep)
    assert d["reference_path_available"] is True and d["reference_path_n_positions"] == res.counts["positions"]
    assert d["reference_path_flip_ratio"] == pytest.approx(res.stats["confident_flip_ratio"])
    from auditor.report.markdown import render_markdown

    assert "reference's continuations via echo " in render_markdown(rep)  # both paths' figures in the report
    # resume: the stored echoes are re-read, nothing is sent or generated again
    env["sent"].clear()
    monkeypatch.setattr(rpath, "run_reference_path", lambda *a, **k: pytest.fail("echo sent again on resume"))
    again = _run(env, "echo", resume=rep.run_id)
    assert again.verdict == rep.verdict and env["sent"] == []
    assert again.to_dict()["detectors"] == rep.to_dict()["detectors"]


def _ignoring_echo(request: httpx.Request) -> httpx.Response:
    """A completions server that ignores ``echo``: only the generated token comes back."""
    body = {"id": "x", "object": "text_completion", "model": "tiny",
            "choices": [{"index": 0, "text": " x", "finish_reason": "length",
                         "logprobs": {"tokens": [" x"], "token_logprobs": [-0.1], "top_logprobs": [{" x": -0.1}],
                                      "text_offset": [0]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}
    return httpx.Response(200, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


def test_provider_ignoring_echo_leaves_the_test_unavailable(env, monkeypatch) -> None:
    monkeypatch.setattr(rpath, "reference_path_stage",
                        functools.partial(rpath.reference_path_stage, transport=httpx.MockTransport(_ignoring_echo)))
    rep = _run(env, "echo")
    assert rep.status == "completed" and env["sent"]
    items = _summary(env, rep.run_id)["reference_path"]["items"]
    assert items and all(it["ok"] and not it["tokens"] and "echo_ignored" in it["anomalies"] for it in items)
    st = open_store(env["db"])
    from auditor.check.reference_setup import _MODELS, resolve_reference

    ref = resolve_reference("tiny-ref", models={"float32": _MODELS[("tiny-ref", "float32")]})
    res = rpath.evaluate_reference_path(items, ref, st)
    st.close()
    assert not res.available and rpath.ECHO_UNAVAILABLE in (res.reason or "")
    assert res.counts["echo_ignored"] == len(items)
    assert rep.detector("logprob-divergence")["ran"]
    d = _lp_details(rep)
    assert d["reference_path_available"] is False and rpath.ECHO_UNAVAILABLE in d["reference_path_reason"]
    from auditor.report.markdown import render_markdown

    assert "reference's continuations via echo: not available" in render_markdown(rep)


def test_alignment_keeps_only_one_to_one_positions_inside_the_continuation(tiny_lm) -> None:
    tok = tiny_lm.tokenizer
    from probes.align import _byte_vocab

    bv = _byte_vocab(tok)
    prompt = "Question: What is the capital of France?\nAnswer:"
    cont = tok.encode(" The capital of France is Paris.", add_special_tokens=False)
    assert len(cont) >= 5

    def rec(i, b):
        return TokenRecord(index=i, token=b.decode("utf-8", "replace"), bytes=b, logprob=-0.5)

    pids = tok.encode(prompt, add_special_tokens=False)
    toks = [rec(i, bv.id_bytes[t]) for i, t in enumerate(pids)]
    n0 = len(toks)
    cb = [bv.id_bytes[t] for t in cont]
    # position 0 as the reference has it; position 1 split in two provider tokens (no 1:1 position);
    # positions 2.. as the reference has them, except position 3 merged with 4 into one token
    toks.append(rec(len(toks), cb[0]))
    toks += [rec(len(toks), cb[1][:1]), rec(len(toks) + 1, cb[1][1:])]
    toks.append(rec(len(toks), cb[2]))
    toks.append(rec(len(toks), cb[3] + cb[4]))
    for b in cb[5:]:
        toks.append(rec(len(toks), b))
    pairs = rpath.align_echo(toks, prompt, cont, tok)
    kept = [j for _i, j in pairs]
    assert kept == [0, 2, *range(5, len(cont))]
    assert all(i >= n0 for i, _j in pairs)  # never a prompt position
    # a token whose bytes match but whose id does not (unknown bytes end the walk)
    toks2 = list(toks)
    toks2[n0] = TokenRecord(index=n0, token="?", bytes=None, logprob=-0.5)
    assert rpath.align_echo(toks2, prompt, cont, tok) == []
