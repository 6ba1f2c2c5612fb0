"""``auditor check`` with the reference backends: ``--device``/``--dtype`` (the CUDA branch exercised on
CPU through the same code, GPU visibility patched), ``reference = "none"`` (reference-free tests only,
the untested causes named), ``kind = "vllm"`` (a second simulator as the trusted engine) and the
exit-3 errors of each (tiny random model: plumbing; the real-model verdicts are marked real_model)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from auditor.check.errors import AuditError
from auditor.check.pipeline import run_check
from auditor.check.reference_setup import check_device
from auditor.cli import app

from .conftest import providers_toml

REFERENCE_DETECTORS = ("greedy-match", "logprob-divergence", "sampling-gof", "sampling-argmax", "sampling-tail")


@pytest.fixture
def env(tmp_path, tiny_sims, tiny_lm, small_floors, monkeypatch):
    """Providers 'sim' (honest tiny simulator, reference tiny-ref), 'noref' (same, reference none) and
    'viavllm' (same, reference = a second simulator process acting as the trusted vLLM engine)."""
    from auditor.check import reference_setup
    from simulator.server import ServerThread, create_app

    monkeypatch.setitem(reference_setup._MODELS, ("tiny-ref", "float32"), tiny_lm)
    url = tiny_sims.url("honest-fp32")
    trusted = ServerThread(create_app("honest-fp32", lm=tiny_lm, served_model_name="tiny-trusted", seed=1),
                           timeout=120).start()
    tok_dir = tmp_path / "tok"
    tiny_lm.tokenizer.save_pretrained(tok_dir)
    cfg = tmp_path / "providers.toml"
    cfg.write_text(
        providers_toml({"sim": url}, "tiny", reference="tiny-ref")
        + providers_toml({"noref": url}, "tiny", reference="none")
        + providers_toml({"viavllm": url}, "tiny", reference="trusted")
        + providers_toml({"deadref": url}, "tiny", reference="deadvllm")
        + f'[references.trusted]\nkind = "vllm"\nmodel = "tiny-trusted"\nbase_url = "{trusted.base_url}"\n'
          f'tokenizer = "{tok_dir}"\n\n'
        + f'[references.deadvllm]\nkind = "vllm"\nmodel = "tiny-trusted"\nbase_url = "http://127.0.0.1:9/v1"\n'
          f'tokenizer = "{tok_dir}"\ntimeout_s = 2\n'
    )
    yield {"config": str(cfg), "db": f"sqlite:///{tmp_path / 'a.db'}", "tmp": tmp_path}
    trusted.stop()


def _no_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def _gpus(monkeypatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


# ------------------------------------------------------------------------------------------ --device
@pytest.mark.parametrize(("device", "gpus", "error"), [
    ("cpu", 0, None), ("auto", 0, None), ("auto", 1, None), ("cuda", 1, None), ("cuda:1", 2, None),
    ("cuda", 0, "no CUDA GPU"), ("cuda:0", 0, "no CUDA GPU"), ("cuda:2", 2, "only 2"), ("tpu", 0, "not supported"),
])
def test_check_device_validates_the_cuda_branch_on_cpu(monkeypatch, device, gpus, error) -> None:
    _gpus(monkeypatch, gpus)
    if error is None:
        check_device(device, "bfloat16")
    else:
        with pytest.raises(AuditError, match=error) as ei:
            check_device(device)
        assert ei.value.parameter == "device" and ei.value.exit_code == 3


def test_check_dtype_errors() -> None:
    with pytest.raises(AuditError, match="float8") as ei:
        check_device("cpu", "float8")
    assert ei.value.parameter == "dtype"


@pytest.mark.parametrize(("cmd", "extra"), [
    ("check", ["--provider", "sim"]),
    ("calibrate", ["--profiles", "honest-fp32"]),
    ("serve", []),
])
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cli_cuda_without_gpu_exits_3(env, monkeypatch, cmd, extra, device) -> None:
    _no_gpu(monkeypatch)
    args = [cmd, *extra, "--device", device]
    if cmd == "check":
        args += ["--config", env["config"], "--db", env["db"], "--no-progress"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 3, res.output
    assert "Traceback" not in res.output and "error:" in res.output
    assert "no CUDA GPU" in res.output and "--device" in res.output


def test_cli_bad_dtype_exits_3(env) -> None:
    res = CliRunner().invoke(app, ["check", "--provider", "sim", "--dtype", "float8", "--config", env["config"],
                                   "--db", env["db"], "--no-progress"])
    assert res.exit_code == 3 and "float8" in res.output, res.output


def test_device_and_dtype_reach_the_loader(env, monkeypatch, tiny_lm) -> None:
    """The CUDA path of the reference loading, run on CPU: GPU visibility patched, the loader recorded."""
    from auditor.check import reference_setup

    _gpus(monkeypatch, 1)
    seen = []

    def fake_load(model, *, dtype, device, device_map=None, max_memory=None):
        seen.append((model, dtype, device))
        return tiny_lm

    import reference.models

    monkeypatch.setattr(reference.models, "load_model", fake_load)
    try:
        lms = reference_setup.get_reference_models("tiny-cuda", ["float32"], device="cuda:0")
        assert lms == {"float32": tiny_lm} and seen == [("tiny-cuda", "float32", "cuda:0")]
        assert ("tiny-cuda", "float32", "cuda:0") in reference_setup._MODELS
    finally:
        reference_setup._MODELS.pop(("tiny-cuda", "float32", "cuda:0"), None)


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_run_check_with_device_and_dtype(env, monkeypatch, device) -> None:
    """--device auto without a GPU and --device cpu give the same audit; --dtype keeps one precision."""
    _no_gpu(monkeypatch)
    rep = run_check("sim", suite="smoke", budget_tokens=64, db_url=env["db"], config_path=env["config"],
                    device=device, dtype="float32")
    assert rep.verdict in ("PASS", "INCONCLUSIVE")
    assert rep.reference.get("dtype") == "float32"  # --dtype keeps one precision


# ------------------------------------------------------------------------------------------ none
def _ran(rep) -> set[str]:
    return {d["name"] for d in rep.detectors if d.get("ran")}


def test_reference_none_runs_only_the_self_tests(env) -> None:
    rep = run_check("noref", suite="smoke", budget_tokens=64, db_url=env["db"], config_path=env["config"])
    assert rep.verdict in ("PASS", "INCONCLUSIVE", "RELAXED_VERIFICATION", "DECODING_NONCOMPLIANT")
    assert "QUANTIZATION not tested: no reference" in rep.verdict_reason
    assert "SUBSTITUTION not tested: no reference" in rep.verdict_reason
    assert not _ran(rep) & set(REFERENCE_DETECTORS), _ran(rep)
    assert "self-greedy" in _ran(rep)
    assert rep.verdict_details["not_tested"] == {"QUANTIZATION": "no reference (reference = 'none')",
                                                 "SUBSTITUTION": "no reference (reference = 'none')"}
    assert rep.reference.get("revision") in ("none", None)


def test_reference_none_cli_exit_code_matches_verdict(env) -> None:
    res = CliRunner().invoke(app, ["check", "--provider", "noref", "--suite", "smoke", "--budget-tokens", "64",
                                   "--config", env["config"], "--db", env["db"], "--no-progress", "--format", "markdown"])
    assert res.exit_code in (0, 1, 2), res.output
    assert "QUANTIZATION not tested: no reference" in res.stdout


# ------------------------------------------------------------------------------------------ vllm
def test_vllm_reference_gives_the_local_verdict(env) -> None:
    local = run_check("sim", suite="smoke", budget_tokens=96, db_url=env["db"], config_path=env["config"],
                      dtype="float32")
    remote = run_check("viavllm", suite="smoke", budget_tokens=96, db_url=env["db"], config_path=env["config"])
    assert remote.verdict == local.verdict, (local.verdict_reason, remote.verdict_reason)
    assert "greedy-match" in _ran(remote) and "sampling-gof" in _ran(remote)
    assert remote.reference.get("dtype") == "server" and str(remote.reference.get("revision")).startswith("vllm:")


@pytest.fixture
def plain_openai_server():
    """An OpenAI-compatible /v1/completions without vLLM's prompt_logprobs."""
    from fastapi import FastAPI

    from simulator.server import ServerThread

    plain = FastAPI()

    @plain.post("/v1/completions")
    async def completions() -> dict:
        return {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": "x", "logprobs": None,
                                                                      "finish_reason": "length"}]}

    srv = ServerThread(plain, timeout=60).start()
    yield srv.base_url
    srv.stop()


