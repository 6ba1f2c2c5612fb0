"""Issue 37, item 2, through the whole ``check`` pipeline: a quantized provider audited with ``logprobs = false``
(int4 simulator, suite smoke) is never accused of relaxed verification.

Without the provider's own top_logprobs, greedy near-tie flips cannot tell a quantized model (its argmax moves
at near-ties) from a lossy greedy verifier. The stored near-tie result must say that none of its flips came
with the provider's list, and whatever the audit decides, it must not answer the verification question "no"
(the issue's audit did: RELAXED_VERIFICATION, "established by greedy-near-tie (3 flips in 5 near-tie
positions)"). Which rule decides depends on the floor (here greedy-match usually names QUANTIZATION first);
the rule itself (3n-model-or-verification) is tested in tests/detectors/test_verdict.py and test_near_tie.py.
"""

from __future__ import annotations

from pathlib import Path

from auditor.check.pipeline import run_check
from auditor.detectors import DetectorResult
from auditor.verdict.decide import decide_verdict
from auditor.verdict.questions import answer_questions


def test_int4_without_logprobs_is_never_called_relaxed_verification(tmp_path: Path, tiny_sims, tiny_lm, small_floors,
                                                                     monkeypatch) -> None:
    from auditor.check import reference_setup

    monkeypatch.setitem(reference_setup._MODELS, ("tiny-ref", "float32"), tiny_lm)
    cfg = tmp_path / "providers.toml"
    cfg.write_text(
        f'[providers.q]\nbase_url = "{tiny_sims.url("int4")}"\nmodel = "tiny"\napi = "chat"\nreference = "tiny-ref"\n'
        "timeout_s = 300\n\n[providers.q.capabilities]\nmax_top_logprobs = 0\nlogprobs = false\nn = true\nseed = true\n"
        "streaming = true\n\n[providers.q.rate_limits]\nconcurrency = 2\n")
    rep = run_check("q", suite="smoke", db_url=f"sqlite:///{tmp_path / 'a.db'}", config_path=str(cfg))
    assert rep.verdict != "RELAXED_VERIFICATION", rep.verdict_reason
    causes = [rep.verdict] + [c["verdict"] for c in rep.secondary_causes]
    assert "RELAXED_VERIFICATION" not in causes
    ver = next(q for q in rep.questions if q.key == "verification")
    assert ver.answer != "no", ver
    nt = next(d for d in rep.detectors if d["name"] == "greedy-near-tie")
    assert nt["ran"] and nt["details"]["flips_with_provider_list"] == 0  # no list came back to tell the two apart
    # the audit's own near-tie result, had it been the deciding test (greedy-match quiet), names the pair
    r = DetectorResult("greedy-near-tie", max(3.0, float(nt["statistic"])), 1e-9, 0.6, (0.6, 0.6), max(5, nt["n"]),
                       [], details=dict(nt["details"]))
    v = decide_verdict([r])
    assert v.verdict == "QUANTIZATION_OR_RELAXED_VERIFICATION", v.reason
    assert [a.answer for a in answer_questions(v.verdict, v.details)] == ["not established", "not established"]
