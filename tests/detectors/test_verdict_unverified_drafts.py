"""Rule 1d (issue 35 item 3, synthetic acceptance): greedy contradictions of the provider's own top-1 that
avoid the last token of the streamed steps are drafts emitted unverified (RELAXED_VERIFICATION); the same
contradictions anywhere in the steps, or at their last token, or without speculation, stay
DECODING_NONCOMPLIANT (rule 1)."""

from __future__ import annotations

import numpy as np
import pytest

from auditor.check.observations import _step_final
from auditor.detectors.base import EvidenceBatch
from auditor.detectors.consistency import self_greedy, step_counts
from auditor.verdict.decide import decide_verdict
from tests.verdict_results import mk

GAP = 4.0  # clear, but far short of rule 1u's UNVERIFIED_GAP_NATS: a 1u verdict cannot be what names it


def _batch(where: str, *, step: int = 4, n: int = 400, n_contra: int = 40, seed: int = 0) -> EvidenceBatch:
    """Greedy positions streamed in chunks of ``step`` tokens; ``n_contra`` of them emit the provider's
    2nd-ranked id ``GAP`` nats below its top-1: ``inside`` the chunks only (unverified drafts), at their
    ``final`` token only (a verified engine whose decoding parameter departs: the draft is rejected there),
    or ``anywhere``."""
    rng = np.random.default_rng(seed)
    final = (np.arange(n) % step) == step - 1
    pool = {"inside": np.flatnonzero(~final), "final": np.flatnonzero(final), "anywhere": np.arange(n)}[where]
    tok = np.ones(n, np.int64)
    tok[rng.choice(pool, n_contra, replace=False)] = 2
    lp1 = np.full(n, -0.3)
    ids = np.tile(np.array([[1, 2]], np.int64), (n, 1))
    return EvidenceBatch.from_arrays(
        prompt_ids=np.array([f"p{i // 40}" for i in range(n)], object), positions=np.arange(n) % 40,
        token_ids=tok, temperatures=np.zeros(n), provider_top_ids=ids,
        provider_top_logprobs=np.stack([lp1, lp1 - GAP], 1), provider_token_logprobs=np.where(tok == 1, lp1, lp1 - GAP),
        provider_trusted=np.ones(n, bool), step_final=final.astype(float),
    )


def test_contradictions_inside_the_steps_are_unverified_drafts() -> None:
    r = self_greedy(_batch("inside"))
    st = r.details["steps"]
    assert st["positions"] == 400 and st["final_positions"] == 100 and st["clear"] == 40 and st["clear_final"] == 0
    assert st["p_value"] == pytest.approx(0.75 ** 40)
    assert r.details["n_unverified"] == 0
    v = decide_verdict([r])
    assert v.verdict == "RELAXED_VERIFICATION" and v.details["rule"] == "1d-unverified-drafts", v.reason
    assert "without verification" in v.reason and "0 fall on the last token" in v.reason


@pytest.mark.parametrize("where", ["final", "anywhere"])
def test_contradictions_that_end_steps_stay_decoding_noncompliant(where: str) -> None:
    v = decide_verdict([self_greedy(_batch(where))])
    assert v.verdict == "DECODING_NONCOMPLIANT" and v.details["rule"] == "1-self-greedy", v.reason


def test_without_speculation_every_token_ends_its_step() -> None:
    r = self_greedy(_batch("anywhere", step=1))
    assert r.details["steps"]["p_value"] == 1.0
    assert decide_verdict([r]).details["rule"] == "1-self-greedy"


def test_contradictions_placed_at_random_rarely_name_drafts() -> None:
    """Calibration of the binomial test under its null (a decoding parameter acts on every pick alike):
    rule 1d fires at most at about alpha (0.05) over 400 placements."""
    fired = sum(decide_verdict([self_greedy(_batch("anywhere", seed=s))]).details["rule"] == "1d-unverified-drafts"
                for s in range(400))
    assert fired / 400 <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / 400), fired


def test_step_counts_without_known_chunks() -> None:
    clear = np.array([True, False])
    assert step_counts(None, np.arange(2), clear) == {}
    assert step_counts(np.full(2, np.nan), np.arange(2), clear) == {}
    assert "steps" not in self_greedy(EvidenceBatch.from_arrays(
        prompt_ids=np.array(["p"] * 40, object), token_ids=np.ones(40, np.int64), temperatures=np.zeros(40),
        provider_top_ids=np.ones((40, 1), np.int64), provider_top_logprobs=np.full((40, 1), -0.1),
        provider_token_logprobs=np.full(40, -0.1), provider_trusted=np.ones(40, bool))).details


def test_step_final_values_are_checked() -> None:
    with pytest.raises(ValueError, match="step_final"):
        _batch("inside").from_arrays(prompt_ids=np.array(["p"], object), token_ids=[1], temperatures=[0.0],
                                     step_final=[0.5])
    with pytest.raises(ValueError, match="step_final must have N=1"):
        _batch("inside").from_arrays(prompt_ids=np.array(["p"], object), token_ids=[1], temperatures=[0.0],
                                     step_final=[1.0, 0.0])


