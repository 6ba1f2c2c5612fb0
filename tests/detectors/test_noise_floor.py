"""compute_noise_floor on arrays: band, honest rates, KL floors, serialisation."""

from __future__ import annotations

import numpy as np
import pytest

from auditor.detectors import NoiseFloor, compute_noise_floor
from auditor.detectors.noise_floor import MIN_MARGIN_BAND


def test_identical_variant_gives_minimal_floor(synth):
    rng = np.random.default_rng(0)
    ref = synth.dirichlet_logprobs(rng, 10, 20)
    fl = compute_noise_floor(
        ref, ref.copy(), prompt_ids=synth.prompt_labels(10, 20), top_m=(1, 5)
    )
    assert fl.margin_band == MIN_MARGIN_BAND
    assert fl.honest_flip_rate == 0.0 and fl.clear_mismatch_rate == 0.0
    assert fl.kl_floor(5).mean_kl == pytest.approx(0.0, abs=1e-9)
    assert fl.n_positions == 200 and fl.n_prompts == 10
    assert fl.available_m() == [1, 5]


def test_band_and_kl_grow_with_noise(synth):
    rng = np.random.default_rng(1)
    ref = synth.dirichlet_logprobs(rng, 20, 20)
    pid = synth.prompt_labels(20, 20)
    small = compute_noise_floor(
        ref, synth.normalise(ref + rng.normal(0, 0.01, ref.shape)), prompt_ids=pid
    )
    big = compute_noise_floor(
        ref, synth.normalise(ref + rng.normal(0, 0.1, ref.shape)), prompt_ids=pid
    )
    assert big.margin_band > 3 * small.margin_band
    assert big.kl_floor(20).mean_kl > 10 * small.kl_floor(20).mean_kl
    # |Δmargin| of N(0, s) noise on two logits is |N(0, s*sqrt2)|: 0.999 quantile ≈ 3.29 s sqrt2
    assert big.margin_delta_quantiles["0.999"] == pytest.approx(
        3.29 * 0.1 * np.sqrt(2), rel=0.25
    )


def test_several_variants_keep_the_most_lenient(synth):
    rng = np.random.default_rng(2)
    ref = synth.dirichlet_logprobs(rng, 10, 20)
    a = synth.normalise(ref + rng.normal(0, 0.01, ref.shape))
    b = synth.normalise(ref + rng.normal(0, 0.05, ref.shape))
    fl = compute_noise_floor(ref, [a, b], variant_names=["bf16", "noisy"], top_m=(5,))
    only_b = compute_noise_floor(ref, b, top_m=(5,))
    assert fl.kl_floor(5).variant == "noisy"
    assert fl.margin_band == pytest.approx(only_b.margin_band)


def test_json_roundtrip_and_choose_m(synth):
    rng = np.random.default_rng(3)
    ref = synth.dirichlet_logprobs(rng, 5, 10)
    fl = compute_noise_floor(
        ref,
        synth.normalise(ref + 0.01 * rng.normal(size=ref.shape)),
        model="m@rev",
        top_m=(1, 5, 20),
    )
    back = NoiseFloor.from_json(fl.to_json())
    assert back.to_dict() == fl.to_dict()
    assert (
        back.choose_m(7) == 5 and back.choose_m(20) == 20 and back.choose_m(0) is None
    )
    with pytest.raises(KeyError, match="computed for"):
        back.kl_floor(3)
    with pytest.raises(ValueError, match="margin_band"):
        NoiseFloor.from_dict(
            {"variants": [], "n_positions": 1, "n_prompts": 1, "kl": {}}
        )


@pytest.mark.parametrize(
    "ref, hon, kw, match",
    [
        (np.zeros((1, 4)), np.zeros((1, 4)), {}, "N>=2"),
        (np.zeros((3, 4)), np.zeros((3, 5)), {}, "shape"),
        (np.zeros((3, 4)), [], {}, "at least one"),
        (np.zeros((3, 4)), np.zeros((3, 4)), {"prompt_ids": ["a"]}, "prompt_ids"),
        (np.zeros((3, 4)), np.zeros((3, 4)), {"band_quantile": 0.2}, "band_quantile"),
    ],
)
def test_errors(ref, hon, kw, match):
    with pytest.raises(ValueError, match=match):
        compute_noise_floor(ref, hon, **kw)


def test_position_record_buckets_means_and_null_mean(synth):
    rng = np.random.default_rng(7)
    g, L = 12, 20
    ref = synth.dirichlet_logprobs(rng, g, L)
    pos = np.tile(np.arange(L), g)
    sig = np.where(pos < 4, 0.08, 0.02)[:, None]
    hon = synth.normalise(ref + rng.normal(size=ref.shape) * sig)
    fl = compute_noise_floor(ref, hon, prompt_ids=synth.prompt_labels(g, L), positions=pos, top_m=(5,))
    kf = fl.kl_floor(5)
    rec = kf.positions
    # [0,2) and [2,4) hold 24 positions each (< MIN_POSITION_BUCKET): merged into [0,4)
    assert rec["starts"] == [0, 4, 8, 16]
    assert np.asarray(rec["counts"]).shape == (g, 4) and np.asarray(rec["counts"]).sum() == g * L
    assert rec["means"][0] > rec["means"][1] + 1.0  # 4x the noise: y ~ log 16 higher
    vc = kf.components
    # an audit spread like the floor gets the floor's mean and variance back
    mu, var = kf.null_mean(pos)
    assert mu == pytest.approx(vc.mean) and var == pytest.approx(vc.var_of_mean(), rel=0.05)
    # early positions only: the first bucket's mean, estimated from 48 positions
    mu0, var0 = kf.null_mean(np.array([0, 1, 2, 3] * 5))
    assert mu0 == pytest.approx(rec["means"][0]) and var0 > vc.var_of_mean()
    # positions beyond the floor's continuations use the last, open bucket
    assert kf.null_mean(np.array([40, 90]))[0] == pytest.approx(rec["means"][-1])
    # one record survives JSON
    back = NoiseFloor.from_json(fl.to_json()).kl_floor(5)
    assert back.positions == rec and back.null_mean(pos) == pytest.approx((mu, var))


def test_floor_without_positions_ignores_position(synth):
    rng = np.random.default_rng(8)
    ref = synth.dirichlet_logprobs(rng, 6, 10)
    fl = compute_noise_floor(ref, synth.normalise(ref + rng.normal(0, 0.02, ref.shape)),
                             prompt_ids=synth.prompt_labels(6, 10), top_m=(5,))
    kf = fl.kl_floor(5)
    assert kf.positions == {}
    assert kf.null_mean(np.zeros(7, int)) == pytest.approx((kf.components.mean, kf.components.var_of_mean()))
    with pytest.raises(ValueError, match="positions"):
        compute_noise_floor(ref, ref, positions=np.arange(3))
