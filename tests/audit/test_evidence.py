"""Evidence building: provider tokens aligned by bytes, 1:n tokens skipped but teacher-forced,
alternatives mapped to reference ids, untrusted rows flagged, reference rows at the right offsets."""

from __future__ import annotations

import numpy as np

from auditor.check.evidence import Observation, build_evidence, stored_tokens
from auditor.check.run_detectors import run_reference_detectors
from probes.align import align_to_reference
from probes.records import TokenRecord
from reference.scoring import ScoredContinuation


def _tok(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_build_evidence_positions_and_alternatives(smollm2_tokenizer) -> None:
    tk = smollm2_tokenizer
    two = "Hello world"  # one provider token = two reference tokens (1:n)
    assert len(tk.encode(two, add_special_tokens=False)) == 2
    tokens = [
        TokenRecord(index=0, token=two, bytes=two.encode(), logprob=-0.5, top_logprobs=[(two, two.encode(), -0.5)]),
        TokenRecord(index=1, token=" again", bytes=b" again", logprob=-0.2,
                    top_logprobs=[(" again", b" again", -0.2), (" and", b" and", -2.0), (two, two.encode(), -3.0)]),
        TokenRecord(index=2, token="!", bytes=b"!", logprob=-0.1, top_logprobs=[("!", b"!", -0.1)],
                    anomalies=["positive_logprob"]),
    ]
    al = align_to_reference(tokens, tk)
    assert al.ref_token_ids[0] is None and al.spans[1] == (2, 3) and al.spans[2] == (3, 4)
    obs = Observation(
        probe_id=1, probe_key="p#0", mode="logprob", workload="chat", temperature=0.0, top_p=1.0, request={},
        prompt_ids=[1, 2, 3], tokens=tokens, ref_ids=al.ref_ids, spans=al.spans, one_to_one=al.ref_token_ids,
    )
    T, K = len(al.ref_ids), 4
    top_ids = np.arange(T * K).reshape(T, K) + 100
    top_lp = np.tile(np.log([0.6, 0.2, 0.1, 0.05]), (T, 1))
    sc = ScoredContinuation(al.ref_ids, np.full(T, -1.0) - np.arange(T), top_ids, top_lp)
    batch, index = build_evidence([obs], [sc], tk)
    assert len(batch) == 2 and list(batch.positions) == [1, 2]  # the 1:n token is not a trial
    assert index.rows == [(0, 1), (0, 2)]
    assert list(batch.token_ids) == [_tok(tk, " again"), _tok(tk, "!")]
    # reference rows come from continuation offsets 2 and 3 (after both pieces of token 0)
    assert batch.ref_token_logprobs.tolist() == [-3.0, -4.0]
    assert set(batch.ref_top_ids[0]) == set(top_ids[2])
    # alternatives: the two single-token ones mapped, the multi-token one dropped
    listed = {int(i) for i in batch.provider_top_ids[0] if i >= 0}
    assert listed == {_tok(tk, " again"), _tok(tk, " and")}
    assert batch.provider_trusted.tolist() == [True, False]
    assert batch.token_texts.tolist() == [" again", "!"]
    # without a reference only the provider side is built
    b2, _ = build_evidence([obs], None, tk)
    assert not b2.has_reference and len(b2) == 2


def test_sampling_with_top_p_below_one_carries_its_law(smollm2_tokenizer) -> None:
    """A sample drawn with top_p < 1 (asked, or enforced by the provider: issue 35 item 4) is kept with the
    nucleus it was drawn from, so the sampling tests compare it with that declared law; a greedy position's
    law is the whole distribution whatever top_p was sent."""
    tk = smollm2_tokenizer
    tokens = [TokenRecord(index=i, token=" a", bytes=b" a", logprob=None) for i in range(3)]
    al = align_to_reference(tokens, tk)

    def obs(key: str, temperature: float) -> Observation:
        return Observation(probe_id=1, probe_key=key, mode="sampling", workload="chat", temperature=temperature,
                           top_p=0.9, request={}, prompt_ids=[1], tokens=tokens, ref_ids=al.ref_ids, spans=al.spans,
                           one_to_one=al.ref_token_ids)

    batch, _ = build_evidence([obs("s#0", 1.0), obs("g#0", 0.0)], None, tk)
    assert len(batch) == 6
    assert batch.top_ps is not None and batch.top_ps.tolist() == [0.9] * 3 + [1.0] * 3
    assert batch.top_ks is None and batch.step_final is None


def test_intersection_union_keeps_the_nearest_reference(smollm2_tokenizer) -> None:
    """With two references the kept result is the one with the larger p-value, per detector."""
    from auditor.check.measured_floors import FloorSet
    from auditor.detectors import EvidenceBatch, compute_noise_floor

    rng = np.random.default_rng(0)
    n, V = 200, 30
    ref = rng.normal(size=(n, V)) * 2
    far = ref + rng.normal(size=(n, V)) * 1.0  # a provider far from this reference
    near = ref.copy()  # ... and identical to the other one
    prompts = np.repeat(np.arange(20), 10).astype(str)

    def batch(reference):
        lp = reference - np.log(np.exp(reference).sum(1, keepdims=True))
        prov = near - np.log(np.exp(near).sum(1, keepdims=True))
        tok = prov.argmax(1)
        top_p = np.argsort(-prov, 1)[:, :5]
        return EvidenceBatch.from_arrays(
            prompt_ids=prompts, token_ids=tok, temperatures=np.zeros(n), ref_full_logprobs=lp.astype(np.float32),
            provider_top_ids=top_p, provider_top_logprobs=np.take_along_axis(prov, top_p, 1),
            provider_token_logprobs=prov[np.arange(n), tok],
        )

    fl = compute_noise_floor(ref, ref + rng.normal(size=(n, V)) * 0.01, prompt_ids=prompts)
    floors = FloorSet("m", "r", {"a": fl, "b": fl})
    res = {r.name: r for r in run_reference_detectors({"a": batch(far), "b": batch(near)}, floors)}
    lp = res["logprob-divergence"]
    assert lp.ran and lp.details["nearest_reference"] == "b"
    by = lp.details["by_reference"]
    assert by["a"]["p_value"] < 1e-6 and lp.p_value == by["b"]["p_value"] > 0.05
    alone = {r.name: r for r in run_reference_detectors({"a": batch(far)}, floors)}
    assert alone["logprob-divergence"].p_value < 1e-6


def test_stored_tokens_keep_the_alternatives_bytes() -> None:
    """Rows stored since revision 0002 carry the alternatives' bytes (hex); older rows (NULL) fall
    back to the UTF-8 of the alternative's string; an unknown alternative stays unknown."""
    from types import SimpleNamespace

    from auditor.store.queries import token_row_values

    rec = TokenRecord(index=0, token="\u00e9", bytes=b"\xc3", logprob=-0.1,
                      top_logprobs=[("\u00e9", b"\xc3", -0.1), ("bytes:\\xa9", b"\xa9", -2.5), ("?", None, -3.0)])
    row = SimpleNamespace(**token_row_values(rec, 0))
    assert row.top_logprobs_bytes == ["c3", "a9", None]
    (t,) = stored_tokens([row])
    assert t.bytes == b"\xc3" and t.logprob == -0.1
    assert t.top_logprobs == [("\u00e9", b"\xc3", -0.1), ("bytes:\\xa9", b"\xa9", -2.5), ("?", None, -3.0)]
    row.top_logprobs_bytes = None  # a row written before the column existed
    (old,) = stored_tokens([row])
    assert old.top_logprobs[1] == ("bytes:\\xa9", b"bytes:\\xa9", -2.5)


def test_streamed_step_ends_reach_the_batch(smollm2_tokenizer) -> None:
    """Observation.step_final (the answering attempt's chunks) becomes EvidenceBatch.step_final, per kept position."""
    tk = smollm2_tokenizer
    tokens = [TokenRecord(index=i, token=" a", bytes=b" a", logprob=None) for i in range(3)]
    al = align_to_reference(tokens, tk)
    kw = dict(probe_id=1, mode="greedy", workload="chat", temperature=0.0, top_p=1.0, request={}, prompt_ids=[1],
              tokens=tokens, ref_ids=al.ref_ids, spans=al.spans, one_to_one=al.ref_token_ids)
    streamed = Observation(probe_key="g#0", step_final=[False, False, True], **kw)
    plain = Observation(probe_key="g#1", **kw)
    batch, _ = build_evidence([streamed, plain], None, tk)
    assert batch.step_final is not None
    assert batch.step_final[:3].tolist() == [0.0, 0.0, 1.0] and np.isnan(batch.step_final[3:]).all()
    assert build_evidence([plain], None, tk)[0].step_final is None
