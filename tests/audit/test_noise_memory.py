"""Issue 41: the noise floor is measured in bounded memory, with the same numbers.

The first gemma-3-270m audit (V = 262,144) was killed at 23 GB while measuring the floor: every
variant's ``[positions, V]`` rows were kept, with float64 copies. Now the rows are reduced a block
at a time (``FloorAccumulator``); these tests check that the numbers did not change and that a
200k-vocabulary floor fits under an address-space cap the old measurement exceeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from auditor.check.measured_floors import (
    HONEST_BY_REFERENCE,
    _cast,
    _served,
    compute_floors,
    floor_prompts,
    merge_floors,
)
from auditor.detectors.noise_floor import FloorAccumulator, compute_noise_floor

ROOT = Path(__file__).resolve().parents[2]


def _tied_rows(rng: np.random.Generator, n: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference rows and bf16-rounded honest rows (many exact ties among the top tokens)."""
    ref = rng.normal(size=(n, v)).astype(np.float32) * 3
    hon = torch.from_numpy(ref + rng.normal(size=(n, v)).astype(np.float32) * 0.05).bfloat16().float().numpy()
    return ref, hon


@pytest.mark.parametrize("block_rows", [1, 5, 16])
def test_accumulator_blocks_give_the_floor_of_all_rows_bit_for_bit(block_rows: int) -> None:
    rng = np.random.default_rng(3)
    ref, hon = _tied_rows(rng, 70, 300)
    groups = np.repeat(np.arange(7), 10)
    pos = np.tile(np.arange(10), 7)
    whole = compute_noise_floor(ref, hon, prompt_ids=groups, positions=pos, block_rows=len(ref))
    acc = FloorAccumulator(len(ref), ref.shape[1], ["variant0"], block_rows=block_rows, full_kl=True)
    for s in rng.permutation(np.arange(0, 70, 7)):  # blocks arrive in any order (batches by length)
        acc.add(int(s), ref[s:s + 7], [hon[s:s + 7]])
    blocked = acc.finish(prompt_ids=groups, positions=pos)
    assert json.dumps(blocked.to_dict(), sort_keys=True) == json.dumps(whole.to_dict(), sort_keys=True)
    r64, h64 = ref.astype(np.float64), hon.astype(np.float64)
    assert acc.mean_full_kl("variant0") == float((np.exp(r64) * (r64 - h64)).sum(1).mean())


def test_accumulator_refuses_missing_rows_and_bad_shapes() -> None:
    acc = FloorAccumulator(4, 6, ["a"])
    acc.add(0, np.zeros((2, 6)), [np.zeros((2, 6))])
    with pytest.raises(ValueError, match="never added"):
        acc.finish()
    with pytest.raises(ValueError, match="within N=4"):
        acc.add(3, np.zeros((2, 6)), [np.zeros((2, 6))])
    with pytest.raises(ValueError, match="shape"):
        acc.add(2, np.zeros((2, 6)), [np.zeros((2, 5))])
    with pytest.raises(ValueError, match="full_kl=True"):
        acc.mean_full_kl("a")


