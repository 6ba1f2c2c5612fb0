"""The probe stage's progress display: live counters of a run session, shown as it goes.

:class:`RunProgress` holds the counters :mod:`auditor.check.runner` updates after every finished probe;
:class:`ProgressDisplay` shows them as a rich progress bar on the console, passes them to a caller's
callback, or does nothing (``run_probes(progress=...)``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ProgressDisplay", "RunProgress"]


@dataclass
class RunProgress:
    """Live counters passed to a progress callback after every finished probe."""

    run_id: str
    total: int  # probes in the run
    done: int  # finished before this session + in it (ok + failed)
    ok: int
    failed: int
    attempts: int  # attempts sent in this session
    retries: int  # attempts beyond each probe's first, this session


class ProgressDisplay:
    """The session's progress: a rich bar on the console (``progress=True``), a callback with the
    :class:`RunProgress` (``progress`` callable), or nothing."""

    def __init__(self, progress: bool | Callable[[RunProgress], None] | None, state: RunProgress, title: str,
                 console: Any | None) -> None:
        self.state = state
        self.callback = progress if callable(progress) else None
        self.bar: Any = None
        if progress is True:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("ok {task.fields[ok]} · failed {task.fields[failed]} · retries {task.fields[retries]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console or Console(stderr=True),
                transient=False,
            )
            self.bar.start()
            self.task_id = self.bar.add_task(title, total=state.total, completed=state.done, ok=state.ok,
                                             failed=state.failed, retries=0)

    def count(self, outcome: str | None) -> None:
        """Count a finished probe (``done``/``failed``; None: not finished)."""
        if outcome is None:
            return
        self.state.done += 1
        if outcome == "done":
            self.state.ok += 1
        else:
            self.state.failed += 1

    def report(self) -> None:
        st = self.state
        if self.bar is not None:
            self.bar.update(self.task_id, completed=st.done, ok=st.ok, failed=st.failed, retries=st.retries)
        if self.callback is not None:
            self.callback(st)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