class _Attempt:
    def __init__(self, tpc):
        self.tokens_per_chunk = tpc


def test_step_final_from_the_answering_attempt() -> None:
    assert _step_final([_Attempt([1, 3, 2])], 6) == [True, False, False, True, False, True]
    assert _step_final([_Attempt([5]), _Attempt([2, 1]), _Attempt(None)], 3) == [False, True, True]  # last that streamed
    assert _step_final([_Attempt([1, 0, 2])], 3) == [True, False, True]  # an empty chunk holds no token
    assert _step_final([_Attempt([2, 2])], 5) is None  # chunks do not cover the tokens
    assert _step_final([_Attempt(None)], 2) is None and _step_final([], 2) is None
    assert _step_final([_Attempt([1, -1, 2])], 2) is None


def test_preflight_greedy_departures_are_explained_by_the_unverified_drafts() -> None:
    """The pre-flight's greedy-top1 check reads the same departures from the provider's own top-1 on a few
    answers, without their stream steps: under rule 1d it is explained by RELAXED_VERIFICATION, not a second,
    DECODING_NONCOMPLIANT cause (issue 35 with issue 37 item 6). Under rule 1 (a decoding parameter) it stays
    the pre-flight's own DECODING_NONCOMPLIANT."""
    pre = mk("preflight-greedy-top1", 1e-12, n=96, statistic=30)
    v = decide_verdict([self_greedy(_batch("inside")), pre])
    assert v.verdict == "RELAXED_VERIFICATION" and v.details["rule"] == "1d-unverified-drafts", v.reason
    assert [c["rule"] for c in v.details["secondary_causes"]] == [] and "DECODING_NONCOMPLIANT" not in v.reason
    f = {x["detector"]: x for x in v.details["findings"]}["preflight-greedy-top1"]
    assert f["explained_by"] == "RELAXED_VERIFICATION" and "1d-unverified-drafts" in f["implication"]
    v = decide_verdict([self_greedy(_batch("final")), pre])
    assert v.details["rule"] == "1-self-greedy"
    assert "explained_by" not in {x["detector"]: x for x in v.details["findings"]}["preflight-greedy-top1"]


def _fingerprint(repetition: float, chat: float, ci95: tuple[float, float] | None) -> dict[str, object]:
    """A speculation object (``SpeculationEstimate.to_dict()``) that could not tell chunks from steps, with
    tokens per chunk on 3 repetition and 9 chat answers and their ratio's bootstrap interval (None: none)."""
    fig = {"per": "chunk", "by_workload": {"chat": {"mean": chat, "n_responses": 9},
                                           "repetition": {"mean": repetition, "n_responses": 3}},
           "predictable_over_other": None if ci95 is None else repetition / chat,
           "ci95": None if ci95 is None else list(ci95), "n_predictable": 3, "n_other": 9}
    return {"detected": None, "mean_accepted_tokens_per_step": None, "ci95": None,
            "evidence": {"mode": "time-batched", "by_predictability": fig}}


def test_unverified_drafts_name_the_accepted_length_that_does_not_move_with_predictability() -> None:
    """Issue 35 item 3: under rule 1d (the chunks end at the target's own token, so they are the steps) the
    reason quotes the accepted length per step on repetition and chat prompts: flat is synthetic acceptance's
    fixed length; one that grows with predictability is a verifier's, said as such."""
    flat = decide_verdict([self_greedy(_batch("inside"))], speculation=_fingerprint(3.9, 3.88, (0.98, 1.03)))
    assert flat.details["rule"] == "1d-unverified-drafts"
    assert ("does not move with predictability (3.90 tokens per streamed step on repetition prompts, 3.88 on chat "
            "(repetition / other 1.01, 95% CI [0.98, 1.03], 3 and 9 responses))") in flat.reason
    assert "synthetic acceptance emits the same number of drafts per step whatever the text" in flat.reason
    fig = flat.details["speculation"]["by_predictability"]
    assert fig["trend"] == "flat" and fig["per"] == "chunk" and fig["by_workload"] == {"chat": 3.88, "repetition": 3.9}
    grows = decide_verdict([self_greedy(_batch("inside"))], speculation=_fingerprint(3.2, 1.6, (1.7, 2.3)))
    assert grows.details["rule"] == "1d-unverified-drafts" and "grows with predictability" in grows.reason
    assert grows.details["speculation"]["by_predictability"]["trend"] == "grows"
    none = decide_verdict([self_greedy(_batch("inside"))], speculation=_fingerprint(3.9, 3.88, None))
    assert "against predictability is undetermined (3.90 tokens per streamed step" in none.reason
    assert "no interval from 3 and 9 responses" in none.reason
    # no stream steps shown (rule 1): chunk figures are not steps and stay out of the reason
    v = decide_verdict([self_greedy(_batch("anywhere"))], speculation=_fingerprint(3.9, 3.88, (0.98, 1.03)))
    assert v.details["rule"] == "1-self-greedy" and "predictability" not in v.reason
