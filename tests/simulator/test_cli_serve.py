"""``auditor serve``: profile listing, usage errors, and a real server process answering the client."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from auditor.cli import app
from tests.server_process import stop_process, wait_until_up


def test_list_profiles():
    r = CliRunner().invoke(app, ["serve", "--list-profiles"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    for name in ("honest-fp32", "int4", "relaxed-threshold", "typical-acceptance", "substituted",
                 "decode-noncompliant", "truncated-sampling"):
        assert name in r.output


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--profile", "nope"], "unknown profile"),
        (["--profile", "relaxed-threshold", "--accept-threshold-single", "2"], "thresholds"),
    ],
)
def test_usage_errors_exit_3(args, msg):
    r = CliRunner().invoke(app, ["serve", *args])
    assert r.exit_code == 3 and msg in r.output


def test_serve_process_answers_official_client(tiny_lm, tmp_path):
    """`auditor serve --profile relaxed-threshold` in its own process, on a free loopback port."""
    from openai import OpenAI

    from reference.loopback import free_port

    d = tmp_path / "tiny"
    tiny_lm.model.save_pretrained(d)
    tiny_lm.tokenizer.save_pretrained(d)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "auditor", "serve", "--profile", "relaxed-threshold", "--model", str(d),
         "--served-model-name", "acme-1", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"},
    )
    try:
        # the log is the process's stdout pipe: read it only once the process has exited (else it blocks)
        wait_until_up(proc, f"http://127.0.0.1:{port}/health", timeout_s=180,
                      log=lambda: proc.stdout.read() if proc.poll() is not None else "")
        with OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60) as c:
            assert [m.id for m in c.models.list().data] == ["acme-1"]
            r = c.chat.completions.create(model="acme-1", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          temperature=1.0, logprobs=True, top_logprobs=3)
            assert r.choices[0].logprobs.content and r.usage.completion_tokens >= 1
    finally:
        stop_process(proc)
