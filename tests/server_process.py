"""Helpers for tests that start a server in a subprocess: wait until it answers, then stop it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import httpx
import pytest

__all__ = ["stop_process", "wait_until_up"]


def wait_until_up(
    proc: subprocess.Popen,
    url: str,
    *,
    timeout_s: float,
    poll_s: float = 0.5,
    log: Callable[[], str] = lambda: "",
) -> None:
    """Poll ``GET url`` until it answers 200.

    Args:
        proc: the server process.
        url: a health or model-list URL of the server.
        timeout_s: seconds to wait at most.
        poll_s: seconds between polls.
        log: returns the server's log (its tail) for the failure message; it must not block.

    Fails the test (``pytest.fail``, with the log) when the process exits first or no 200 came
    within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited ({proc.returncode}) before answering {url}: {log()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"server did not answer {url} within {timeout_s:.0f} s: {log()}")
        time.sleep(poll_s)


def stop_process(proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """Terminate ``proc`` (SIGTERM), kill it when it has not exited after ``timeout_s`` seconds, reap it."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)
