"""EvidenceBatch construction, validation, sanitisation; record serialisation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from auditor.detectors import DetectorResult, EvidenceBatch, PositionEvidence, not_run


def _pos(i, token, provider_top=None, anomalies=(), temp=0.0, ptok=None, prompt="a"):
    return PositionEvidence(
        prompt_id=prompt,
        position=i,
        token_id=token,
        temperature=temp,
        ref_top_ids=[3, 1, 2],
        ref_top_logprobs=np.log([0.2, 0.5, 0.1]),  # unsorted on purpose
        ref_token_logprob=None,
        provider_top=provider_top or {},
        provider_token_logprob=ptok,
        anomalies=anomalies,
        token_text=f"t{token}",
    )


def test_from_positions_sorts_and_derives():
    b = EvidenceBatch.from_positions(
        [
            _pos(0, 1, {1: np.log(0.45), 3: np.log(0.25), 7: np.log(0.05)}),
            _pos(1, 7, {1: np.log(0.5)}, ptok=np.log(0.01)),
        ]
    )
    assert len(b) == 2 and b.has_reference
    assert b.ref_top_ids[0].tolist() == [1, 3, 2]
    np.testing.assert_allclose(np.exp(b.ref_top_logprobs[0]), [0.5, 0.2, 0.1])
    # token logprob filled from the top-K; unknown (token 7 not in top-K, no full row) stays NaN
    assert b.ref_token_logprobs[0] == pytest.approx(np.log(0.5))
    assert math.isnan(b.ref_token_logprobs[1])
    # provider lists padded to M=3 and sorted; emitted-token logprob filled from the list
    assert b.provider_top_ids.shape == (2, 3)
    assert b.provider_top_ids[0].tolist() == [1, 3, 7]
    assert b.provider_top_ids[1].tolist() == [1, -1, -1]
    assert b.provider_token_logprobs[0] == pytest.approx(np.log(0.45))
    assert b.provider_token_logprobs[1] == pytest.approx(np.log(0.01))
    # reference logprob at provider-listed ids: known for 1 and 3, unknown for 7
    np.testing.assert_allclose(b.ref_at_provider_top[0, :2], np.log([0.5, 0.2]))
    assert math.isnan(b.ref_at_provider_top[0, 2])
    assert b.provider_listed.tolist() == [3, 1]
    row = b.evidence_row(0)
    assert row["ref_top5"][0] == [1, pytest.approx(np.log(0.5), abs=1e-6)]
    assert row["token"] == "t1" and row["prompt_id"] == "a"
    json.dumps(row)


def test_full_rows_give_reference_values_everywhere():
    v = 6
    lp = np.log(np.array([[0.4, 0.3, 0.1, 0.1, 0.05, 0.05]]))
    b = EvidenceBatch.from_arrays(
        prompt_ids=["p"],
        token_ids=[5],
        temperatures=1.0,
        ref_full_logprobs=lp,
        provider_top_ids=np.array([[0, 5]]),
        provider_top_logprobs=np.log(np.array([[0.4, 0.1]])),
    )
    assert b.ref_top_ids.shape[1] == v
    assert b.ref_token_logprobs[0] == pytest.approx(np.log(0.05), rel=1e-6)
    np.testing.assert_allclose(b.ref_at_provider_top[0], np.log([0.4, 0.05]), rtol=1e-6)


def test_provider_sanitisation_never_raises():
    b = EvidenceBatch.from_positions(
        [
            _pos(0, 1, {1: -9999.0, 3: np.log(0.3)}),  # sentinel dropped
            _pos(1, 1, {1: 0.5}),  # positive logprob: untrusted
            _pos(2, 1, {1: np.log(0.9), 3: np.log(0.9)}),  # mass > 1: untrusted
            _pos(3, 1, {1: np.log(0.5)}, anomalies=["zero_logprob_run"]),
            _pos(
                4, 1, {1: np.log(0.5)}, anomalies=["greedy_not_argmax"]
            ),  # evidence, still trusted
            _pos(5, 1, {1: float("nan"), 2: float("-inf")}),
        ]
    )
    assert b.provider_top_ids[0].tolist()[:1] == [3]
    assert b.provider_trusted.tolist() == [True, False, False, False, True, True]
    assert b.provider_listed[5] == 0


def test_duplicate_provider_ids_keep_the_largest():
    b = EvidenceBatch.from_arrays(
        prompt_ids=["p"],
        token_ids=[1],
        temperatures=0.0,
        provider_top_ids=np.array([[4, 4, 2]]),
        provider_top_logprobs=np.log(np.array([[0.2, 0.5, 0.1]])),
    )
    assert b.provider_top_ids[0].tolist() == [4, 2, -1]
    assert b.provider_top_logprobs[0, 0] == pytest.approx(np.log(0.5))
    assert not b.has_reference


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {
                "ref_top_ids": np.array([[0, 1]]),
                "ref_top_logprobs": np.array([[0.5, -1.0]]),
            },
            "<= 0 nats",
        ),
        (
            {
                "ref_top_ids": np.array([[0, 1]]),
                "ref_top_logprobs": np.log([[0.8, 0.7]]),
            },
            "log-softmax",
        ),
        ({"ref_top_ids": np.array([[0, 1]])}, "both ref_top_ids and ref_top_logprobs"),
        (
            {
                "ref_top_ids": np.array([[0, 1]]),
                "ref_top_logprobs": np.array([[np.nan, -1.0]]),
            },
            "NaN",
        ),
        ({"temperatures": -1.0}, "temperatures"),
        ({"prompt_ids": ["a", "b"]}, "prompt_ids"),
    ],
)
def test_reference_errors_name_the_field(kwargs, match):
    base = {"prompt_ids": ["a"], "token_ids": [0], "temperatures": 0.0}
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        EvidenceBatch.from_arrays(**base)


def test_mixed_reference_presence_is_an_error():
    a = _pos(0, 1)
    b = PositionEvidence(prompt_id="a", position=1, token_id=1, temperature=0.0)
    with pytest.raises(ValueError, match="every position or for none"):
        EvidenceBatch.from_positions([a, b])


def test_subset_keeps_alignment():
    b = EvidenceBatch.from_positions(
        [_pos(i, 1 + (i % 2), prompt=f"p{i % 3}") for i in range(9)]
    )
    s = b.subset(b.token_ids == 2)
    assert len(s) == 4 and set(s.token_ids.tolist()) == {2}
    assert s.ref_top_ids.shape == (4, 3)


def test_detector_result_json_roundtrip():
    r = DetectorResult(
        "x",
        1.5,
        float("nan"),
        0.1,
        (0.0, float("inf")),
        12,
        [{"a": np.int64(3)}],
        details={"k": np.float64(2)},
    )
    d = r.to_dict()
    s = json.dumps(d, allow_nan=False)
    assert (
        d["p_value"] is None
        and d["effect_ci"] == [0.0, None]
        and d["evidence"] == [{"a": 3}]
    )
    back = DetectorResult.from_dict(json.loads(s))
    assert (
        back.name == "x"
        and math.isnan(back.p_value)
        and back.n == 12
        and back.details == {"k": 2.0}
    )
    nr = not_run("y", "why", n=3)
    assert not nr.ran and nr.reason == "why" and nr.n == 3
