"""Profiles are valid recipes; quantization puts weights on the right grids (quanto == torch RTN)."""

from __future__ import annotations

import copy

import pytest
import torch

from reference.native import FP8_E4M3_MAX, iter_decoder_linears
from simulator.profiles import (
    PROFILES,
    default_substitute_keep,
    get_profile,
    list_profiles,
    resolve_substitute_layers,
    spread_substitute_keep,
)
from simulator.quantize import (
    quantize_model_weights,
    quanto_fake_quant,
    rtn_fp8_per_tensor,
    rtn_int4_groupwise,
    rtn_int8_per_channel,
)

REQUIRED = {
    "honest-fp32", "honest-bf16", "honest-noisy", "int8", "int4", "fp8", "relaxed-threshold",
    "typical-acceptance", "greedy-verify", "substituted", "decode-noncompliant", "truncated-sampling",
}


def test_all_required_profiles_exist_with_expected_verdicts():
    assert set(PROFILES) >= REQUIRED
    for p in list_profiles():
        assert (p.expected_verdict == "PASS") == p.honest
        if p.honest:
            assert p.verifier == "strict" and p.weight_quant is None and p.forced_top_p is None
    assert get_profile("relaxed-threshold").accept_threshold_single == 0.5
    assert get_profile("relaxed-threshold").accept_threshold_acc == 1.0


def test_overrides_and_errors():
    p = get_profile("relaxed-threshold", accept_threshold_single=0.3, accept_threshold_acc=None)
    assert p.accept_threshold_single == 0.3 and p.accept_threshold_acc == 1.0
    with pytest.raises(KeyError, match="unknown profile 'nope'"):
        get_profile("nope")
    with pytest.raises(ValueError, match="accept thresholds"):
        get_profile("relaxed-threshold", accept_threshold_single=1.5)
    with pytest.raises(ValueError, match="unknown profile field"):
        get_profile("int4").with_overrides(bits=3)


def test_default_substitution_drops_every_fifth_layer_from_a_third():
    keep = default_substitute_keep(30)
    assert sorted(set(range(30)) - set(keep)) == [10, 15, 20, 25]
    assert len(default_substitute_keep(2)) == 1
    assert resolve_substitute_layers(get_profile("substituted"), 30) == keep
    assert resolve_substitute_layers(get_profile("honest-fp32"), 30) is None


def test_substituted_k_drops_k_layers_evenly_over_the_middle():
    near = get_profile("substituted:1")
    assert "substituted:1" in PROFILES and near.family == "substituted" and near.expected_verdict == "SUBSTITUTION"
    assert sorted(set(range(30)) - set(resolve_substitute_layers(near, 30))) == [18]
    assert sorted(set(range(30)) - set(spread_substitute_keep(30, 4))) == [12, 16, 20, 24]
    for n, k in ((30, 2), (30, 7), (12, 3)):
        dropped = sorted(set(range(n)) - set(spread_substitute_keep(n, k)))
        assert len(dropped) == k and all(n // 3 <= i < n - 4 for i in dropped)
    assert resolve_substitute_layers(get_profile("substituted"), 30) == default_substitute_keep(30)  # unchanged
    with pytest.raises(ValueError, match="whole number"):
        get_profile("substituted:1.5")
    with pytest.raises(ValueError, match="must be in"):
        get_profile("substituted:0")
    with pytest.raises(ValueError, match=r"drop count must be in 1\.\.15"):
        resolve_substitute_layers(get_profile("substituted:16"), 30)


@pytest.mark.parametrize("scheme", ["int8", "int4", "fp8"])
def test_quanto_matches_torch_rtn(scheme):
    torch.manual_seed(0)
    w = torch.randn(96, 128) * 0.05
    ref = {"int8": rtn_int8_per_channel, "int4": lambda x: rtn_int4_groupwise(x, 64), "fp8": rtn_fp8_per_tensor}[scheme](w)
    got = quanto_fake_quant(w, scheme, 64)
    assert torch.equal(got, ref)
    assert not torch.equal(got, w)


def test_quantization_grids():
    torch.manual_seed(1)
    w = torch.randn(16, 128)
    q8 = rtn_int8_per_channel(w)
    scale = w.abs().amax(1, keepdim=True) / 127
    assert torch.allclose(q8 / scale, torch.round(q8 / scale), atol=1e-4)
    q4 = rtn_int4_groupwise(w, 64).reshape(-1, 64)
    assert max(len(torch.unique(row)) for row in q4) <= 16
    q3 = rtn_int4_groupwise(w, 64, bits=3).reshape(-1, 64)
    assert max(len(torch.unique(row)) for row in q3) <= 8
    assert (q3 - w.reshape(-1, 64)).abs().mean() > (q4 - w.reshape(-1, 64)).abs().mean()
    f8 = rtn_fp8_per_tensor(w)
    s = w.abs().max() / FP8_E4M3_MAX
    assert torch.equal((f8 / s).to(torch.float8_e4m3fn).float() * s, f8)
    with pytest.raises(ValueError, match="divisible"):
        rtn_int4_groupwise(torch.randn(4, 96), 64)


def test_quantize_model_touches_only_decoder_linears(tiny_lm):
    m = copy.deepcopy(tiny_lm.model)
    emb = m.model.embed_tokens.weight.clone()
    before = {n: lin.weight.clone() for n, lin in iter_decoder_linears(m)}
    rep = quantize_model_weights(m, "int4", group_size=64)
    assert rep.n_matrices == 2 * 7 and rep.backend == "optimum-quanto" and rep.seconds > 0
    assert 0 < rep.mean_rel_error < 0.5
    assert torch.equal(m.model.embed_tokens.weight, emb)  # tied lm_head left in float32
    for n, lin in iter_decoder_linears(m):
        assert not torch.equal(lin.weight, before[n])
    fb = copy.deepcopy(tiny_lm.model)
    rep2 = quantize_model_weights(fb, "int4", group_size=64, use_quanto=False)
    assert rep2.backend == "torch-rtn"
    for (n, a), (_, b) in zip(iter_decoder_linears(m), iter_decoder_linears(fb), strict=True):
        assert torch.equal(a.weight, b.weight), n
    with pytest.raises(ValueError, match="scheme"):
        quantize_model_weights(fb, "int2")
    m3 = copy.deepcopy(tiny_lm.model)
    rep3 = quantize_model_weights(m3, "int3", group_size=64)  # no quanto 3-bit type: torch RTN
    assert rep3.backend == "torch-rtn" and rep3.group_size == 64 and rep3.mean_rel_error > rep.mean_rel_error


def test_a_stale_quanto_build_lock_falls_back_instead_of_blocking(tiny_lm, tmp_path, monkeypatch):
    """A killed quanto extension build leaves ``build/lock``; torch would wait on it forever. A lock
    older than QUANTO_STALE_LOCK_S makes the profile use the (bit-identical) torch fallback and say why;
    a fresh lock (a build in progress) is left to torch's own wait."""
    import importlib.util
    import os
    import time
    import types

    from simulator import quantize as q

    pkg = tmp_path / "optimum" / "quanto"
    lock = pkg / "library" / "extensions" / "cpp" / "build" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: types.SimpleNamespace(origin=str(pkg / "__init__.py")))
    assert q.quanto_stale_lock() is None  # fresh: a build may be running
    old = time.time() - q.QUANTO_STALE_LOCK_S - 5
    os.utime(lock, (old, old))
    assert q.quanto_stale_lock() == str(lock)
    m = copy.deepcopy(tiny_lm.model)
    rep = quantize_model_weights(m, "int4", group_size=64)
    assert rep.backend == "torch-rtn" and "build lock" in rep.errors[0] and str(lock) in rep.errors[0]
    lock.unlink()
    assert q.quanto_stale_lock() is None


