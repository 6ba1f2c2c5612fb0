"""Issue 40: an honest engine spelling its logprobs as vLLM does (sampled token first in
``top_logprobs``, a multi-token character as ``""`` then the whole character) is never accused —
neither DECODING_NONCOMPLIANT (pre-flight top-p) nor SUBSTITUTION (tokenizer rule) — on the tiny model,
whose random text is full of split characters."""

from __future__ import annotations

import pytest

from auditor.check.pipeline import run_check

from .conftest import providers_toml


@pytest.fixture
def vllm_sim(tmp_path, tiny_lm, small_floors, monkeypatch):
    from auditor.check import reference_setup
    from simulator.server import ServerThread, create_app

    monkeypatch.setitem(reference_setup._MODELS, ("tiny-ref", "float32"), tiny_lm)
    srv = ServerThread(create_app("honest-fp32", lm=tiny_lm, served_model_name="tiny", seed=0,
                                  logprob_convention="vllm"), timeout=120).start()
    cfg = tmp_path / "providers.toml"
    cfg.write_text(providers_toml({"vllm": srv.base_url}, "tiny", reference="tiny-ref"))
    yield {"config": str(cfg), "db": f"sqlite:///{tmp_path / 'a.db'}"}
    srv.stop()


# (suite, planned tokens): the default suite at 800 samples enough split characters that, before issue 40,
# the tokenizer rule "proved" SUBSTITUTION from the whole-character strings (' � Afghan', ...)
CASES = [("default", 800), ("precision", 400)]


@pytest.mark.parametrize(("suite", "budget"), CASES, ids=[c[0] for c in CASES])
def test_honest_vllm_conventions_are_not_accused(vllm_sim, suite, budget) -> None:
    rep = run_check("vllm", suite=suite, budget_tokens=budget, db_url=vllm_sim["db"], config_path=vllm_sim["config"],
                    reference_dtypes=["float32"])
    print(f"\n{suite}: {rep.verdict} — {rep.verdict_reason[:400]}")
    assert rep.verdict not in ("DECODING_NONCOMPLIANT", "SUBSTITUTION", "QUANTIZATION_OR_SUBSTITUTION"), rep.verdict_reason
    assert not rep.verdict_details.get("tokenizer_mismatch"), rep.verdict_details.get("tokenizer_mismatch")
    conv = rep.summary["logprob_convention"]  # learned from the audit's answers and recorded with the run
    if suite == "default":  # sampled answers show the order (an all-greedy suite cannot: its sampled token is the top-1)
        assert conv["name"] == "sampled-first" and conv["certified_m"] == conv["requested"]  # k + 1 entries seen
        assert conv["partial_chars"] == "empty_then_whole"  # the case was exercised
    assert rep.summary["preflight"]["convention"]["name"] == "sampled-first"


# ------------------------------------------------------------------------------------------ item 3
def test_unverified_tokens_answer_verification_no(tmp_path, tiny_lm, small_floors, monkeypatch) -> None:
    """Issue 40 item 3: greedy tokens far below the provider's own top-1 (unverified drafts of rounds
    batched with sampled traffic) → "strict verification? no" with those positions, never SUBSTITUTION."""
    from auditor.check import reference_setup
    from auditor.verdict.questions import answer_questions
    from simulator.server import ServerThread, create_app

    monkeypatch.setitem(reference_setup._MODELS, ("tiny-ref", "float32"), tiny_lm)
    srv = ServerThread(create_app("unverified-mixed-batch", lm=tiny_lm, served_model_name="tiny", seed=0,
                                  logprob_convention="vllm"), timeout=120).start()
    try:
        cfg = tmp_path / "providers.toml"
        cfg.write_text(providers_toml({"spec": srv.base_url}, "tiny", reference="tiny-ref"))
        rep = run_check("spec", suite="default", budget_tokens=800, db_url=f"sqlite:///{tmp_path / 'a.db'}",
                        config_path=str(cfg), reference_dtypes=["float32"])
    finally:
        srv.stop()
    print(f"\nunverified-mixed-batch: {rep.verdict} — {rep.verdict_reason[:400]}")
    assert rep.verdict == "RELAXED_VERIFICATION", rep.verdict_reason
    assert rep.verdict_details["rule"] == "1u-unverified-tokens"
    sg = next(r for r in rep.detectors if r["name"] == "self-greedy")
    d = sg["details"]
    assert d["n_unverified"] >= 3 and 2 * d["n_unverified"] >= d["n_clear"]
    assert all(u["gap"] >= d["unverified_gap_nats"] for u in d["unverified_positions"])
    answers = {a.key: a for a in answer_questions(rep.verdict, rep.verdict_details)}
    assert answers["verification"].answer == "no", answers["verification"].evidence
