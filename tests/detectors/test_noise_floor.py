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