@pytest.mark.parametrize(("provider", "needle"), [
    ("deadref", "does not answer"),
    ("plainref", "prompt_logprobs"),
])
def test_vllm_reference_errors_exit_3_before_probing(env, plain_openai_server, provider, needle) -> None:
    from pathlib import Path

    from auditor.store import open_store
    from auditor.store import queries as q

    cfg = Path(env["config"])
    tok_dir = env["tmp"] / "tok"
    cfg.write_text(cfg.read_text() + providers_toml({"plainref": "http://127.0.0.1:9/v1"}, "tiny", reference="plain")
                   + f'[references.plain]\nkind = "vllm"\nmodel = "m"\nbase_url = "{plain_openai_server}"\n'
                     f'tokenizer = "{tok_dir}"\n')
    res = CliRunner().invoke(app, ["check", "--provider", provider, "--suite", "smoke", "--config", env["config"],
                                   "--db", env["db"], "--no-progress"])
    assert res.exit_code == 3 and needle in res.output and "Traceback" not in res.output, res.output
    store = open_store(env["db"])
    try:
        with store.session() as s:
            assert not [r for r in q.list_runs(s) if getattr(r, "provider", None) == provider]
    finally:
        store.close()


def test_unknown_reference_name_exits_3(env, tmp_path) -> None:
    cfg = tmp_path / "p2.toml"
    cfg.write_text(providers_toml({"x": "http://127.0.0.1:9/v1"}, "tiny", reference="no-such-reference"))
    res = CliRunner().invoke(app, ["check", "--provider", "x", "--suite", "smoke", "--config", str(cfg),
                                   "--db", env["db"], "--no-progress"])
    assert res.exit_code == 3 and "no-such-reference" in res.output and "Traceback" not in res.output, res.output


