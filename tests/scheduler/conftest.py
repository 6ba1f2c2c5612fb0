"""Fixtures for scheduler/alert/feed tests: a fake clock, a migrated SQLite store and a fake
audit runner that records runs in the database the way the ``check`` pipeline does."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pytest

T0 = dt.datetime(2026, 5, 1, 0, 0, tzinfo=dt.UTC)


class FakeClock:
    """A settable clock: ``clock()`` returns the current fake time (aware UTC)."""

    def __init__(self, start: dt.datetime = T0) -> None:
        self.now = start

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, **delta: float) -> dt.datetime:
        self.now += dt.timedelta(**delta)
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


@dataclass
class FakeRunner:
    """Stands in for ``auditor.check.pipeline.run_check``: stores a completed audit run with the next
    verdict from ``verdicts`` (repeating the last) and returns ``{"run_id", "verdict"}``."""

    clock: FakeClock
    verdicts: list[str] = field(default_factory=lambda: ["PASS"])
    calls: list[dict] = field(default_factory=list)
    fail_on: set[int] = field(default_factory=set)

    def __call__(self, provider_name, *, suite, budget_tokens, db_url):
        from auditor.store.db import open_store
        from auditor.store.models import AuditRun

        n = len(self.calls)
        self.calls.append(
            {"provider": provider_name, "suite": suite, "budget_tokens": budget_tokens, "db_url": db_url,
             "at": self.clock()}
        )  # fmt: skip
        if n in self.fail_on:
            raise ConnectionError("provider unreachable")
        verdict = self.verdicts[min(n, len(self.verdicts) - 1)]
        store = open_store(db_url)
        try:
            with store.session() as s:
                run = AuditRun(
                    provider_name=provider_name,
                    kind="audit",
                    suite=suite,
                    status="completed",
                    verdict=verdict,
                    verdict_reason=f"fake verdict {verdict}",
                    started_at=self.clock(),
                    finished_at=self.clock(),
                )
                s.add(run)
                s.flush()
                run_id = run.id
        finally:
            store.close()
        return {"run_id": run_id, "verdict": verdict}

    @property
    def times(self) -> list[dt.datetime]:
        return [c["at"] for c in self.calls]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_url(tmp_path) -> str:
    from auditor.store.db import open_store

    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    open_store(url).close()  # migrate once
    return url


@pytest.fixture
def store(db_url):
    from auditor.store.db import open_store

    s = open_store(db_url)
    yield s
    s.close()
