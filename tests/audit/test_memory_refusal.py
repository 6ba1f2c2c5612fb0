"""Issue 41, item 3: a stage that would not fit in memory is refused in one line (exit 3), before
it starts, and the run is kept (marked failed with the reason, resumable)."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.check.errors import AuditError
from auditor.check.memory import (
    ENV_AVAILABLE,
    ENV_BLOCK_ROWS,
    MemoryRefusal,
    StageNeed,
    available_bytes,
    ensure_fits,
    floor_block_rows,
    floor_need,
    model_shape,
    release_freed_memory,
)


def test_available_memory_reads_the_override_then_meminfo(monkeypatch) -> None:
    monkeypatch.setenv(ENV_AVAILABLE, "1.5G")
    assert available_bytes() == 3 << 29
    monkeypatch.setenv(ENV_AVAILABLE, "512M")
    assert available_bytes() == 512 << 20
    monkeypatch.setenv(ENV_AVAILABLE, "lots")
    with pytest.raises(ValueError, match=ENV_AVAILABLE):
        available_bytes()
    monkeypatch.delenv(ENV_AVAILABLE)
    got = available_bytes()
    if Path("/proc/meminfo").is_file():
        assert got is not None and got > 0


def test_refusal_is_one_line_with_the_fixes() -> None:
    need = StageNeed("noise floor", 3 << 30, "terms")
    ensure_fits(need, available=4 << 30)  # fits: nothing happens
    with pytest.raises(MemoryRefusal) as ei:
        ensure_fits(need, available=1 << 30, provider="g", run_id="abc123")
    msg = str(ei.value)
    assert isinstance(ei.value, AuditError) and ei.value.exit_code == 3 and ei.value.run_id == "abc123"
    assert "\n" not in msg and "3.00 GiB" in msg and "1.00 GiB" in msg
    for fix in (ENV_BLOCK_ROWS, "--budget-tokens", "cuda", "--resume abc123"):
        assert fix in msg


def test_floor_estimate_grows_with_the_block_not_the_positions(tiny_lm, monkeypatch) -> None:
    shape = model_shape(tiny_lm)
    a = floor_need(shape, n_positions=1_000, max_new_tokens=32, needs_bf16_copy=False, block_rows=16)
    b = floor_need(shape, n_positions=2_000, max_new_tokens=32, needs_bf16_copy=False, block_rows=16)
    c = floor_need(shape, n_positions=1_000, max_new_tokens=32, needs_bf16_copy=False, block_rows=4)
    assert b.bytes - a.bytes == 1_000 * 1_200  # only the kept statistics grow with the positions
    assert a.bytes - c.bytes == 12 * (64 + 4) * shape.vocab_size
    monkeypatch.setenv(ENV_BLOCK_ROWS, "4")
    assert floor_block_rows() == 4
    monkeypatch.setenv(ENV_BLOCK_ROWS, "0")
    with pytest.raises(ValueError, match=ENV_BLOCK_ROWS):
        floor_block_rows()


def test_floor_estimate_does_not_count_the_bf16_copy_beside_scoring(tiny_lm) -> None:
    """The honest-bf16 copy is dropped before its variant is scored (compute_floors): it adds to the
    estimate only where copy + decoding rows exceed the scoring chunk + block, never on top of them."""
    import dataclasses

    small = model_shape(tiny_lm)  # a copy of a few MB: the scoring chunk (512 MiB) sets the estimate
    args = {"n_positions": 1_000, "max_new_tokens": 32, "block_rows": 16}
    assert floor_need(small, needs_bf16_copy=True, **args).bytes == floor_need(small, needs_bf16_copy=False, **args).bytes
    big = dataclasses.replace(small, n_params=8_000_000_000)  # an 8B float32 reference: a 16 GB copy
    with_copy = floor_need(big, needs_bf16_copy=True, **args).bytes
    without = floor_need(big, needs_bf16_copy=False, **args).bytes
    assert 16_000_000_000 < with_copy < 16_000_000_000 + without  # the copy, not copy + scoring



def _rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads RSS from /proc (Linux)")
def test_freed_heap_memory_is_given_back() -> None:
    """Issue 41: memory freed in pieces below glibc's mmap threshold (the floor's dropped bf16 copy)
    stays resident while a live allocation sits above it; release_freed_memory gives it back."""
    blocks = [bytearray(64 << 10) for _ in range(3200)]  # 200 MiB in 64 KiB pieces (C heap, not mmap)
    pin = bytearray(64 << 10)  # a live allocation above them
    before = _rss_mib()
    del blocks
    kept = _rss_mib()
    if not release_freed_memory():
        pytest.skip("not glibc (no malloc_trim), or nothing was kept")
    assert kept > before - 50  # free() alone kept the pages
    assert _rss_mib() < kept - 150  # given back
    assert len(pin) == 64 << 10

def test_check_refuses_the_floor_and_keeps_the_run(tmp_path: Path, tiny_sims, tiny_lm, small_floors,
                                                  monkeypatch) -> None:
    """With 64 MiB available the first audit's floor measurement is refused before it starts: exit 3,
    one line; the run and its probes stay stored (failed, with the line) and, once memory is there,
    ``--resume`` finishes it without sending a probe again."""
    from auditor.check import reference_setup
    from auditor.check.pipeline import run_check
    from auditor.store import open_store
    from auditor.store import queries as q

    monkeypatch.setitem(reference_setup._MODELS, ("tiny-ref", "float32"), tiny_lm)
    cfg = tmp_path / "providers.toml"
    cfg.write_text(
        f'[providers.m]\nbase_url = "{tiny_sims.url("honest-fp32")}"\nmodel = "tiny"\napi = "chat"\n'
        'reference = "tiny-ref"\ntimeout_s = 300\n\n[providers.m.capabilities]\nmax_top_logprobs = 5\nlogprobs = true\n'
        "n = true\nseed = true\nstreaming = true\n\n[providers.m.rate_limits]\nconcurrency = 2\n")
    db = f"sqlite:///{tmp_path / 'a.db'}"
    monkeypatch.setattr("auditor.check.measured_floors.noise_cache_dir", lambda: tmp_path / "fresh-floors")  # not cached yet
    monkeypatch.setenv(ENV_AVAILABLE, "64M")
    with pytest.raises(MemoryRefusal, match="noise floor") as ei:
        run_check("m", suite="smoke", db_url=db, config_path=str(cfg))
    rid = ei.value.run_id
    assert rid and ei.value.exit_code == 3
    store = open_store(db)
    try:
        with store.session() as s:
            run = q.get_run(s, rid)
            assert run is not None and run.status == "failed" and "not enough memory" in (run.failure_reason or "")
            done = q.probe_counts(s, rid).get("done", 0)
            assert done > 0
    finally:
        store.close()
    assert not (tmp_path / "fresh-floors").exists() or not list((tmp_path / "fresh-floors").glob("*.json"))
    monkeypatch.delenv(ENV_AVAILABLE)
    rep = run_check("m", suite="smoke", db_url=db, config_path=str(cfg), resume=rid)
    assert rep.run_id == rid and rep.status == "completed"
    assert rep.tokens  # the stored probes were analysed
