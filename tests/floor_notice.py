"""Say on the terminal when the test session measures a noise floor into its own cache (``noise_dir``).

The first audit of a model in a test session measures that model's honest noise floor
(``auditor.check.measured_floors.compute_floors``), about 7 minutes on 2 quiet CPU cores for the
default SmolLM2-135M (README), inside whichever test audits first; pytest captures that test's output,
so the session looked hung. :func:`announcing` wraps ``compute_floors`` so that such a measurement
writes one line when it starts (what, how big, roughly how long) and one when it ends (seconds taken),
through pytest's terminal reporter with output capture suspended (``sys.__stderr__`` would not do:
pytest's default fd capture redirects file descriptor 2 too).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: Prefix of the lines, so they read as the test session's, not a test's.
PREFIX = "[noise floor]"


def say(config: Any, message: str) -> None:
    """Write ``message`` as one terminal line, visible whatever pytest is capturing (``config``: the
    pytest Config; without a terminal reporter, e.g. ``-p no:terminal``, it goes to ``sys.__stderr__``)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    suspended = capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext()
    # suspending and resuming pytest's capture sets sys.stdout / sys.stderr to pytest's own streams; a floor measured
    # inside ``CliRunner().invoke`` had its runner's streams replaced, collected and closed ("I/O operation on closed
    # file"): whatever holds them now gets them back
    streams = (sys.stdin, sys.stdout, sys.stderr)
    try:
        with suspended:
            if reporter is not None:
                reporter.ensure_newline()
                reporter.write_line(f"{PREFIX} {message}", bold=True)
            else:
                print(f"{PREFIX} {message}", file=sys.__stderr__, flush=True)
    finally:
        sys.stdin, sys.stdout, sys.stderr = streams


#: Bundled models whose floor takes minutes (README: ~7 min for SmolLM2-135M on 2 quiet cores); the tests' tiny
#: random models (``tests/conftest.py``, hidden size 64) measure theirs in seconds.
_MINUTES = {"smollm2": "about 7 min on 2 quiet CPU cores, longer on a busy machine",
            "gemma": "several minutes on 2 quiet CPU cores, longer on a busy machine"}


def rough_time(model: str) -> str:
    """How long a floor of ``model`` (a model name, e.g. ``smollm2-135m-instruct+fp8``, ``tiny``) roughly takes."""
    low = model.lower()
    return next((t for key, t in _MINUTES.items() if key in low), "seconds for a tiny test model")


def announcing(compute_floors: Callable[..., Any], config: Any, session_dir: Path) -> Callable[..., Any]:
    """``compute_floors`` that says when it measures a floor into ``session_dir`` (the session's floor
    cache, which ``get_floors`` passes as ``spill_dir``) and when it is done; other measurements (tests'
    own small floors in their own folders) stay silent."""

    @functools.wraps(compute_floors)
    def wrapper(ref_lms: Any, *args: Any, **kwargs: Any) -> Any:
        spill = kwargs.get("spill_dir")
        if spill is None or Path(spill).resolve() != Path(session_dir).resolve():
            return compute_floors(ref_lms, *args, **kwargs)
        model = next(iter(ref_lms.values())).name
        n_prompts = len(kwargs.get("prompts") or ())
        tokens = kwargs.get("max_new_tokens", "?")
        if not os.environ.get("PYTEST_XDIST_WORKER"):
            return _measure(compute_floors, config, session_dir, model, n_prompts, tokens, ref_lms, args, kwargs)
        # the identity get_floors' own cache file has: model name and revision, references, prompts, tokens
        revision = getattr(next(iter(ref_lms.values())), "revision", None)
        key = hashlib.sha256(repr((model, revision, list(ref_lms), kwargs.get("prompt_names"), kwargs.get("prompts"),
                                   tokens)).encode()).hexdigest()[:16]
        with _exclusive(Path(session_dir) / f".floor-{key}.lock"):
            # under pytest-xdist the session folder is every worker's (tests/conftest.py): the first worker to ask
            # measures, a second one asking for the same floor waits for it and takes its result
            done = Path(session_dir) / f".floor-{key}.json"
            if done.is_file():
                from auditor.check.measured_floors import FloorSet

                return FloorSet.from_json(done.read_text(encoding="utf-8"))
            result = _measure(compute_floors, config, session_dir, model, n_prompts, tokens, ref_lms, args, kwargs)
            if hasattr(result, "to_json"):  # a stand-in result in this module's own tests has none
                tmp = done.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(result.to_json(), encoding="utf-8")
                tmp.replace(done)
            return result

    return wrapper


@contextlib.contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock`` (created if missing) for the block: one process at a time."""
    with open(lock, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _measure(compute_floors: Callable[..., Any], config: Any, session_dir: Path, model: str, n_prompts: int,
             tokens: Any, ref_lms: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Measure (``compute_floors``), saying so when it starts and when it ends."""
    say(config, f"measuring the honest noise floor of {model} for this test session ({n_prompts} prompts × "
                f"{tokens} tokens, references {', '.join(ref_lms)}) into {session_dir}: {rough_time(model)}; "
                "once per model and floor size (prompts × tokens) in a session, the test that triggered it "
                "prints nothing meanwhile")
    t0 = time.perf_counter()
    ok = False
    try:
        result = compute_floors(ref_lms, *args, **kwargs)
        ok = True
        return result
    finally:
        took = time.perf_counter() - t0
        say(config, f"noise floor of {model} measured in {took:.0f} s; later audits in this session reuse it"
            if ok else f"noise floor of {model}: the measurement failed after {took:.0f} s")
