"""Exit-3 usage errors of a reference that cannot be loaded, through the command line: ``--device cuda``
without a GPU (refused before any weights are read) and a reference model directory whose tokenizer cannot
be loaded (missing or corrupt tokenizer files, nothing loadable), in ``auditor reference score|generate``
and ``auditor check`` (provider ``reference = DIR``, a ``kind = "local"`` table with ``model = DIR``, a
``kind = "vllm"`` table with ``tokenizer = DIR``). Tiny random models saved to temporary directories; no hub."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from auditor.cli import app

from ..conftest import make_tiny_model
from .conftest import providers_toml

runner = CliRunner()
BROKEN = ("no-tokenizer", "corrupt-tokenizer", "nothing")


def _no_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def _clean_exit_3(res) -> str:
    """The one ``error:`` line of a usage error (exit 3, no traceback)."""
    assert res.exit_code == 3, (res.exit_code, res.output, res.exception)
    assert not isinstance(res.exception, Exception), res.exception  # a typer.Exit (SystemExit), not a crash
    assert "Traceback" not in res.output, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, smollm2_tokenizer) -> dict[str, Path]:
    """``good``: tiny weights + the SmolLM2 tokenizer; ``no-tokenizer``: the weights and config.json only;
    ``corrupt-tokenizer``: the weights with a truncated tokenizer.json; ``nothing``: an empty directory."""
    base = tmp_path_factory.mktemp("ref-dirs")
    good = base / "good"
    make_tiny_model(seed=0, hidden_size=16, n_layers=1).save_pretrained(good)
    smollm2_tokenizer.save_pretrained(good)
    no_tok = base / "no-tokenizer"
    no_tok.mkdir()
    for f in good.iterdir():
        if f.name in ("config.json", "generation_config.json") or f.suffix == ".safetensors":
            shutil.copy(f, no_tok / f.name)
    corrupt = base / "corrupt-tokenizer"
    shutil.copytree(good, corrupt)
    text = (good / "tokenizer.json").read_text()
    (corrupt / "tokenizer.json").write_text(text[: len(text) // 2])
    (base / "nothing").mkdir()
    return {"good": good, "no-tokenizer": no_tok, "corrupt-tokenizer": corrupt, "nothing": base / "nothing"}


def _what_is_wrong(kind: str, d: Path, line: str) -> None:
    """The message says what is wrong with the directory, per kind."""
    expected = {"corrupt-tokenizer": "tokenizer.json in {d} is corrupt (not valid JSON",
                "no-tokenizer": "the directory {d} has no tokenizer files",
                "nothing": "the directory {d} holds no model files"}[kind]
    assert expected.format(d=d) in line, line
    assert "Fix:" in line, line


# ------------------------------------------------------------------------------------------ --device
@pytest.mark.parametrize("command", ["score", "generate"])
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_reference_cli_cuda_without_gpu_exits_3_before_loading(model_dirs, monkeypatch, command, device) -> None:
    """No weights, tokenizer or bundled-model pull is touched before the device is refused."""
    import transformers

    import reference.models

    _no_gpu(monkeypatch)

    def touched(*args, **kwargs):
        raise AssertionError("the model was resolved/loaded before --device was checked")

    monkeypatch.setattr(reference.models, "resolve_model_path", touched)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", touched)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", touched)
    args = ["reference", command, "--model", str(model_dirs["good"]), "--prompt", "x", "--device", device]
    if command == "score":
        args += ["--continuation", " y"]
    line = _clean_exit_3(runner.invoke(app, args))
    assert "no CUDA GPU" in line and "--device" in line and device in line, line


def test_reference_cli_cuda_without_gpu_default_model(monkeypatch) -> None:
    """The bundled default model is not pulled/converted either (the check comes first)."""
    import reference.models

    _no_gpu(monkeypatch)
    monkeypatch.setattr(reference.models, "pull_model", lambda *a, **k: pytest.fail("pulled before --device check"))
    line = _clean_exit_3(runner.invoke(app, ["reference", "score", "--prompt", "x", "--continuation", "y",
                                             "--device", "cuda"]))
    assert "no CUDA GPU" in line and "--device" in line, line


# ------------------------------------------------------------------------------------------ tokenizer, reference CLI
@pytest.mark.parametrize("kind", BROKEN)
@pytest.mark.parametrize("command", ["score", "generate"])
def test_reference_cli_unloadable_tokenizer_exits_3(model_dirs, kind, command) -> None:
    d = model_dirs[kind]
    args = ["reference", command, "--model", str(d), "--prompt", "x", "--device", "cpu"]
    if command == "score":
        args += ["--continuation", " y"]
    line = _clean_exit_3(runner.invoke(app, args))
    assert str(d) in line and "tokenizer" in line, line
    _what_is_wrong(kind, d, line)


# ------------------------------------------------------------------------------------------ tokenizer, check
@pytest.fixture
def check_env(tmp_path, model_dirs, small_floors):
    """A providers file per broken directory: ``dir-K`` (reference = DIR), ``tab-K`` (a kind = "local" table
    with model = DIR) and ``vllm-K`` (a kind = "vllm" table with tokenizer = DIR). No provider answers
    (port 9): the reference must be refused before any probe."""
    url = "http://127.0.0.1:9/v1"
    text = ""
    for kind in BROKEN:
        d = model_dirs[kind]
        text += providers_toml({f"dir-{kind}": url}, "tiny", reference=str(d))
        text += providers_toml({f"tab-{kind}": url}, "tiny", reference=f"local-{kind}")
        text += providers_toml({f"vllm-{kind}": url}, "tiny", reference=f"vllm-{kind}")
        text += f'[references.local-{kind}]\nkind = "local"\nmodel = "{d}"\n\n'
        text += (f'[references.vllm-{kind}]\nkind = "vllm"\nmodel = "served"\nbase_url = "{url}"\n'
                 f'tokenizer = "{d}"\ntimeout_s = 2\n\n')
    cfg = tmp_path / "providers.toml"
    cfg.write_text(text)
    return {"config": str(cfg), "db": f"sqlite:///{tmp_path / 'a.db'}"}


@pytest.mark.parametrize("kind", BROKEN)
@pytest.mark.parametrize("via", ["dir", "tab", "vllm"])
def test_check_unloadable_reference_tokenizer_exits_3(check_env, model_dirs, via, kind) -> None:
    from auditor.store import open_store
    from auditor.store import queries as q

    provider = f"{via}-{kind}"
    res = runner.invoke(app, ["check", "--provider", provider, "--suite", "smoke", "--config", check_env["config"],
                              "--db", check_env["db"], "--no-progress"])
    line = _clean_exit_3(res)
    d = model_dirs[kind]
    assert str(d) in line and "tokenizer" in line, line
    _what_is_wrong(kind, d, line)
    if via == "vllm":
        assert "vllm-" + kind in line and "tokenizer =" in line, line
    else:
        assert "reference" in line, line
    store = open_store(check_env["db"])
    try:
        with store.session() as s:
            assert not [r for r in q.list_runs(s) if getattr(r, "provider", None) == provider]
    finally:
        store.close()
