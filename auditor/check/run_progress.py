"""The probe stage's progress display: live counters of a run session, shown as it goes.

:class:`RunProgress` holds the counters :mod:`auditor.check.runner` updates after every finished probe;
:class:`ProgressDisplay` shows them as a rich progress bar on the console, passes them to a caller's
callback, or does nothing (``run_probes(progress=...)``). :func:`progress_bar` is the rich bar of
every audit stage (probing here, noise floor and reference scoring in ``auditor.check.pipeline``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ProgressDisplay", "RunProgress", "progress_bar"]


def progress_bar(console: Any | None, *stats: str, remaining: bool = False, transient: bool = False,
                 disable: bool = False) -> Any:
    """A rich ``Progress`` on ``console`` (default: a stderr console): bold description, bar, done/total,
    one text column per ``stats`` template (``{task.fields[...]}``), elapsed (and remaining) time.

    Every column but the bar keeps its text whole (``no_wrap``): on a narrow terminal (80 columns) the
    bar shrinks first, instead of rich cutting the description and the numbers to ``3…`` / ``0:0…``.
    Descriptions should stay short (a provider or stage name) so that the bar keeps some width.

    ``transient``: the bar is erased when it stops (a command whose result table follows, ``auditor speed``);
    ``disable``: nothing is drawn (``--no-progress``).

    Returns:
        ``rich.progress.Progress``, not started.
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Column

    def whole() -> Column:
        return Column(no_wrap=True)

    columns: list[ProgressColumn] = [TextColumn("[bold]{task.description}", table_column=whole()), BarColumn(),
                                     MofNCompleteColumn(table_column=whole())]
    columns += [TextColumn(t, table_column=whole()) for t in stats]
    columns.append(TimeElapsedColumn(table_column=whole()))
    if remaining:
        columns.append(TimeRemainingColumn(table_column=whole()))
    return Progress(*columns, console=console or Console(stderr=True), transient=transient, disable=disable)


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
    :class:`RunProgress` (``progress`` callable), or nothing.

    The bar is described by ``title`` alone (the provider's name: short, so an 80-column terminal
    shows it whole); the run id is said once above it (``probing NAME: run RID, N of M probes to send``).
    """

    def __init__(self, progress: bool | Callable[[RunProgress], None] | None, state: RunProgress, title: str,
                 console: Any | None) -> None:
        self.state = state
        self.callback = progress if callable(progress) else None
        self.bar: Any = None
        if progress is True:
            self.bar = progress_bar(
                console, "ok {task.fields[ok]} · failed {task.fields[failed]} · retries {task.fields[retries]}",
                remaining=True)
            self.bar.start()
            self.bar.console.print(f"probing {title}: run {state.run_id}, {state.total - state.done} of {state.total} "
                                   "probes to send", markup=False, highlight=False)
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
