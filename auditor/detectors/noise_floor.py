"""The honest noise floor: how far an *honest* deployment of the same model is from the reference.

Honest providers do not reproduce the reference bit for bit: bf16 instead of fp32, other kernels,
other reduction orders (vLLM documents batch non-invariance). The floor measures, on real
positions, the detectors' own statistics between the reference and such honest variants
(``compute_noise_floor(ref_rows, honest_rows)``) so that the tests compare a provider with that
measured spread instead of with an assumed zero. The pipeline computes it once per
(model revision, variant set) and caches the JSON (:meth:`NoiseFloor.to_json`).

What it records:
- ``margin_band`` (nats): the numeric-noise band for greedy decisions. Two tokens whose reference
  log-probabilities differ by less than the band may honestly swap places; a mismatch with a larger
  gap is "clear". Band = max(MIN_MARGIN_BAND, BAND_SAFETY × the ``band_quantile`` quantile of
  |Δ(logp1 − logp2)|), the change of the reference's top-1/top-2 gap under the honest variant.
- ``margin_gain_survival`` (the near-tie test's honest bound, ``near_tie.py``): per grid margin m
  (keys ``f"{m:.2f}"``, step :data:`GAIN_GRID_STEP` nats, up to the band), the conservative
  exceedance estimate (#{D > m} + 1) / (N + 1) of D, the largest gain of any competitor j within the
  band over the reference top-1 under the honest variant:
  D = max_j [(h_j − h_top1) − (r_j − r_top1)] (log-probs, j = the reference top-2 and every token
  whose reference gap r_top1 − r_j <= band). An honest variant can emit j instead of the top-1 only
  if that gain exceeds j's gap (>= the position's margin m), so P_honest(flip at margin m) <= P(D > m);
  the +1 is the exact exceedance of an exchangeable new draw beyond the sample's order statistics
  (never 0, 1 / (N + 1) beyond the largest D). Max over variants.
- ``clear_mismatch_rate``: the fraction of positions at which an honest variant's argmax differs
  from the reference's by more than the band (the honest rate the greedy tests test against).
- ``kl[M]``: for a provider listing its top-M alternatives, the per-position bucketed
  KL(reference || honest) (see ``stats.bucketed_kl``) — mean, sd, quantiles — and the
  variance components of y = log(KL + LOG_KL_EPS) grouped by prompt, which the
  logprob-divergence test uses as its null distribution. With several honest variants, each M
  keeps the variant with the largest mean y (the most lenient null), and the band the largest.
- ``kl[M].positions``: the mean of y per bucket of the position in the continuation
  (:data:`POSITION_BUCKET_STARTS`) and the floor's positions per prompt and bucket. y depends on the
  position: the first tokens after a chat template are the least determined, and their y is ~0.7
  nats above the rest on SmolLM2-135M (docs/detectors.md). The logprob test compares an audit's mean
  with the floor's mean *at the audit's own position mix* (:meth:`KLFloor.null_mean`); without
  that, a suite of 2-token requests put honest-bf16 at z = 3.4 (a false accusation).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .stats import VarianceComponents, bucketed_kl, variance_components

__all__ = [
    "BAND_SAFETY",
    "DEFAULT_MARGIN_BAND",
    "DEFAULT_TOP_M",
    "FLOOR_BLOCK_ROWS",
    "GAIN_GRID_STEP",
    "LOG_KL_EPS",
    "MIN_MARGIN_BAND",
    "MIN_POSITION_BUCKET",
    "POSITION_BUCKET_STARTS",
    "FloorAccumulator",
    "KLFloor",
    "NoiseFloor",
    "compute_noise_floor",
    "gain_grid_key",
]

#: y = log(KL + LOG_KL_EPS) (nats) is the per-position statistic of the logprob test.
LOG_KL_EPS = 1e-6
#: The greedy near-tie band never goes below this (nats), even when the variant is bit-identical.
MIN_MARGIN_BAND = 0.05
#: Near-tie band (nats) used when no noise floor has been computed for the model (conservative).
DEFAULT_MARGIN_BAND = 0.5
#: Multiplier on the measured |Δmargin| quantile (covers hardware we did not measure).
BAND_SAFETY = 1.5
#: Provider top_logprobs widths for which KL floors are computed.
DEFAULT_TOP_M = (1, 2, 3, 5, 10, 20)

_QUANTILES = (0.5, 0.9, 0.99, 0.999)
#: First positions (0-based index in the continuation) of the buckets whose mean y the floor
#: records; the last bucket is open (an audit's positions beyond the floor's longest continuation
#: use it: y is flat after the first tokens, docs/detectors.md).
POSITION_BUCKET_STARTS = (0, 2, 4, 8, 16)
#: A bucket with fewer floor positions than this is merged into its neighbour (its mean would be
#: too noisy to shift the null by).
MIN_POSITION_BUCKET = 32
#: Grid step (nats) of ``NoiseFloor.margin_gain_survival``.
GAIN_GRID_STEP = 0.01
#: Competitors of the reference top-1 whose gain the survival measures: its next K tokens.
GAIN_COMPETITORS = 63
#: Rows of ``[rows, V]`` reduced at once by :class:`FloorAccumulator` (its working memory is about
#: ``64 × rows × V`` bytes: 256 MiB at V = 262,144).
FLOOR_BLOCK_ROWS = 16


def gain_grid_key(m: float) -> str:
    """The ``margin_gain_survival`` key of grid margin m (nats): ``f"{m:.2f}"``."""
    return f"{m:.2f}"


@dataclass
class KLFloor:
    """Null distribution of the bucketed KL for providers listing M alternatives.

    Attributes:
        m: provider top_logprobs width simulated.
        variant: name of the honest variant kept (largest mean y).
        mean_kl, sd_kl: mean and sd of per-position KL (nats).
        quantiles: {"0.5": ..., "0.9": ..., ...} per-position KL quantiles (nats).
        mean_abs_dlogprob: mean |Δlogprob| of listed tokens (nats).
        log_kl: variance components of y = log(KL + LOG_KL_EPS) by prompt
            (keys mean, sigma_w2, sigma_b2, n, n_groups, sum_ng2).
        positions: y by position in the continuation: ``starts`` [K] int (bucket k holds
            positions starts[k] <= t < starts[k+1], the last one open), ``means`` [K] float (mean y
            of the bucket, log-nats) and ``counts`` [G][K] int (floor positions per prompt and
            bucket); {} in floors measured before it existed (the null then ignores position).
    """

    m: int
    variant: str
    mean_kl: float
    sd_kl: float
    quantiles: dict[str, float]
    mean_abs_dlogprob: float
    log_kl: dict[str, float]
    positions: dict[str, Any] = field(default_factory=dict)

    @property
    def components(self) -> VarianceComponents:
        return VarianceComponents.from_dict(self.log_kl)

    def null_mean(self, positions: np.ndarray) -> tuple[float, float]:
        """The honest mean of y at an audit's positions and the variance of that estimate.

        With w_k the audit's share of positions in bucket k, m_k the floor's bucket means and
        n_gk its positions per prompt g and bucket k (n_k = Σ_g n_gk), the null mean is Σ_k w_k m_k
        and, under the floor's one-way random-effects model (between-prompt sigma_b², within
        sigma_w²), its sampling variance is
            sigma_b² Σ_g (Σ_k w_k n_gk / n_k)² + sigma_w² Σ_k w_k² / n_k,
        which is ``components.var_of_mean()`` when there is one bucket.

        Args:
            positions: [n] int, 0-based position of each audit position in its continuation.

        Returns:
            (mean y, log-nats; variance of that mean). Without a position record: the floor's
            overall mean and ``components.var_of_mean()``.
        """
        vc = self.components
        rec = self.positions
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        if not rec or pos.size == 0:
            return vc.mean, vc.var_of_mean()
        starts = np.asarray(rec["starts"], dtype=np.int64)
        means = np.asarray(rec["means"], dtype=np.float64)
        counts = np.asarray(rec["counts"], dtype=np.float64).reshape(-1, starts.size)  # [G, K]
        nk = counts.sum(0)
        w = np.bincount(_bucket_of(starts, pos), minlength=starts.size) / pos.size
        a = counts @ (w / np.maximum(nk, 1.0))  # [G]
        var = vc.sigma_b2 * float((a**2).sum()) + vc.sigma_w2 * float((w**2 / np.maximum(nk, 1.0)).sum())
        return float(w @ means), var


@dataclass
class NoiseFloor:
    """Per-model honest-noise record; JSON-serialisable (:meth:`to_json` / :meth:`from_json`).

    Attributes:
        model: model name / revision it was measured on (free text, for the cache key and reports).
        variants: names of the honest variants compared with the reference (e.g. ["bf16", "noisy"]).
        n_positions, n_prompts: sample size behind it.
        margin_band: greedy near-tie band (nats).
        margin_delta_quantiles: quantiles of |Δ(logp1 − logp2)| (nats), max over variants.
        margin_gain_survival: grid margin (``gain_grid_key``, nats) → conservative P(D > m) of the
            largest competitor gain D (module docstring), max over variants; {} in floors measured
            before it existed (the near-tie test then uses the quantile step bound).
        honest_flip_rate: fraction of positions whose honest argmax differs from the reference's.
        clear_mismatch_rate: fraction whose honest argmax differs by a gap above the band.
        kl: {str(M): KLFloor}.
        eps: LOG_KL_EPS used.
        meta: free-form provenance (dtype names, suite, code version).
    """

    model: str | None
    variants: list[str]
    n_positions: int
    n_prompts: int
    margin_band: float
    margin_delta_quantiles: dict[str, float]
    honest_flip_rate: float
    clear_mismatch_rate: float
    kl: dict[str, KLFloor]
    eps: float = LOG_KL_EPS
    meta: dict[str, Any] = field(default_factory=dict)
    margin_gain_survival: dict[str, float] = field(default_factory=dict)

    # -------------------------------------------------------------- queries
    def available_m(self) -> list[int]:
        """Provider widths M with a KL floor, ascending."""
        return sorted(int(k) for k in self.kl)

    def choose_m(self, listed: int) -> int | None:
        """Largest floor width M <= ``listed`` (None when even the smallest is larger)."""
        ok = [m for m in self.available_m() if m <= listed]
        return max(ok) if ok else None

    def kl_floor(self, m: int) -> KLFloor:
        """The KL floor for width m.

        Raises:
            KeyError: if no floor was computed for that width (see :meth:`available_m`).
        """
        try:
            return self.kl[str(int(m))]
        except KeyError:
            raise KeyError(
                f"no KL floor for top_logprobs width {m}; computed for {self.available_m()}"
            ) from None

    # -------------------------------------------------------------- serialisation
    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field (``kl`` values as dicts); inverse: :meth:`from_dict`."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NoiseFloor:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: naming the missing field when the record is incomplete.
        """
        required = ("variants", "n_positions", "n_prompts", "margin_band", "kl")
        for k in required:
            if k not in d:
                raise ValueError(
                    f"noise floor record lacks field {k!r}; recompute it with compute_noise_floor"
                )
        kl = {
            str(k): (v if isinstance(v, KLFloor) else KLFloor(**v))
            for k, v in d["kl"].items()
        }
        return cls(
            model=d.get("model"),
            variants=list(d["variants"]),
            n_positions=int(d["n_positions"]),
            n_prompts=int(d["n_prompts"]),
            margin_band=float(d["margin_band"]),
            margin_delta_quantiles=dict(d.get("margin_delta_quantiles") or {}),
            honest_flip_rate=float(d.get("honest_flip_rate", 0.0)),
            clear_mismatch_rate=float(d.get("clear_mismatch_rate", 0.0)),
            kl=kl,
            eps=float(d.get("eps", LOG_KL_EPS)),
            meta=dict(d.get("meta") or {}),
            margin_gain_survival={str(k): float(v) for k, v in (d.get("margin_gain_survival") or {}).items()},
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> NoiseFloor:
        return cls.from_dict(json.loads(s))


def _log_softmax_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    mx = np.max(np.where(np.isfinite(x), x, -np.inf), axis=1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    return np.asarray(x - (mx + np.log(np.exp(x - mx).sum(1, keepdims=True))), dtype=np.float64)


def _top_m(lp: np.ndarray, m: int) -> np.ndarray:
    """[N, m] ids of the m largest entries per row, sorted descending."""
    m = min(m, lp.shape[1])
    idx = np.argpartition(-lp, m - 1, axis=1)[:, :m]
    vals = np.take_along_axis(lp, idx, 1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(idx, order, 1)


def compute_noise_floor(
    ref_rows: np.ndarray,
    honest_rows: np.ndarray | Sequence[np.ndarray],
    *,
    prompt_ids: Sequence[object] | np.ndarray | None = None,
    positions: Sequence[int] | np.ndarray | None = None,
    variant_names: Sequence[str] | None = None,
    top_m: Sequence[int] = DEFAULT_TOP_M,
    band_quantile: float = 0.999,
    band_safety: float = BAND_SAFETY,
    model: str | None = None,
    meta: Mapping[str, Any] | None = None,
    block_rows: int | None = None,
) -> NoiseFloor:
    """Measure the honest noise floor from teacher-forced reference rows and honest-variant rows.

    The rows are reduced :data:`FLOOR_BLOCK_ROWS` at a time by a :class:`FloorAccumulator` (the
    streaming form the pipeline uses when the rows do not fit in memory); the result does not
    depend on the block size.

    Args:
        ref_rows: [N, V] float logits or log-probs of the reference (e.g. fp32) at N positions.
        honest_rows: [N, V] (one variant) or a sequence of [N, V] arrays (several variants, e.g.
            bf16 and a noisy-kernel run) at the *same* positions. Rows are log-softmax-normalised
            here, so logits are fine.
        prompt_ids: [N] prompt label per position. Positions of one prompt are dependent; the
            floor's between-prompt variance is what keeps the logprob test calibrated, so pass it.
            When None every position counts as its own prompt (independence assumed).
        positions: [N] int, each row's 0-based position in its continuation; the KL floors then
            record y per position bucket (:meth:`KLFloor.null_mean`). None: no position record.
        variant_names: names of the variants (default "variant0", ...).
        top_m: provider top_logprobs widths M to compute KL floors for.
        band_quantile: quantile of |Δ(logp1 − logp2)| that defines the near-tie band.
        band_safety: multiplier on that quantile (see BAND_SAFETY).
        model, meta: provenance stored in the record.
        block_rows: rows reduced at once (default :data:`FLOOR_BLOCK_ROWS`).

    Returns:
        A :class:`NoiseFloor`.

    Raises:
        ValueError: on shape mismatches, non-finite rows, N < 2, or a bad quantile.
    """
    ref = np.asarray(ref_rows)
    if ref.ndim != 2 or ref.shape[0] < 2 or ref.shape[1] < 2:
        raise ValueError(
            f"ref_rows must be [N>=2, V>=2] logits or log-probs, got shape {ref.shape}"
        )
    variants = (
        [honest_rows]
        if isinstance(honest_rows, np.ndarray) and np.ndim(honest_rows) == 2
        else list(honest_rows)
    )
    if not variants:
        raise ValueError("honest_rows must hold at least one [N, V] variant")
    names = (
        list(variant_names)
        if variant_names is not None
        else [f"variant{i}" for i in range(len(variants))]
    )
    acc = FloorAccumulator(ref.shape[0], ref.shape[1], names, top_m=top_m, block_rows=block_rows)
    acc.add(0, ref, [np.asarray(h) for h in variants])
    return acc.finish(prompt_ids=prompt_ids, positions=positions, band_quantile=band_quantile,
                      band_safety=band_safety, model=model, meta=meta)


class FloorAccumulator:
    """The noise floor of N positions, fed ``[b, V]`` rows a block at a time (bounded memory).

    The floor's statistics need, per position, only a few numbers from the full-vocabulary rows;
    :meth:`add` reduces the rows to them, :data:`FLOOR_BLOCK_ROWS` rows at a time, and drops the
    rows. Kept per position (float64, the precision the statistics are computed in, so the result
    is bit-identical to reducing all rows at once):

    - shared: the reference's top-(K+1) log-probs (K = :data:`GAIN_COMPETITORS`), its top-1/top-2
      margin — ``8 × (K + 2)`` = 528 bytes;
    - per honest variant: |Δ margin|, the honest lift of the reference's top-(K+1) over its top-1,
      argmax flip and its reference gap, per width M the bucketed KL and mean |Δlogprob|, and the
      full-vocabulary KL(reference || variant) — ``8 × (K + 1) + 8 × 3 + 1 + 16 × len(top_m)`` = 633
      bytes with the default widths.

    That is 528 + 633 × variants bytes per position (+ 8 with ``full_kl``) (1.2 KB for one variant, the pipeline's case),
    whatever the vocabulary. Working memory of one :meth:`add` block: about eight
    ``[block_rows, V]`` float64/int64 arrays (log-softmax of both sides, ``argpartition`` indices,
    exponentials), i.e. ``64 × block_rows × V`` bytes — 256 MiB at V = 262,144 and 16 rows —, freed
    before the next block.

    Args:
        n_positions: N; vocab_size: V (>= 2); variant_names: the honest variants' names, in the
            order :meth:`add` receives their rows; top_m: provider widths M with a KL floor;
        block_rows: rows reduced at once (>= 1; default :data:`FLOOR_BLOCK_ROWS`);
        full_kl: also keep the full-vocabulary KL per position (:meth:`mean_full_kl`).

    Raises:
        ValueError: N < 2, V < 2, no variant, a bad block size.
    """

    def __init__(
        self,
        n_positions: int,
        vocab_size: int,
        variant_names: Sequence[str],
        *,
        top_m: Sequence[int] = DEFAULT_TOP_M,
        block_rows: int | None = None,
        full_kl: bool = False,
    ) -> None:
        n, v = int(n_positions), int(vocab_size)
        if n < 2 or v < 2:
            raise ValueError(
                f"ref_rows must be [N>=2, V>=2] logits or log-probs, got shape ({n}, {v})"
            )
        self.names = list(variant_names)
        if not self.names:
            raise ValueError("honest_rows must hold at least one [N, V] variant")
        self.block_rows = FLOOR_BLOCK_ROWS if block_rows is None else int(block_rows)
        if self.block_rows < 1:
            raise ValueError(f"block_rows={block_rows} must be >= 1")
        self.n, self.v = n, v
        self.widths = [int(m) for m in top_m if 1 <= int(m) <= v]
        k1 = min(GAIN_COMPETITORS + 1, v)
        self.ref_top_lp = np.zeros((n, k1))
        self.ref_margin = np.zeros(n)
        nv = len(self.names)
        self.delta = np.zeros((nv, n))
        self.lift = np.zeros((nv, n, k1))
        self.flip = np.zeros((nv, n), dtype=bool)
        self.gap = np.zeros((nv, n))
        self.full_kl = np.zeros((nv, n)) if full_kl else None
        self.kl = {m: np.zeros((nv, n)) for m in self.widths}
        self.mad = {m: np.zeros((nv, n)) for m in self.widths}
        self._filled = np.zeros(n, dtype=bool)

    def add(self, start: int, ref_rows: np.ndarray, honest_rows: Sequence[np.ndarray]) -> None:
        """Reduce positions ``start .. start + b - 1``.

        Args:
            start: index of the first row among the N positions.
            ref_rows: [b, V] float reference logits or log-probs.
            honest_rows: per variant (constructor order) [b, V] float rows at the same positions.

        Raises:
            ValueError: a shape mismatch, rows beyond N, a row without finite values.
        """
        ref = np.asarray(ref_rows)
        b = ref.shape[0] if ref.ndim == 2 else -1
        if ref.ndim != 2 or ref.shape[1] != self.v or not 0 <= start <= self.n - b:
            raise ValueError(
                f"ref_rows {ref.shape} at row {start} must be [b, V={self.v}] within N={self.n} positions"
            )
        if len(honest_rows) != len(self.names):
            raise ValueError(
                f"variant_names has {len(self.names)} names for {len(honest_rows)} variants"
            )
        for name, h in zip(self.names, honest_rows, strict=True):
            if np.shape(h) != ref.shape:
                raise ValueError(
                    f"honest variant {name!r} has shape {np.shape(h)}, reference {ref.shape}"
                )
        for s in range(0, b, self.block_rows):
            e = min(b, s + self.block_rows)
            self._add_block(start + s, ref[s:e], [np.asarray(h)[s:e] for h in honest_rows])

    def _add_block(self, start: int, ref: np.ndarray, honest: Sequence[np.ndarray]) -> None:
        sl = slice(start, start + ref.shape[0])
        ref_lp = _log_softmax_rows(ref)
        if not np.all(np.isfinite(ref_lp.max(1))):
            raise ValueError("ref_rows contains a row without finite values")
        k1 = self.ref_top_lp.shape[1]
        ref_top = _top_m(ref_lp, k1)  # [b, K+1] the top-1 and its competitors, descending
        rows = np.arange(ref.shape[0])
        ref_top_lp = ref_lp[rows[:, None], ref_top]
        top1, top2 = ref_top[:, 0], ref_top[:, 1]
        ref_margin = ref_lp[rows, top1] - ref_lp[rows, top2]
        self.ref_top_lp[sl] = ref_top_lp
        self.ref_margin[sl] = ref_margin
        raw = np.asarray(ref, dtype=np.float64) if self.full_kl is not None else None
        for i, (name, hv) in enumerate(zip(self.names, honest, strict=True)):
            h_lp = _log_softmax_rows(hv)
            if not np.all(np.isfinite(h_lp.max(1))):
                raise ValueError(
                    f"honest variant {name!r} contains a row without finite values"
                )
            h_margin = h_lp[rows, top1] - h_lp[rows, top2]
            self.delta[i, sl] = np.abs(
                np.nan_to_num(ref_margin - h_margin, nan=0.0, posinf=0.0, neginf=0.0)
            )
            self.lift[i, sl] = h_lp[rows[:, None], ref_top] - h_lp[rows, top1][:, None]
            h_arg = h_lp.argmax(1)
            self.flip[i, sl] = h_arg != top1
            self.gap[i, sl] = ref_lp[rows, top1] - ref_lp[rows, h_arg]
            if self.full_kl is not None and raw is not None:  # KL(reference || variant), rows as given
                self.full_kl[i, sl] = (np.exp(raw) * (raw - np.asarray(hv, dtype=np.float64))).sum(1)
            for m in self.widths:
                ids = _top_m(h_lp, m)
                kl, mad, _ = bucketed_kl(np.take_along_axis(ref_lp, ids, 1), np.take_along_axis(h_lp, ids, 1))
                self.kl[m][i, sl] = kl
                self.mad[m][i, sl] = mad
            del h_lp
        self._filled[sl] = True

    def mean_full_kl(self, variant: str) -> float:
        """Mean over the N positions of the full-vocabulary KL(reference || ``variant``) in nats,
        with both rows taken as log-probs as given (the pipeline passes log-softmax rows).

        Raises:
            ValueError: the accumulator was built without ``full_kl=True``.
        """
        if self.full_kl is None:
            raise ValueError("build the FloorAccumulator with full_kl=True to read mean_full_kl")
        return float(self.full_kl[self.names.index(variant)].mean())

    def finish(
        self,
        *,
        prompt_ids: Sequence[object] | np.ndarray | None = None,
        positions: Sequence[int] | np.ndarray | None = None,
        band_quantile: float = 0.999,
        band_safety: float = BAND_SAFETY,
        model: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> NoiseFloor:
        """The :class:`NoiseFloor` of the N positions (arguments as in :func:`compute_noise_floor`).

        Raises:
            ValueError: a row was never added, bad prompt_ids/positions/quantile.
        """
        if not 0.5 < band_quantile <= 1.0:
            raise ValueError(f"band_quantile must be in (0.5, 1], got {band_quantile}")
        if not self._filled.all():
            raise ValueError(f"rows {np.flatnonzero(~self._filled)[:5].tolist()}... were never added")
        n = self.n
        groups = (
            np.arange(n)
            if prompt_ids is None
            else np.asarray([str(p) for p in np.asarray(prompt_ids, object).reshape(-1)])
        )
        if groups.size != n:
            raise ValueError(f"prompt_ids has {groups.size} entries, ref_rows {n} rows")
        pos = None if positions is None else np.asarray(positions, dtype=np.int64).reshape(-1)
        if pos is not None and (pos.size != n or (pos < 0).any()):
            raise ValueError(f"positions must be {n} non-negative ints (one per row), got {pos.size}")
        layout = None if pos is None else _PositionLayout.of(groups, pos)
        band_raw = 0.0
        dq: dict[str, float] = {}
        kl_by_m: dict[str, KLFloor] = {}
        for i, name in enumerate(self.names):
            qs = np.quantile(self.delta[i], (band_quantile,) + _QUANTILES)
            band_raw = max(band_raw, float(qs[0]))
            for q, val in zip(_QUANTILES, qs[1:], strict=True):
                dq[str(q)] = max(dq.get(str(q), 0.0), float(val))
            for m in self.widths:
                kl, mad = self.kl[m][i], self.mad[m][i]
                y = np.log(kl + LOG_KL_EPS)
                vc = variance_components(y, groups)
                rec = KLFloor(
                    m=m,
                    variant=name,
                    mean_kl=float(kl.mean()),
                    sd_kl=float(kl.std(ddof=1)),
                    quantiles={
                        str(q): float(val)
                        for q, val in zip(_QUANTILES, np.quantile(kl, _QUANTILES), strict=True)
                    },
                    mean_abs_dlogprob=float(np.nanmean(mad))
                    if np.any(~np.isnan(mad))
                    else 0.0,
                    log_kl=vc.to_dict(),
                    positions={} if layout is None else layout.record(y),
                )
                prev = kl_by_m.get(str(m))
                if prev is None or rec.log_kl["mean"] > prev.log_kl["mean"]:
                    kl_by_m[str(m)] = rec
        band = max(MIN_MARGIN_BAND, band_safety * band_raw)
        gain_survival = _gain_survival(list(self.lift), self.ref_top_lp, band)
        flip_rate = max(float(f.mean()) for f in self.flip)
        clear_rate = max(float((f & (g > band)).mean()) for f, g in zip(self.flip, self.gap, strict=True))
        return NoiseFloor(
            model=model,
            variants=list(self.names),
            n_positions=int(n),
            n_prompts=int(np.unique(groups).size),
            margin_band=float(band),
            margin_delta_quantiles=dq,
            honest_flip_rate=flip_rate,
            clear_mismatch_rate=clear_rate,
            kl=kl_by_m,
            eps=LOG_KL_EPS,
            meta=dict(meta or {}),
            margin_gain_survival=gain_survival,
        )


def _bucket_of(starts: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """[n] bucket index of each position (bucket k: starts[k] <= t < starts[k+1], the last one open)."""
    return np.clip(np.searchsorted(starts, pos, side="right") - 1, 0, starts.size - 1)


@dataclass(frozen=True)
class _PositionLayout:
    """The floor's position buckets (after merging small ones), each row's bucket [N] and the
    positions per prompt and bucket [G, K]; shared by every width and variant of one floor."""

    starts: np.ndarray
    bucket: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, groups: np.ndarray, pos: np.ndarray) -> _PositionLayout:
        """Buckets of :data:`POSITION_BUCKET_STARTS`; one with fewer than :data:`MIN_POSITION_BUCKET`
        positions is merged into the one before it (the first into the second), so none is empty."""
        starts = list(POSITION_BUCKET_STARTS)
        while len(starts) > 1:
            cnt = np.bincount(_bucket_of(np.asarray(starts), pos), minlength=len(starts))
            small = [k for k in range(len(starts)) if cnt[k] < MIN_POSITION_BUCKET]
            if not small:
                break
            starts.pop(max(small[0], 1))
        st = np.asarray(starts, dtype=np.int64)
        b = _bucket_of(st, pos)
        _, g = np.unique(groups, return_inverse=True)
        counts = np.zeros((int(g.max()) + 1 if g.size else 0, st.size), np.int64)
        np.add.at(counts, (g, b), 1)
        return cls(st, b, counts)

    def record(self, y: np.ndarray) -> dict[str, Any]:
        """``KLFloor.positions`` for per-position y [N]."""
        means = np.bincount(self.bucket, weights=y, minlength=self.starts.size) / self.counts.sum(0)
        return {"starts": self.starts.tolist(), "means": [float(v) for v in means], "counts": self.counts.tolist()}


def _gain_survival(lifts: Sequence[np.ndarray], ref_top_lp: np.ndarray, band: float) -> dict[str, float]:
    """``margin_gain_survival`` (module docstring).

    Args:
        lifts: per variant [N, K+1] honest log-probs of the reference's top-(K+1) tokens minus the
            honest log-prob of the reference top-1 (column 0 is 0).
        ref_top_lp: [N, K+1] the reference's own top-(K+1) log-probs, descending.
        band: the near-tie band (nats).

    Competitors per position: the reference top-2 and every other of its top-(K+1) with reference
    gap <= band (beyond K tokens inside the band the gain of the rest is not measured; K = 63).
    Grid 0, GAIN_GRID_STEP, ... up to the band, max over variants.
    """
    n = ref_top_lp.shape[0]
    gap = ref_top_lp[:, :1] - ref_top_lp  # [N, K+1] >= 0
    comp = gap <= band
    comp[:, 0] = False
    comp[:, 1] = True
    grid = np.arange(0.0, band + GAIN_GRID_STEP, GAIN_GRID_STEP)
    out = np.zeros(grid.size)
    for lift in lifts:
        gain = np.nan_to_num(lift + gap, nan=-np.inf)  # (h_j − h_1) − (r_j − r_1)
        d = np.where(comp, gain, -np.inf).max(1)
        exceed = (d[None, :] > grid[:, None]).sum(1)
        out = np.maximum(out, (exceed + 1) / (n + 1))
    return {gain_grid_key(float(m)): float(s) for m, s in zip(grid, out, strict=True)}
