"""Adaptive concurrency (probes/concurrency.py) and its use by ProbeClient and the capability probe,
against a loopback server that cancels a running stream whenever another request arrives
(llama.cpp's server behaviour that failed 48 of 52 requests of one audit at width 8)."""

from __future__ import annotations

import asyncio
import tomllib

import pytest

from probes.client import ProbeClient
from probes.concurrency import AdaptiveConcurrency, is_pressure
from probes.config import ProviderConfig
from probes.discover import discover_capabilities
from probes.providers_file import write_capabilities
from tests.probes._one_slot_server import OneSlotServer, threaded_server

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True}


def _cfg(port_url: str, concurrency: int = 8, attempts: int = 4) -> ProviderConfig:
    return ProviderConfig(
        name="one-slot",
        base_url=port_url,
        model="m",
        timeout_s=10,
        rate_limits={"concurrency": concurrency},
        retry={"max_attempts": attempts, "backoff_initial_s": 0.02, "backoff_max_s": 0.1},
    )


# -- the limiter alone ------------------------------------------------------------------------

def test_is_pressure_kinds() -> None:
    assert is_pressure("truncated_stream", 200)
    assert is_pressure("rate_limited", 429)
    assert is_pressure("server_error", 503)
    assert is_pressure("provider_error", 200, retryable=True)
    assert not is_pressure("provider_error", 200, retryable=False)
    assert not is_pressure("http_error", 400)
    assert not is_pressure(None, 200)


def test_halves_on_a_run_and_never_below_one() -> None:
    async def go() -> AdaptiveConcurrency:
        lim = AdaptiveConcurrency(8, decrease_after=2, increase_after=3)
        for _ in range(20):  # one at a time: every failure is at the current epoch
            t = await lim.acquire()
            lim.release(t, error_kind="truncated_stream", http_status=200)
        return lim

    lim = asyncio.run(go())
    assert [(c.old, c.new) for c in lim.changes] == [(8, 4), (4, 2), (2, 1)]
    assert lim.width == 1 and lim.min_width == 1
    assert lim.summary() == "concurrency reduced 8→1 after 6 truncated_stream failures"
    assert lim.stats()["pressure_failures"] == {"truncated_stream": 20}


def test_isolated_failure_and_other_errors_do_not_cut() -> None:
    async def go() -> AdaptiveConcurrency:
        lim = AdaptiveConcurrency(4, decrease_after=2)
        for kind in ["truncated_stream", None, "truncated_stream", "http_error", "malformed_json", None]:
            t = await lim.acquire()
            lim.release(t, error_kind=kind, http_status=400 if kind == "http_error" else 200)
        return lim

    lim = asyncio.run(go())
    assert lim.changes == [] and lim.width == 4 and lim.summary() is None


def test_grows_back_by_one_up_to_the_configured_width_only() -> None:
    async def go() -> AdaptiveConcurrency:
        lim = AdaptiveConcurrency(3, decrease_after=1, increase_after=2)
        t = await lim.acquire()
        lim.release(t, error_kind="rate_limited", http_status=429)  # 3 -> 1
        assert lim.width == 1
        for _ in range(100):
            t = await lim.acquire()
            lim.release(t, error_kind=None)
        return lim

    lim = asyncio.run(go())
    assert lim.width == 3  # back to the cap, never above
    ups = [(c.old, c.new) for c in lim.changes if c.reason == "recovery"]
    assert ups == [(1, 2), (2, 3)]
    # after a cut, growing needs twice the successes (2 -> 4 per step)
    assert lim.summary() == "concurrency reduced 3→1 after 1 rate_limited failures (now 3)"


def test_failures_from_the_old_width_cut_only_once() -> None:
    """8 requests in flight at width 8 all fail: one halving (8→4), not three (8→1)."""

    async def go() -> AdaptiveConcurrency:
        lim = AdaptiveConcurrency(8, decrease_after=2)
        tickets = [await lim.acquire() for _ in range(8)]
        for t in tickets:
            lim.release(t, error_kind="truncated_stream")
        return lim

    lim = asyncio.run(go())
    assert [(c.old, c.new) for c in lim.changes] == [(8, 4)]


def test_width_bounds_in_flight_and_cancelled_waiter_frees_its_place() -> None:
    async def go() -> tuple[int, int]:
        lim = AdaptiveConcurrency(2)
        peak = 0

        async def job() -> None:
            nonlocal peak
            t = await lim.acquire()
            peak = max(peak, lim.in_flight)
            await asyncio.sleep(0.005)
            lim.release(t, error_kind=None)

        waiter = asyncio.gather(*(job() for _ in range(10)))
        await asyncio.sleep(0.001)
        extra = asyncio.ensure_future(lim.acquire())
        await asyncio.sleep(0)
        extra.cancel()
        await asyncio.gather(extra, return_exceptions=True)
        await waiter
        return peak, lim.in_flight

    peak, left = asyncio.run(go())
    assert peak == 2 and left == 0


