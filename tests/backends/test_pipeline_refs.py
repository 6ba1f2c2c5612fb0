"""The check pipeline's reference resolution: [references.NAME] tables, kinds the floor cannot use,
and a chat suite against a base model refused before any probe is sent (exit code 3)."""

from __future__ import annotations

import pytest

from auditor.check.errors import AuditError
from auditor.check.reference_setup import _MODELS, check_reference_api, get_reference_models

from ..conftest import make_tiny_model


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, smollm2_tokenizer):
    d = tmp_path_factory.mktemp("base-model")
    make_tiny_model(seed=7).save_pretrained(d)
    smollm2_tokenizer.save_pretrained(d)
    (d / "chat_template.jinja").unlink(missing_ok=True)
    cfg = d / "tokenizer_config.json"
    import json

    tc = json.loads(cfg.read_text())
    tc.pop("chat_template", None)
    cfg.write_text(json.dumps(tc))
    return d


def _providers(tmp_path, reference, table=""):
    p = tmp_path / "providers.toml"
    p.write_text(f'[providers.p]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\napi = "chat"\n'
                 f'reference = "{reference}"\n{table}')
    return str(p)


def test_chat_against_base_model_refused(tmp_path, base_dir):
    from auditor.check.pipeline import run_check

    cfg = _providers(tmp_path, str(base_dir))
    with pytest.raises(AuditError, match='api = "completions"') as ei:
        run_check("p", config_path=cfg, db_url=f"sqlite:///{tmp_path / 'a.db'}")
    assert ei.value.exit_code == 3
    check_reference_api(str(base_dir), "completions", cfg)  # completions: fine


def test_reference_table_local_and_unusable_kinds(tmp_path, base_dir):
    table = (f'[references.small]\nkind = "local"\nmodel = "{base_dir}"\ndevice = "cpu"\ndtype = "bfloat16"\n'
             '[references.remote]\nkind = "vllm"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\n')
    cfg = _providers(tmp_path, "small", table)
    try:
        lms = get_reference_models("small", config_path=cfg)
        assert list(lms) == ["bfloat16"] and str(lms["bfloat16"].dtype) == "torch.bfloat16"
        assert lms["bfloat16"].path == str(base_dir)
    finally:
        _MODELS.pop(("small", "bfloat16"), None)
    with pytest.raises(AuditError, match="kind 'vllm'"):
        get_reference_models("remote", config_path=cfg)
    with pytest.raises(AuditError, match="kind 'none'"):
        get_reference_models("none", config_path=cfg)
    bad = _providers(tmp_path, "x", '[references.x]\nkind = "local"\nmodel = "m"\ndevice = "gpu"\n')
    with pytest.raises(AuditError, match=r"references\.x\.device"):
        get_reference_models("x", config_path=bad)


def test_vllm_reference_floor_from_local_weights(tmp_path, base_dir, tiny_lm, smollm2_tokenizer):
    """A vllm reference whose tokenizer names a directory with the served model's weights gets a noise
    floor from those weights (scorer keyed float32, report dtype still "server"); a tokenizer-only
    directory gives no floor (logprob-divergence cannot run), as the reference notes say."""
    from auditor.check.reference_setup import resolve_reference
    from simulator.server import ServerThread, create_app

    tok_only = tmp_path / "tok"
    smollm2_tokenizer.save_pretrained(tok_only)
    srv = ServerThread(create_app("honest-fp32", lm=tiny_lm, served_model_name="trusted", seed=0), timeout=120).start()
    try:
        table = "".join(f'[references.{n}]\nkind = "vllm"\nmodel = "trusted"\nbase_url = "{srv.base_url}"\n'
                        f'tokenizer = "{d}"\n' for n, d in (("withw", base_dir), ("tokonly", tok_only)))
        cfg = _providers(tmp_path, "withw", table)
        ref = resolve_reference("withw", config_path=cfg, device="cpu")
        try:
            assert ref.kind == "vllm" and list(ref.lms) == ["float32"] and list(ref.scorers) == ["float32"]
            assert ref.dtype_label == "server" and ref.scorers["float32"].dtype == "server"
            assert ref.lms["float32"].path == str(base_dir) and "noise floor measured" in (ref.notes or [""])[0]
        finally:
            ref.close()
            _MODELS.pop((str(base_dir), "float32"), None)
        ref2 = resolve_reference("tokonly", config_path=cfg, device="cpu")
        try:
            assert ref2.lms == {} and list(ref2.scorers) == ["server"] and "no noise floor" in (ref2.notes or [""])[0]
        finally:
            ref2.close()
    finally:
        srv.stop()
