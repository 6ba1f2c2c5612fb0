"""Follow ``--provider`` through the check pipeline at run time (issue 34's "stops, rooms, climbs").

Runs one tiny-model check test under a profiler that records every product function (not tests, not
site-packages) whose arguments include the run's ``probes.config.ProviderConfig`` object, then prints:

- stops: distinct functions that receive the provider config;
- rooms: distinct files they live in (and the packages: ``probes/``, ``auditor/check/``, ...);
- climbs: in the order of first visits, how often the path re-enters a file it already left.

Usage::

    python scripts/follow_provider.py [REPO] [pytest-node-id]

Default node: ``tests/audit/test_pipeline.py::test_run_check_stores_everything_and_rerenders_identically``
(an honest tiny simulator, the smoke suite). Runs in about a minute on 2 cores.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

DEFAULT_NODE = "tests/audit/test_pipeline.py::test_run_check_stores_everything_and_rerenders_identically"


def main(argv: list[str]) -> int:
    repo = os.path.abspath(argv[1] if len(argv) > 1 else ".")
    node = argv[2] if len(argv) > 2 else DEFAULT_NODE
    sys.path.insert(0, repo)
    os.chdir(repo)
    import pytest

    from probes.config import ProviderConfig

    seq: list[tuple[str, str]] = []

    def prof(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        fn = frame.f_code.co_filename
        if not fn.startswith(repo) or "/tests/" in fn or "/.venv/" in fn:
            return
        try:
            if any(isinstance(v, ProviderConfig) for v in list(frame.f_locals.values())):
                seq.append((os.path.relpath(fn, repo), frame.f_code.co_qualname))
        except Exception:  # a frame whose locals cannot be read is not a stop
            pass

    class Plugin:
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_call(self, item: Any) -> Iterator[None]:
            sys.setprofile(prof)
            threading.setprofile(prof)
            yield
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]

    rc = pytest.main(["-q", "-x", "-p", "no:cacheprovider", node], plugins=[Plugin()])
    stops = list(dict.fromkeys(seq))
    rooms = list(dict.fromkeys(f for f, _ in stops))
    packages = sorted({os.path.dirname(f) for f in rooms})
    files = [f for f, _ in stops]
    path = [f for i, f in enumerate(files) if i == 0 or f != files[i - 1]]
    climbs = sum(1 for i, f in enumerate(path) if f in path[:i])
    out = sys.stdout
    out.write(f"test rc={rc}; stops={len(stops)} functions, rooms={len(rooms)} files in {len(packages)} packages "
              f"({', '.join(packages)}), climbs={climbs} re-entries of a file already left\n")
    for r in rooms:
        out.write(f"  {r}: " + ", ".join(q for f, q in stops if f == r) + "\n")
    return int(rc)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
