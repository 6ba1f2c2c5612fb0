"""A real llama.cpp server audited end to end (issue 13; results in docs/real-engines.md).

What the engine does (llama-cpp-python 0.3.36 source: ``llama_cpp/server/types.py`` request
defaults ``top_k=40``, ``top_p=0.95``, ``min_p=0.05``, ``repeat_penalty=1.1``;
``llama_cpp/llama.py`` ``Llama._init_sampler`` adds the repetition penalty before the greedy pick
at temperature 0 and the top-k → typical → top-p → min-p → temperature chain at temperature > 0;
the reported logprobs are ``logits_to_logprobs`` of the raw scores) — so a correct audit names its
decoding faults, and blames the weights only when the logprobs diverge.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.real_engine

SUITES = ("default", "precision", "verification")


@pytest.fixture(scope="module")
def preflight(llama_server, real_out, provider_toml):
    from auditor.preflight import run_preflight
    from probes.config import load_providers
    from reference.models import load_model

    cfg_path = real_out / "providers.toml"
    cfg_path.write_text(provider_toml(llama_server))
    cfg = load_providers(cfg_path)["llamacpp"]
    tok = load_model().tokenizer
    rep = run_preflight(cfg, tok)
    (real_out / "preflight.json").write_text(json.dumps(rep.to_dict(), indent=1, default=str))
    return rep


def test_preflight_names_the_engines_decoding_defaults(preflight):
    """The server-side sampler (min_p 0.05, top_k 40, top_p 0.95 unless the request overrides) and the
    repetition penalty before the greedy pick are both caught by the provider's own numbers."""
    assert preflight.check("top-p").passed is False, preflight.check("top-p").summary
    assert preflight.check("greedy-top1").passed is False, preflight.check("greedy-top1").summary
    assert preflight.check("prompt-tokens").passed is True  # the GGUF's own chat template = the reference's
    assert preflight.check("max-tokens").passed is True
    assert preflight.check("stop").passed is True
    res = {r.name: r for r in preflight.detector_results()}
    assert res["preflight-top-p"].ran and res["preflight-top-p"].p_value < 1e-6


@pytest.mark.parametrize("suite", SUITES)
def test_audit_completes_and_blames_weights_only_on_logprobs(suite, llama_server, real_out, tmp_path, provider_toml):
    cfg = tmp_path / "providers.toml"
    cfg.write_text(provider_toml(llama_server))
    out = real_out / f"{suite}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "auditor", "check", "--provider", "llamacpp", "--config", str(cfg), "--suite", suite,
         "--db", f"sqlite:///{tmp_path / 'audit.db'}", "--json", str(out), "--format", "markdown", "--no-progress"],
        capture_output=True, text=True, timeout=3600,
    )
    (real_out / f"{suite}.md").write_text(proc.stdout)
    assert proc.returncode in (0, 1, 2), proc.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert rep["status"] == "completed"
    assert rep["verdict"] != "SUBSTITUTION"  # the declared weights are served
    assert not any(c["verdict"] == "SUBSTITUTION" for c in rep["secondary_causes"])
    lp = next(d for d in rep["detectors"] if d["name"] == "logprob-divergence")
    causes = [rep["verdict"]] + [c["verdict"] for c in rep["secondary_causes"]]
    if "QUANTIZATION" in causes:
        assert lp["ran"] and lp["rejects"], "QUANTIZATION without a logprob divergence"
        if (lp.get("details") or {}).get("ratio_to_floor", 99) <= 5:
            assert "reduced-precision computation of the declared weights" in rep["verdict_reason"]
    assert rep["verdict"] != "PASS" or not any(c.get("passed") is False and c.get("kind") == "decoding"
                                               for c in rep["preflight_checks"])
    failures = rep.get("provider_failures") or {}
    assert (failures.get("share") or 0) <= 0.10, failures
