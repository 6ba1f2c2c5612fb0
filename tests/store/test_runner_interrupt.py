"""An interrupt raised inside a probe worker (here: by the progress callback) stops the run cleanly.

asyncio stops its loop as soon as a task raises ``KeyboardInterrupt`` or ``SystemExit``; the runner
must still cancel and await every worker, so no task is left with an exception nobody retrieved
(asyncio logs "Task exception was never retrieved" when such a task is collected), the run is
marked ``interrupted`` with its unsent probes ``pending``, and the caller gets the original exception.
In-process (``httpx.MockTransport``), no server.
"""

from __future__ import annotations

import asyncio
import gc
import logging

import httpx
import pytest

from auditor.check.runner import run_probes
from auditor.store import open_store
from auditor.store import queries as q
from probes.config import Capabilities, ProviderConfig, RateLimits, RetryPolicy
from probes.suites import Probe, Suite

N_PROBES = 40
STOP_AFTER = 10
BODY = {
    "id": "x",
    "object": "chat.completion",
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


async def _answer(request: httpx.Request) -> httpx.Response:
    await asyncio.sleep(0.002)  # let the four workers overlap
    return httpx.Response(200, json=BODY)


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_interrupt_in_a_worker_leaves_no_unretrieved_task(tmp_path, caplog, exc_type) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncio")
    cfg = ProviderConfig(
        name="interrupt-sim",
        base_url="http://interrupt.invalid/v1",
        model="m",
        api="chat",
        capabilities=Capabilities(streaming=False),
        rate_limits=RateLimits(concurrency=4),
        retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.02),
        timeout_s=2.0,
    )
    suite = Suite(
        name="interrupt",
        version="1",
        description="test",
        probes=[
            Probe(id=f"p{i:02d}", workload="chat", mode="greedy", messages=[{"role": "user", "content": f"x{i}"}],
                  max_tokens=4, temperature=0.0)
            for i in range(N_PROBES)
        ],
    )
    store = open_store(f"sqlite:///{tmp_path / 'i.db'}")

    def stop(state) -> None:
        if state.done >= STOP_AFTER:
            raise exc_type

    with pytest.raises(exc_type):
        run_probes(store, cfg, suite, progress=stop, transport=httpx.MockTransport(_answer), stream=False)
    gc.collect()  # asyncio logs an unretrieved task exception when the task is collected
    noisy = [r.getMessage() for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
    assert noisy == []
    with store.session() as s:
        (run,) = q.list_runs(s)
        counts = q.probe_counts(s, run.id)
        assert run.status == "interrupted"
    assert counts.get("done", 0) >= STOP_AFTER and counts.get("pending", 0) > 0
    assert sum(counts.values()) == N_PROBES
    store.close()
