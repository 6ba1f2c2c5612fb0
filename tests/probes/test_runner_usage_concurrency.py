"""A probe run against a llama.cpp-like server (one slot; streams carry no ``usage``; a running
stream is cancelled whenever another request arrives), through ``auditor.check.runner.run_probes``:

- at the default width 8 the run completes with few failures (the client's adaptive limit
  narrows to 1) and the run's summary records the width change;
- the spend is not "0 prompt tokens": prompt tokens are counted (reference tokenizer when
  cached, else characters/4), completion tokens are the normalized tokens, and the summary
  says the figures are estimated and for how many responses.
"""

from __future__ import annotations

from pathlib import Path

from auditor.check.runner import run_probes, summarize_run
from auditor.check.usage_estimate import PromptTokenEstimator
from auditor.store import open_store
from auditor.store import queries as q
from probes.config import Capabilities, ProviderConfig
from probes.suites import Probe, Suite
from tests.probes._one_slot_server import threaded_server

N = 12


def _suite() -> Suite:
    probes = [
        Probe(id=f"chat-greedy-{i:03d}", workload="chat", mode="greedy",
              messages=[{"role": "user", "content": f"Say something about item {i}."}], max_tokens=6, temperature=0.0)
        for i in range(N)
    ]
    return Suite(name="usage-est", version="1", description="test", probes=probes)


def test_run_against_one_slot_server_estimates_usage_and_narrows(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    with threaded_server(n_tokens=6, token_delay_s=0.01) as srv:
        cfg = ProviderConfig(
            name="one-slot", base_url=srv.base_url, model="m", timeout_s=10,
            capabilities=Capabilities(max_top_logprobs=0, logprobs=False, streaming=True, stream_usage=False),
            rate_limits={"concurrency": 8},
            retry={"max_attempts": 4, "backoff_initial_s": 0.02, "backoff_max_s": 0.1},
        )
        rid = run_probes(store, cfg, _suite(), progress=None, stream=True)
    summ = summarize_run(store, rid)
    with store.session() as s:
        extra = dict(q.get_run(s, rid).summary or {})
    assert summ.probes_ok >= N - 1, summ.error_kinds
    assert extra["concurrency"]["configured"] == 8 and extra["concurrency"]["min"] == 1
    assert extra["concurrency"]["summary"].startswith("concurrency reduced 8→1 after")
    # usage: none was sent, so every done probe is estimated
    assert extra["usage_estimated"] is True
    assert extra["usage_missing_responses"] == summ.probes_ok
    est = PromptTokenEstimator("smollm2-135m-instruct")
    assert extra["usage_prompt_tokens_method"] == est.method
    assert summ.completion_tokens == 6 * summ.probes_ok
    want = sum(est.count({"messages": [{"role": "user", "content": f"Say something about item {i}."}]}) for i in range(N))
    assert summ.prompt_tokens > 0
    assert summ.prompt_tokens <= want  # failed probes (if any) are not counted