def test_bad_width_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="max_width"):
        AdaptiveConcurrency(0)


# -- the client against a one-slot server -----------------------------------------------------

async def _run(adaptive: bool, n: int = 20) -> tuple[list, dict, OneSlotServer]:
    async with OneSlotServer(n_tokens=6, token_delay_s=0.01) as srv:
        cfg = _cfg(srv.base_url, concurrency=8, attempts=4)
        async with ProbeClient(cfg, adaptive_concurrency=adaptive) as client:
            results = [r async for r in client.map((f"k{i}", dict(BODY)) for i in range(n))]
            return results, client.concurrency_stats(), srv


def test_adaptive_client_survives_a_server_that_cancels_on_overlap() -> None:
    results, stats, srv = asyncio.run(_run(adaptive=True))
    fails = [r for r in results if not r.success]
    assert len(results) == 20
    assert len(fails) <= 2, [r.error for r in fails]
    assert stats["min"] == 1 and stats["configured"] == 8
    assert stats["summary"].startswith("concurrency reduced 8→1 after")
    assert "truncated_stream" in stats["summary"]
    assert srv.served >= 18


def test_fixed_width_client_mostly_fails_on_the_same_server() -> None:
    results, stats, _srv = asyncio.run(_run(adaptive=False))
    fails = [r for r in results if not r.success]
    assert len(fails) >= 10, f"only {len(fails)} of 20 failed"
    assert {r.error_kind for r in fails} <= {"truncated_stream", "read_error"}
    assert stats["changes"] == [] and stats["pressure_failures"]["truncated_stream"] > 0


# -- the capability probe --------------------------------------------------------------------

def _discover(tolerant: bool) -> tuple:
    async def go():
        async with OneSlotServer(n_tokens=6, token_delay_s=0.01, tolerant=tolerant) as srv:
            return await discover_capabilities(_cfg(srv.base_url, concurrency=8)), srv.max_overlap

    return asyncio.run(go())


def test_probe_finds_overlap_cancellation_and_writes_concurrency_1(tmp_path) -> None:
    rep, overlap = _discover(tolerant=False)
    check = next(c for c in rep.checks if c.name == "concurrency")
    assert overlap >= 2  # the requests really overlapped
    assert rep.capabilities.concurrent_streams_ok is False and not check.supported
    assert rep.safe_concurrency == 1 and "overlapping streams were cut (truncated_stream)" in check.detail
    assert "overlapping requests were cut" in check.detail  # the plain pair (HTTP 503) too
    assert rep.capabilities.streaming and rep.capabilities.seed is False  # the fake has no seed
    assert rep.requests <= 13  # 10, and the three of the enforced-parameter checks (issue 35 item 4)
    path = tmp_path / "providers.toml"
    path.write_text('[providers.one-slot]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n', encoding="utf-8")
    write_capabilities("one-slot", rep.capabilities, path, concurrency=rep.safe_concurrency)
    data = tomllib.loads(path.read_text(encoding="utf-8"))["providers"]["one-slot"]
    assert data["rate_limits"]["concurrency"] == 1
    assert data["capabilities"]["concurrent_streams_ok"] is False


def test_probe_keeps_the_width_of_a_server_that_takes_overlap() -> None:
    rep, overlap = _discover(tolerant=True)
    check = next(c for c in rep.checks if c.name == "concurrency")
    assert overlap >= 2
    assert rep.capabilities.concurrent_streams_ok is True and check.supported and check.value == 2
    assert rep.safe_concurrency is None


def test_cli_probe_write_stores_concurrency_1(tmp_path) -> None:
    """``auditor providers probe NAME --write`` against the one-slot server (on its own thread)."""
    from typer.testing import CliRunner

    from auditor.cli import app

    with threaded_server(n_tokens=6, token_delay_s=0.01) as srv:
        path = tmp_path / "providers.toml"
        path.write_text(f'[providers.one-slot]\nbase_url = "{srv.base_url}"\nmodel = "m"\n', encoding="utf-8")
        r = CliRunner().invoke(app, ["providers", "probe", "one-slot", "--config", str(path), "--write", "--json"])
    assert r.exit_code == 0, r.output
    data = tomllib.loads(path.read_text(encoding="utf-8"))["providers"]["one-slot"]
    assert data["rate_limits"]["concurrency"] == 1
    assert data["capabilities"]["concurrent_streams_ok"] is False
    assert "concurrency = 1" in r.output