def test_quantized_weights_are_cached_and_the_second_start_reads_them(tiny_lm, tmp_path):
    """Issue 38 item 11: the first start quantizes and writes the cache; the second reads the same
    weights (bit for bit) without quantizing; a cache that does not match the model is ignored."""
    from simulator.quantize import quant_cache_file

    path = quant_cache_file(tmp_path, tiny_lm.name, tiny_lm.revision, "int4", 64)
    first = copy.deepcopy(tiny_lm.model)
    seen = []
    rep1 = quantize_model_weights(first, "int4", use_quanto=False, cache_file=path,
                                  progress=lambda d, t, s: seen.append((d, t)))
    assert not rep1.cached and path.is_file() and seen[-1][0] == seen[-1][1] == rep1.n_matrices
    second = copy.deepcopy(tiny_lm.model)
    rep2 = quantize_model_weights(second, "int4", use_quanto=False, cache_file=path,
                                  progress=lambda d, t, s: pytest.fail("quantized again despite the cache"))
    assert rep2.cached and rep2.n_matrices == rep1.n_matrices and rep2.backend == rep1.backend
    assert rep2.mean_rel_error == pytest.approx(rep1.mean_rel_error)
    for (n, a), (_, b) in zip(iter_decoder_linears(first), iter_decoder_linears(second), strict=True):
        assert torch.equal(a.weight, b.weight), n
    # another scheme's file under this name (or a corrupt file) is not read
    other = copy.deepcopy(tiny_lm.model)
    rep3 = quantize_model_weights(other, "int8", use_quanto=False, cache_file=path)
    assert not rep3.cached
    path.write_bytes(b"not a safetensors file")
    rep4 = quantize_model_weights(copy.deepcopy(tiny_lm.model), "int4", use_quanto=False, cache_file=path)
    assert not rep4.cached


def test_an_engine_that_loads_its_model_caches_quantized_weights_in_the_session_folder(tiny_lm, tmp_path,
                                                                                      quant_dir):
    """The tests never write into the user's model cache: an engine that loads a model from a folder
    itself (here a tiny model saved to a temporary folder, as the CLI tests do) caches its int4 weights
    under ``$SPEC_AUDITOR_QUANT_DIR`` — the test session's folder — and not under
    ``<model cache>/quantized``, where each session used to leave a ``_tmp_pytest-…-int4-g64`` file."""
    from reference.models import model_cache_dir
    from simulator.engine import SimulatorEngine
    from simulator.profiles import get_profile
    from simulator.quantize import quant_cache_dir

    d = tmp_path / "tiny-model"
    tiny_lm.model.save_pretrained(d)
    tiny_lm.tokenizer.save_pretrained(d)
    user_dir = model_cache_dir() / "quantized"
    before = set(user_dir.glob("*")) if user_dir.is_dir() else set()
    assert quant_cache_dir() == quant_dir
    SimulatorEngine(get_profile("int4"), model=str(d), seed=0)
    assert [p for p in quant_dir.glob("*.safetensors") if "tiny-model" in p.name]
    after = set(user_dir.glob("*")) if user_dir.is_dir() else set()
    assert after == before
