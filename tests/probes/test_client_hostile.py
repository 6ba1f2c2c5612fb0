"""A hostile endpoint on loopback (its own process) must not grow the client's memory (issue 13).

The server (``_hostile.py serve``) generates huge bodies lazily; the client runs in another
subprocess and reports its peak RSS (``resource.getrusage``). Each body is far larger than the
client's byte cap, so every request must end as ``response_too_large`` (or
``stream_token_overrun``) with RSS growth bounded by about ``concurrency × cap``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HOSTILE = Path(__file__).with_name("_hostile.py")
ROOT = Path(__file__).parents[2]
MB = 1024 * 1024


def _server(mode: str, size: int) -> tuple[subprocess.Popen[str], int]:
    if str(HOSTILE.parent) not in sys.path:  # tests/probes is not a package
        sys.path.append(str(HOSTILE.parent))
    from _hostile import start_server

    return start_server(mode, size, timeout_s=20.0)


def _probe(port: int, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, str(HOSTILE), "probe", "--port", str(port), *args],
        capture_output=True, text=True, timeout=240, cwd=ROOT, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("mode", "args", "kind", "max_growth_mb"),
    [
        # the default 32 MiB cap, two requests in flight: ~64 MiB of buffers
        ("json", ["--requests", "6", "--concurrency", "2"], "response_too_large", 100),
        # a 4 MiB cap, eight in flight: ~32 MiB of buffers
        ("json", ["--requests", "16", "--concurrency", "8", "--cap", str(4 * MB)], "response_too_large", 100),
        ("line", ["--requests", "16", "--concurrency", "8", "--cap", str(4 * MB), "--stream"], "response_too_large", 100),
        ("sse", ["--requests", "16", "--concurrency", "8", "--stream"], "stream_token_overrun", 60),
    ],
)
def test_hostile_300mb_bodies_bounded_rss(mode: str, args: list[str], kind: str, max_growth_mb: float) -> None:
    proc, port = _server(mode, 300 * MB)
    try:
        res = _probe(port, *args)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    n = int(args[args.index("--requests") + 1])
    assert res["kinds"] == {kind: n}, res
    growth = res["maxrss_end_mb"] - res["maxrss_start_mb"]
    assert growth < max_growth_mb, res
