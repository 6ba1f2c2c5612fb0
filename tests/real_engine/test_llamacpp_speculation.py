"""The speculation fingerprint on a real engine that does not speculate (issue 15 acceptance:
"llama.cpp: no speculation"; result in docs/real-engines.md).

llama-cpp-python 0.3.36's server decodes one token per forward unless started with
``--draft_model prompt-lookup-decoding`` (``llama_cpp/server/settings.py``: ``draft_model`` defaults to
None; ``server/model.py`` then passes no ``LlamaPromptLookupDecoding``) and streams one SSE chunk per
token, so ``auditor speed`` must read its streams as plain decoding: ``detected``
false with an interval at about 1 token per step, on the repetition prompts where a drafter would win.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.real_engine


def test_speed_fingerprint_says_no_speculation(llama_server, real_out, tmp_path, provider_toml):
    cfg = tmp_path / "providers.toml"
    cfg.write_text(provider_toml)  # as `providers probe --write` left it
    proc = subprocess.run(
        [sys.executable, "-m", "auditor", "speed", "--provider", "llamacpp", "--config", str(cfg),
         "--workloads", "chat,repetition", "--concurrency", "1", "--requests-per-cell", "6", "--max-tokens", "64",
         "--json", "--no-store", "--no-progress"],
        capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    (real_out / "speed.json").write_text(json.dumps(report, indent=1))
    spec = report["speculation"]
    assert spec["evidence"]["mode"] in ("step-chunks", "token-chunks"), spec["evidence"]
    assert spec["detected"] is False, spec
    lo, hi = spec["ci95"]
    assert lo <= 1.1 and hi < 1.25, spec  # plain decoding: one token per forward
    done = [c for c in report["cells"] if c.get("tokens_per_s_median")]
    assert {c["workload"] for c in done} == {"chat", "repetition"}, report["cells"]