# ------------------------------------------------------------------------------------------ none, real model
REAL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def real_sims(real_lm):
    from .conftest import SimFactory

    sims = SimFactory(real_lm, REAL)
    yield sims
    sims.stop()


@pytest.mark.real_model
@pytest.mark.parametrize(("profile", "budget", "expected"), [
    ("relaxed-threshold", 600, ("RELAXED_VERIFICATION", "DECODING_NONCOMPLIANT")),
    ("int4", 1000, ("PASS",)),
])
def test_reference_none_on_the_real_model(real_sims, tmp_path, profile, budget, expected) -> None:
    """No reference: relaxed verification is still caught by the self tests alone; int4 (a weights
    change only a reference can see) passes, and the PASS says QUANTIZATION was not tested."""
    cfg = tmp_path / "p.toml"
    cfg.write_text(providers_toml({"p": real_sims.url(profile)}, REAL, reference="none"))
    rep = run_check("p", budget_tokens=budget, db_url=f"sqlite:///{tmp_path / 'a.db'}", config_path=str(cfg))
    real_sims.stop(profile)
    print(f"\nnone/{profile}: {rep.verdict} — {rep.verdict_reason}")
    assert rep.verdict in expected, rep.verdict_reason
    assert not _ran(rep) & set(REFERENCE_DETECTORS)
    assert "QUANTIZATION not tested: no reference" in rep.verdict_reason


# ------------------------------------------------------------------------------------------ cross-family
@pytest.fixture(scope="module")
def tiny_gemma():
    """A tiny random model with gemma-3-270m's real tokenizer (262,144 ids; SentencePiece, BOS)."""
    from reference.backends import ReferenceError, load_tokenizer

    from ..conftest import _wrap, make_tiny_model

    try:
        tok = load_tokenizer("gemma-3-270m")
    except ReferenceError as exc:  # pragma: no cover - the package is a declared dependency
        pytest.fail(f"gemma-3-270m tokenizer missing ({exc}); run `auditor models pull gemma-3-270m`")
    return _wrap(make_tiny_model(vocab_size=262144, hidden_size=16, seed=3, eos_token_id=1), tok, "tiny-gemma")


@pytest.mark.parametrize("direction", ["gemma-served-as-smollm2", "smollm2-served-as-gemma"])
def test_cross_family_substitution(tmp_path, tiny_lm, tiny_gemma, small_floors, monkeypatch, direction) -> None:
    """A provider serving another tokenizer family than it claims → SUBSTITUTION with tokenizer evidence
    (foreign token strings, prompt counts that disagree), never a crash or INCONCLUSIVE."""
    from auditor.check import reference_setup
    from simulator.server import ServerThread, create_app

    served, claimed = (tiny_gemma, tiny_lm) if direction.startswith("gemma") else (tiny_lm, tiny_gemma)
    monkeypatch.setitem(reference_setup._MODELS, ("claimed-ref", "float32"), claimed)
    srv = ServerThread(create_app("honest-fp32", lm=served, served_model_name="claimed", seed=0), timeout=120).start()
    try:
        cfg = tmp_path / "p.toml"
        cfg.write_text(providers_toml({"p": srv.base_url}, "claimed", reference="claimed-ref")
                       .replace('api = "chat"', 'api = "completions"'))
        rep = run_check("p", suite="smoke", budget_tokens=96, db_url=f"sqlite:///{tmp_path / 'a.db'}",
                        config_path=str(cfg), reference_dtypes=["float32"])
    finally:
        srv.stop()
    tm = rep.verdict_details.get("tokenizer_mismatch") or {}
    print(f"\n{direction}: {rep.verdict} — {rep.verdict_reason[:300]}")
    assert rep.verdict == "SUBSTITUTION", rep.verdict_reason
    assert rep.verdict_details["rule"] == "2t-tokenizer"
    assert tm["established"] and (tm["n_foreign_distinct"] >= 3 or tm["n_prompt_disagree"] >= 3)
    assert "prompt_counts" in tm["established"]  # completions: BOS + another segmentation
    assert "another tokenizer" in rep.verdict_reason