def _floor_of_all_rows(lm, names, prompts, max_new_tokens):
    """The measurement as it was before issue 41 (every row kept and reduced at once): the oracle."""
    from reference.drafter_specs import make_drafter
    from reference.scoring import score_continuations
    from reference.speculative import speculative_generate
    from reference.verify import StrictVerifier
    from simulator.profiles import get_profile

    torch.manual_seed(0)
    floors, cross = [], {}
    for name in HONEST_BY_REFERENCE["float32"]:
        prof = get_profile(name)
        base = lm if prof.dtype == "float32" else _cast(lm, prof.dtype)
        served = _served(base, prof.logit_noise)
        drafter = make_drafter(prof.default_drafter, base.model)
        conts, rows, groups, where = [], [], [], []
        for i, ids in enumerate(prompts):
            served.model.nonce = 1_000 + i
            res = speculative_generate(served, list(ids), drafter=drafter, k=4, max_new_tokens=max_new_tokens,
                                       temperature=0.0, eos_token_ids=list(base.eos_token_ids),
                                       verifier=StrictVerifier(), return_logprobs=True, seed=i, adaptive_k=False)
            conts.append(list(res.token_ids))
            if res.token_ids:
                rows.append(res.logprobs.float().numpy()[: len(res.token_ids)])
                groups += [names[i]] * len(res.token_ids)
                where += list(range(len(res.token_ids)))
        keep = [j for j, c in enumerate(conts) if c]
        sc = score_continuations(lm, [prompts[j] for j in keep], [conts[j] for j in keep], top_k=0, full=True,
                                 batch_size=8)
        ref_rows = np.concatenate([s.full_logprobs for s in sc]).astype(np.float64)
        prov = np.concatenate(rows).astype(np.float64)
        cross[name] = float((np.exp(ref_rows) * (ref_rows - prov)).sum(1).mean())
        floors.append(compute_noise_floor(ref_rows, prov, prompt_ids=np.asarray(groups, dtype=object),
                                          positions=np.asarray(where), variant_names=[name],
                                          model=f"{lm.name}@{lm.revision}/float32",
                                          meta={"reference_dtype": "float32", "variant": name},
                                          block_rows=len(ref_rows)))
    return merge_floors(floors), cross


def test_streamed_floor_equals_the_floor_of_all_rows(tiny_lm, tmp_path) -> None:
    """Generation, spill file, batched teacher forcing with a row sink and block reduction give the
    same floor, to the bit, as keeping every row (positions line up across the spill and the sink)."""
    names, prompts = floor_prompts(tiny_lm.tokenizer, 5)
    fs = compute_floors({"float32": tiny_lm}, prompt_names=names, prompts=prompts, max_new_tokens=7,
                        spill_dir=tmp_path)
    oracle, cross = _floor_of_all_rows(tiny_lm, names, prompts, 7)
    assert json.dumps(fs.floors["float32"].to_dict(), sort_keys=True) == json.dumps(oracle.to_dict(), sort_keys=True)
    assert fs.cross_kl["float32"] == cross
    assert list(tmp_path.iterdir()) == []  # the spill file is gone


_CAPPED = r"""
import resource, sys, tempfile
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
from transformers import AutoTokenizer
from conftest import make_tiny_model
from auditor.check.measured_floors import get_floors
from reference.models import LoadedModel, pull_default_model

V, cap_mib = int(sys.argv[2]), int(sys.argv[3])
tok = AutoTokenizer.from_pretrained(str(pull_default_model()))
lm = LoadedModel(model=make_tiny_model(vocab_size=V, seed=0), tokenizer=tok, name="tiny-big-vocab",
                 path="tiny", revision=f"tiny-{V}", dtype=torch.float32, device=torch.device("cpu"))
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) << 10
limit = status("VmSize:") + (cap_mib << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
with tempfile.TemporaryDirectory() as d:
    fs = get_floors({"float32": lm}, n_prompts=8, max_new_tokens=16, cache_dir=d, force=True)
print("positions", sum(fs.meta["positions"].values()), "peak_extra_mib", (status("VmPeak:") - limit) // (1 << 20) + cap_mib)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)")
def test_floor_of_a_200k_vocabulary_fits_under_an_address_space_cap(tmp_path) -> None:
    """Floor of a tiny random model with a 200,000-token vocabulary (3 variants × 128 positions) in a
    subprocess whose address space may grow by at most 1 GiB after setup. The measurement before
    issue 41 kept 3 × 128 × 200k float32 rows plus float64 copies (~1.5 GB over setup) and died
    here with a MemoryError; the blocked one needs about 0.5 GiB (two 100 MiB scoring chunks, a
    16-row block, the spill file is on disk)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_ARENA_MAX": "2", "SPEC_AUDITOR_NOISE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _CAPPED, str(ROOT / "tests"), "200000", "1024"], env=env,
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.split()
    assert last[0] == "positions" and int(last[1]) == 3 * 8 * 16
    assert int(last[3]) <= 1024
