"""Reference stage of ``auditor check``: the audit's reference, set up before any probe is sent.

- :func:`check_device` and :func:`check_reference_api` refuse, before probing, a device that is not
  there and a chat audit against a base model (no chat template).
- :func:`resolve_reference` builds a :class:`ReferenceSetup` from a provider's ``reference``: local
  weights (:func:`get_reference_models`, loaded once per process in ``_MODELS``), a trusted vLLM
  server, or none (reference-free tests only). Its scorers are used by the scoring stage
  (:mod:`auditor.check.reference_scoring`); ``ReferenceSetup.close`` is the teardown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from auditor.check.errors import AuditError

if TYPE_CHECKING:  # pragma: no cover
    from auditor.check.reference_scoring import Scorer
    from probes.config import ProviderConfig, ReferenceConfig
    from probes.model_card import ModelCard
    from reference.models import LoadedModel

__all__ = [
    "NOT_TESTED_WITHOUT_REFERENCE",
    "ReferenceSetup",
    "apply_card",
    "card_fields",
    "card_models",
    "card_steps",
    "check_card",
    "check_device",
    "check_reference_api",
    "get_reference_models",
    "resolve_reference",
]


# ------------------------------------------------------------------------------------------ models
#: (reference name, dtype) for CPU models, (reference name, dtype, device) otherwise → the loaded model.
_MODELS: dict[tuple[str, ...], LoadedModel] = {}
_MODELS_LOCK = threading.Lock()


def get_reference_models(
    name: str, dtypes: Sequence[str] | None = None, *, config_path: str | None = None, device: str | None = None,
) -> dict[str, LoadedModel]:
    """The reference model in every honest precision (``auditor.check.measured_floors.REFERENCE_DTYPES``), loaded
    once per process (the scheduler and ``auditor demo`` audit several providers).

    ``name`` is a provider's ``reference``: the NAME of a ``[references.NAME]`` table of the
    providers file (``probes.config.ReferenceConfig``: model, device, dtype, device_map,
    max_memory) or a plain model name (bundled, directory, .gguf, hub id; loaded on ``device``,
    default CPU). A table with a non-float32 ``dtype`` (e.g. a 70B model in bfloat16) is loaded in
    that precision only, unless ``dtypes`` is given.

    Raises:
        AuditError: the model cannot be found or loaded, an invalid reference table, CUDA asked
            without a GPU, or a ``vllm``/``none`` reference (the check's noise floor still needs
            local weights; those kinds are served by ``reference.backends``) — message names the fix.
    """
    from auditor.check.measured_floors import REFERENCE_DTYPES
    from probes.config import ConfigError
    from probes.providers_file import load_references

    try:
        tables = load_references(config_path)
    except ConfigError as exc:
        raise AuditError(str(exc), parameter="config_path") from None
    rc = tables.get(name)
    if name == "none" or (rc is not None and rc.kind != "local"):
        kind = "none" if rc is None else rc.kind
        raise AuditError(
            f"reference {name!r} has kind {kind!r}: `auditor check` still computes its noise floor from local "
            "weights, so it needs a kind = 'local' reference (reference.backends serves vllm/none for teacher "
            "forcing). Fix: point the provider's reference at a local model or a [references.NAME] table with "
            "kind = 'local'.", parameter="reference")
    model = rc.model if rc is not None and rc.model else name
    dev = device or (rc.device if rc is not None else "cpu")
    if dev == "auto":
        from reference.models import resolve_device

        dev = str(resolve_device(dev))  # auto on a machine without a GPU shares the CPU models
    if dev == "cuda":
        dev = "cuda:0"
    if dtypes is None and rc is not None and rc.dtype != "float32":
        dtypes = [rc.dtype]
    out = {}
    for dt in dtypes or REFERENCE_DTYPES:
        key: tuple[str, ...] = (name, dt) if dev == "cpu" else (name, dt, dev)
        with _MODELS_LOCK:
            lm = _MODELS.get(key)
            if lm is None:
                try:
                    from reference.models import ModelNotAvailableError, load_model, one_line
                except ImportError as exc:  # pragma: no cover - install problem
                    raise AuditError(f"the reference engine is not installed ({exc}). Fix: pip install -e .") from None
                try:
                    lm = load_model(str(model), dtype=dt, device=dev,
                                    device_map=rc.device_map if rc is not None else None,
                                    max_memory=(dict(rc.max_memory) or None) if rc is not None else None)
                except (ModelNotAvailableError, ValueError, OSError) as exc:
                    table = f"table [references.{name}], model {str(model)!r}, " if rc is not None else ""
                    raise AuditError(f"reference model {name!r} ({table}{dt}) cannot be loaded: {one_line(exc)}",
                                     parameter="reference") from None
                _MODELS[key] = lm
        out[dt] = lm
    return out


def check_reference_api(name: str, api: str, config_path: str | None = None) -> None:
    """Refuse, before any probe is sent, a chat audit against a base reference model (no chat template).

    Loads only the reference tokenizer (``name`` resolved as in :func:`get_reference_models`).

    Raises:
        AuditError: ``api == "chat"`` and the reference has no chat template (exit code 3; the
            message names the completions fix), or an invalid providers file.
    """
    if api != "chat" or name == "none":
        return
    from probes.config import ConfigError
    from probes.providers_file import get_reference
    from reference.backends import ReferenceError, load_tokenizer
    from reference.models import check_api_supported

    loaded = next((lm for key, lm in list(_MODELS.items()) if key[0] == name), None)
    if loaded is not None:
        tok = loaded.tokenizer
    else:
        try:
            rc = get_reference(name, config_path)
            tok = load_tokenizer(str(rc.tokenizer or rc.model or name))
        except ConfigError as exc:
            raise AuditError(str(exc), parameter="config_path") from None
        except ReferenceError:
            return  # loading the model itself reports the problem, with its fix
    try:
        check_api_supported(tok, api)
    except ValueError as exc:
        raise AuditError(str(exc), parameter="api") from None


# ------------------------------------------------------------------------------------------ setup
#: Causes that only a reference can test (``reference = "none"`` leaves them untested).
NOT_TESTED_WITHOUT_REFERENCE = ("QUANTIZATION", "SUBSTITUTION")


def check_device(device: str | None, dtype: str | None = None) -> None:
    """Validate ``--device`` / ``--dtype`` before any probe is sent.

    ``device``: ``auto`` (CUDA when ``torch.cuda.is_available()``), ``cpu``, ``cuda``, ``cuda:N``;
    ``dtype``: ``float32`` | ``bfloat16`` | ``float16`` (``reference.models.parse_dtype``).

    Raises:
        AuditError: an unknown device, CUDA asked without a visible GPU or ``cuda:N`` beyond the
            visible GPUs (``parameter="device"``), an unknown dtype (``parameter="dtype"``); exit code 3.
    """
    from reference.models import parse_dtype, resolve_device

    if device is not None:
        try:
            resolve_device(device)
        except ValueError as exc:
            raise AuditError(str(exc), parameter="device") from None
    if dtype is not None:
        try:
            parse_dtype(dtype)
        except (ValueError, KeyError, TypeError) as exc:
            raise AuditError(str(exc), parameter="dtype") from None


@dataclass
class ReferenceSetup:
    """The reference of one audit, whatever its kind.

    Attributes:
        kind: ``local`` | ``vllm`` | ``none``.
        tokenizer: the reference tokenizer (for ``none``: the claimed model's, used only to align
            the provider's tokens for the self tests).
        scorers: reference precision → :class:`Scorer` (empty for ``none``).
        lms: dtype → LoadedModel for the noise floor (empty when no local weights: ``vllm``, ``none``).
        revision: pins the reference ("none" without one); dtype_label: e.g. ``float32+bfloat16``.
        not_tested: causes the audit cannot test with this reference (``NOT_TESTED_WITHOUT_REFERENCE``).
        notes: plain-language remarks for the report.
        backend: a ``reference.backends.ReferenceBackend`` to close afterwards, or None.
        tokenizer_is_claimed: False when ``tokenizer`` is a stand-in (``none`` without the claimed
            model's tokenizer): tokenizer evidence (cross-family substitution) is then not collected.
        card_info: what the audit's precision classes are relative to, :func:`card_fields` of the provider's
            model card (checked against the loaded weights, :func:`check_card`) and the final revision, set once
            in the reference stage by :func:`apply_card`; all None without a card. The verdict's rules-out list
            reads it.
    """

    kind: str
    tokenizer: object
    scorers: dict[str, Scorer]
    lms: dict[str, LoadedModel]
    revision: str
    dtype_label: str
    not_tested: tuple[str, ...] = ()
    notes: list[str] | None = None
    backend: object | None = None
    tokenizer_is_claimed: bool = True
    card_info: dict[str, Any] = dataclasses.field(default_factory=lambda: card_fields(None, None))

    def close(self) -> None:
        """Close the backend's HTTP client (vllm); no-op otherwise."""
        close = getattr(self.backend, "close", None)
        if callable(close):
            close()


def _checkpoint_qc(lm: LoadedModel) -> Mapping[str, object] | None:
    """The checkpoint's own ``quantization_config``: its ``config.json``'s, else the loaded model config's, else None."""
    import json
    from pathlib import Path

    qc = getattr(getattr(lm.model, "config", None), "quantization_config", None)
    cfg = Path(str(lm.path)) / "config.json"
    if cfg.is_file():
        with contextlib.suppress(OSError, ValueError):
            qc = json.loads(cfg.read_text(encoding="utf-8")).get("quantization_config", qc)
    if qc is not None and not isinstance(qc, Mapping):
        qc = qc.to_dict() if hasattr(qc, "to_dict") else None
    return qc


def check_card(config: ProviderConfig | ModelCard | None, ref: ReferenceSetup, *,
               provider: str | None = None) -> ModelCard | None:
    """Refuse a model card the loaded local reference contradicts (issue 36, item 1): a block or group
    size that does not divide its weight shapes, or a recipe its ``config.json``'s own
    ``quantization_config`` contradicts (:func:`probes.model_card.check_shapes`,
    :func:`probes.model_card.check_quantization_config`). No check without a card or local weights.

    Args:
        config: the provider (its card: :func:`probes.config.provider_card`) or the card itself.
        ref: the audit's reference; provider: the name in messages (default the config's).

    Returns:
        The card (None: no card), for :func:`apply_card`.

    Raises:
        AuditError: ``parameter="card"`` (exit 3), naming ``providers.NAME.card...`` and the fix (also for a
            card name no loaded file defines).
    """
    from probes.config import ConfigError, provider_card
    from probes.model_card import CardError, ModelCard, check_quantization_config, check_shapes

    if isinstance(config, ModelCard) or config is None:
        card = config
    else:
        provider = provider or config.name
        try:
            card = provider_card(config)
        except ConfigError as exc:
            raise AuditError(str(exc), parameter="card") from None
    if card is None or not ref.lms:
        return card

    lm = next(iter(ref.lms.values()))
    where = f"providers.{provider}.card ({card.name})"
    try:
        check_quantization_config(card, _checkpoint_qc(lm), where=where)
        check_shapes(card, {n: tuple(p.shape) for n, p in lm.model.named_parameters()}, where=where)
    except CardError as exc:
        raise AuditError(str(exc), parameter="card") from None
    return card


def _off_grid(model: object, card: ModelCard) -> list[str]:
    """Decoder projection weights of ``model`` that are not on the card's weight grid (applying the format
    would change them); ``[]`` for float formats, ``mxfp4`` (taken as loaded) and an on-grid checkpoint."""
    import torch

    from reference.native import fp8_block_fake_quant, int4_group_fake_quant, iter_decoder_linears

    w = card.weights
    if w.format == "fp8-block" and w.block_size is not None:
        def fn(x: torch.Tensor) -> torch.Tensor:
            return fp8_block_fake_quant(x, w.block_size or (128, 128))
    elif w.format == "int4" and w.group is not None:
        def fn(x: torch.Tensor) -> torch.Tensor:
            return int4_group_fake_quant(x, w.group or 32)
    else:
        return []
    with torch.no_grad():
        return [n for n, m in iter_decoder_linears(model)
                if not torch.equal(fn(m.weight.data).to(m.weight.dtype), m.weight.data)]


def card_fields(card: ModelCard | None, revision: str | None) -> dict[str, Any]:
    """What the precision classes of an audit are relative to (issue 36): ``card_precision`` (the card's weight
    label), ``card_recipe`` (``ModelCard.recipe``) and ``card_bits`` (bits per component,
    ``ModelCard.component_bits``; a KV cache ``auto`` read as FP8 where the reference computed one: its revision's
    ``+card:`` steps name ``kv-fp8``, :func:`card_steps`); all None without a card. The report states them
    (``auditor.report.render``) and the verdict's rules-out list is relative to them (``auditor.check.pipeline``)."""
    if card is None:
        return {"card_precision": None, "card_recipe": None, "card_bits": None}
    steps = (revision or "").partition("+card:")[2].split(",")
    kv = "fp8" if card.kv_cache == "auto" and "kv-fp8" in steps else None
    return {"card_precision": card.precision_label, "card_recipe": card.recipe(), "card_bits": card.component_bits(kv)}


def card_steps(card: ModelCard | None, lm: LoadedModel, qc: Mapping[str, object] | None = None) -> tuple[str, ...]:
    """What the reference must do beyond computing the loaded weights in its dtype to compute ``card``.

    Steps, in order: ``weights-fp8-block-RxC`` / ``weights-int4-gG`` (the loaded weights are not on the
    card's grid: they are moved onto it, :func:`reference.native.make_native_weights` — the exact
    dequantization of a native checkpoint is on its grid already and needs nothing), ``act-fp8-1xT``
    (the card's FP8 activation tiles on the decoder linears' inputs), ``kv-fp8`` (the card's KV cache,
    ``auto`` resolved against the checkpoint's ``quantization_config``, is FP8).

    Returns:
        () for no card and for float cards with a float KV cache: the plain reference computes them.

    Raises:
        AuditError: ``parameter="card"``: an activation tile with more than one row (only per-token
            tiles, [1, T], are computed).
    """
    from probes.model_card import resolve_kv_cache

    if card is None:
        return ()
    steps: list[str] = []
    w = card.weights
    if w.dequantized_from is None and _off_grid(lm.model, card):
        steps.append(f"weights-fp8-block-{w.block_size[0]}x{w.block_size[1]}" if w.format == "fp8-block" and w.block_size
                     else f"weights-int4-g{w.group}")
    a = card.activations
    if a.format == "fp8" and a.tile is not None:
        if a.tile[0] != 1:
            raise AuditError(f"cards.{card.name}.activations.tile: {list(a.tile)} has {a.tile[0]} rows; the reference "
                             "computes per-token tiles only. Fix: use [1, T] (DeepSeek-V3: [1, 128]).", parameter="card")
        steps.append(f"act-fp8-1x{a.tile[1]}")
    if resolve_kv_cache(card, qc, compute_dtype="fp32") == "fp8":
        steps.append("kv-fp8")
    return tuple(steps)


def apply_card(ref: ReferenceSetup, card: ModelCard | None) -> ReferenceSetup:
    """The reference computing the card (issue 36, item 2).

    For a card whose native serving path computes beyond the loaded weights in their dtype
    (:func:`card_steps`: FP8 activation tiles, an FP8 KV cache, weights to move onto the card's grid),
    every local reference model is replaced by a copy that computes the card: the native weights
    dequantized exactly (on the card's grid), FP8 e4m3 activations per 1 x T tile on the decoder
    linears' inputs (``reference.native.install_act_fp8_tiles``, DeepSeek-V3 §3.3), an FP8 KV cache with
    static per-layer scales (``reference.native.install_kv_fp8``). Its revision becomes
    ``REVISION+card:STEP,STEP`` so that the reference cache and the noise floor (``auditor.check.measured_floors``, keyed
    by revision) are the card's: the floor's honest variants (``HONEST_BY_REFERENCE``) are then served
    *from the card-computing model* — the card in float32 decoded speculatively (FP8 rounding flips from
    another reduction order), with kernel noise on the logits, and in bfloat16 around the FP8 GEMMs — so
    that honest native serving sits inside the floor. Loaded copies are kept per process (``_MODELS``).

    Float cards (bf16, fp16, fp32) with a float KV cache, weight-only native formats whose checkpoint is on
    its grid (``+int4``), no card, and references without local weights (vLLM, none) return ``ref``
    unchanged but for ``card_info`` (and a note for a local card); float32 stays the default.

    Raises:
        AuditError: ``parameter="card"``: the card cannot be computed on this model (a tile that does not
            divide a linear's input, a multi-row tile, a model without Llama-style attention for FP8 KV).
    """
    from auditor.check.reference_scoring import local_scorers

    if card is None:
        return ref
    if ref.kind != "local" or not ref.lms:
        return dataclasses.replace(ref, card_info=card_fields(card, ref.revision))
    lms, steps = card_models(ref.lms, card)
    notes = list(ref.notes or [])
    if not steps:
        notes.append(f"reference computes {card.describe()}: the loaded weights in {ref.dtype_label} are the card's "
                     "computation (no activation or KV quantization; weights on the card's grid)")
        return dataclasses.replace(ref, notes=notes, card_info=card_fields(card, ref.revision))
    notes.append(f"reference computes {card.describe()} ({', '.join(steps)}); noise floor measured over the card's "
                 "honest variants: the card in float32 served speculatively, with kernel noise on the logits, and in "
                 "bfloat16 around its low-precision GEMMs")
    new_first = next(iter(lms.values()))
    return dataclasses.replace(ref, scorers=dict(local_scorers(lms)), lms=lms, revision=str(new_first.revision),
                               notes=notes, card_info=card_fields(card, str(new_first.revision)))


def card_models(lms: Mapping[str, LoadedModel], card: ModelCard, qc: Mapping[str, object] | None = None,
                ) -> tuple[dict[str, LoadedModel], tuple[str, ...]]:
    """The reference models computing ``card`` (:func:`apply_card`; the calibration's card references,
    ``auditor.calibration.benchmark.load_reference_models``): dtype → a copy of each loaded model computing the
    card's steps (:func:`card_steps` of the first model), made once per process for models loaded through
    :func:`get_reference_models`, and the steps. ``lms`` itself and ``()`` when the card needs no step.

    Args:
        lms: dtype → the loaded reference (the card's checkpoint); card: the card; qc: the checkpoint's own
            ``quantization_config`` (default: read from the first model, as :func:`check_card` does).

    Raises:
        AuditError: ``parameter="card"``: the card cannot be computed on this model (:func:`card_steps`).
    """
    first = next(iter(lms.values()))
    steps = card_steps(card, first, qc if qc is not None else _checkpoint_qc(first))
    if not steps:
        return dict(lms), ()
    out: dict[str, LoadedModel] = {}
    for dt, lm in lms.items():
        with _MODELS_LOCK:  # a copy per loaded model and card computation, made once per process
            own = next((k for k, v in _MODELS.items() if v is lm), None)
            key = None if own is None else (*own, "card:" + ",".join(steps))
            got = _MODELS.get(key) if key is not None else None
            if got is None:
                got = _card_model(lm, card, steps)
                if key is not None:
                    _MODELS[key] = got
        out[dt] = got
    return out, steps


def _card_model(lm: LoadedModel, card: ModelCard, steps: Sequence[str]) -> LoadedModel:
    """A deep copy of ``lm`` computing ``card`` (:func:`apply_card`); raises AuditError ``parameter="card"``."""
    import copy

    from reference.models import LoadedModel
    from reference.native import KV_CALIBRATION_TEXT, install_act_fp8_tiles, install_kv_fp8, make_native_weights

    model = copy.deepcopy(lm.model)
    w = card.weights
    try:
        for step in steps:
            if step.startswith("weights-"):
                dt = next(model.parameters()).dtype
                model.float()
                make_native_weights(model, w.format, block=w.block_size or (128, 128), group=w.group or 32)
                model.to(dt)
            elif step.startswith("act-fp8-1x"):
                install_act_fp8_tiles(model, int(step.removeprefix("act-fp8-1x")))
            elif step == "kv-fp8":
                install_kv_fp8(model, list(lm.tokenizer.encode(KV_CALIBRATION_TEXT)))
    except ValueError as exc:
        raise AuditError(f"providers card {card.name!r} cannot be computed on the reference {lm.name!r}: {exc}. Fix: "
                         "use a card whose block / tile sizes divide this model's linear layers.",
                         parameter="card") from None
    model.eval()
    return LoadedModel(model=model, tokenizer=lm.tokenizer, name=lm.name, path=lm.path,
                       revision=f"{lm.revision}+card:{','.join(steps)}", dtype=lm.dtype, device=lm.device)


def _is_local_or_hub(m: str) -> bool:
    """True for a bundled name, an existing path or cache dir, or an explicit ``org/name`` hub id."""
    from pathlib import Path

    from reference.models import BUNDLED, model_cache_dir

    return m in BUNDLED or "/" in m or Path(m).expanduser().exists() or (model_cache_dir() / m).is_dir()


def _check_known(name: str, model: str | None, config_path: str | None) -> None:
    """Refuse a reference name that is no table, no loaded/bundled model, no local path and no
    ``org/name`` hub id (so a typo is reported at once, not after hub retries).

    Raises:
        AuditError: ``parameter="reference"``, the message lists what the name could have been.
    """
    from probes.config import ConfigError
    from probes.providers_file import load_references
    from reference.models import BUNDLED

    m = str(model or name)
    if any(k[0] == name for k in list(_MODELS)) or _is_local_or_hub(m):
        return
    try:
        tables = sorted(load_references(config_path))
    except ConfigError:  # reported by get_reference already
        tables = []
    raise AuditError(
        f"unknown reference {name!r}: not a [references.{name}] table"
        + (f" (tables: {', '.join(tables)})" if tables else "")
        + f", not a bundled model ({', '.join(BUNDLED)}), not a local directory or .gguf file, not an org/name hub "
        f"id. Fix: set the provider's reference to one of those, or to \"none\" for the reference-free tests only.",
        parameter="reference")


def resolve_reference(
    name: str,
    *,
    claimed_model: str | None = None,
    config_path: str | None = None,
    dtypes: Sequence[str] | None = None,
    device: str | None = None,
    models: Mapping[str, LoadedModel] | None = None,
) -> ReferenceSetup:
    """Build the audit's reference from a provider's ``reference`` (a ``[references.NAME]`` table, ``"none"``
    or a plain model name).

    - ``local``: :func:`get_reference_models` (``device``/``dtypes`` override the table).
    - ``vllm``: ``reference.backends.make_backend`` (checks the endpoint answers ``prompt_logprobs``);
      teacher forcing through vLLM's ``prompt_logprobs``. The noise floor comes from local float32
      weights of the same model when the table's ``tokenizer``/``model`` names a bundled model or a
      directory with weights (:func:`_vllm_floor_weights`); else no noise floor (the
      logprob-divergence test reports "no noise floor"; greedy-match uses its default band).
    - ``none``: no scorer; the tokenizer of the table's ``tokenizer``/``model`` or else of
      ``claimed_model`` (the provider's ``model``), else the bundled default, aligns the provider's
      tokens for the reference-free tests.

    Raises:
        AuditError: unknown/invalid reference table, a model or tokenizer that cannot be loaded,
            CUDA without a GPU, a vLLM endpoint that does not answer or lacks ``prompt_logprobs``
            (exit code 3, ``parameter="reference"`` or ``"device"``).
    """
    from auditor.check.reference_scoring import local_scorers
    from probes.config import ConfigError
    from probes.providers_file import get_reference
    from reference.backends import ReferenceError

    if models:
        lms = dict(models)
        first = next(iter(lms.values()))
        return ReferenceSetup("local", first.tokenizer, dict(local_scorers(lms)), lms, str(first.revision), "+".join(lms))
    try:
        rc = get_reference(name, config_path)
    except ConfigError as exc:
        raise AuditError(str(exc), parameter="reference") from None
    if rc.kind == "local":
        _check_known(name, rc.model, config_path)
        lms = get_reference_models(name, dtypes, config_path=config_path, device=device)
        first = next(iter(lms.values()))
        return ReferenceSetup("local", first.tokenizer, dict(local_scorers(lms)), lms, str(first.revision), "+".join(lms))
    from reference.backends import load_tokenizer, make_backend

    if rc.kind == "vllm":
        try:
            be = make_backend(rc, check=True)
        except ReferenceError as exc:
            raise AuditError(f"reference {name!r} (kind vllm): {exc}", parameter="reference") from None
        scorer: Scorer = be  # VLLMBackend has revision, dtype and score
        floor_lms, floor_src = _vllm_floor_weights(rc, device)
        if floor_lms:
            # scorer keyed by the floor's precision so that the detectors find its floor; the cache key
            # and the report keep the backend's own dtype ("server") and revision ("vllm:...")
            note = (f"reference: trusted vLLM server {rc.base_url} (model {rc.model}); noise floor measured from the "
                    f"local float32 weights of {floor_src} (the same model), so logprob-divergence runs; the trusted "
                    "engine's own run-to-run spread is not part of that floor (docs/scale.md)")
            return ReferenceSetup("vllm", be.tokenizer, dict.fromkeys(floor_lms, scorer), floor_lms, str(be.revision),
                                  str(be.dtype), notes=[note], backend=be)
        return ReferenceSetup("vllm", be.tokenizer, {str(be.dtype): scorer}, {}, str(be.revision), str(be.dtype),
                              notes=[f"reference: trusted vLLM server {rc.base_url} (model {rc.model}); no local "
                                     "weights of the served model here (its tokenizer/model names no bundled model or "
                                     "directory with weight files), so no noise floor: logprob-divergence does not "
                                     "run and greedy-match uses its default near-tie band"], backend=be)
    notes = [f"no reference (reference = {name!r}): {', '.join(NOT_TESTED_WITHOUT_REFERENCE)} not tested; only the "
             "reference-free tests ran (self-consistency of samples against the provider's own logprobs, greedy "
             "against its own top-1, parameter compliance)"]
    tok = None
    for cand in (rc.tokenizer, rc.model, claimed_model):
        if cand and _is_local_or_hub(str(cand)):
            try:
                tok = load_tokenizer(str(cand))
                break
            except ReferenceError:
                continue
    if tok is None:
        from reference.models import DEFAULT_MODEL

        try:
            tok = load_tokenizer(DEFAULT_MODEL)
        except ReferenceError as exc:
            raise AuditError(f"reference {name!r} (kind none): no tokenizer to align the provider's tokens ({exc}). "
                             "Fix: set tokenizer = \"DIR\" in its [references.NAME] table.", parameter="reference") from None
        notes.append(f"tokens aligned with the {DEFAULT_MODEL} tokenizer (the claimed model's could not be loaded)")
        return ReferenceSetup("none", tok, {}, {}, "none", "none", NOT_TESTED_WITHOUT_REFERENCE, notes,
                              tokenizer_is_claimed=False)
    return ReferenceSetup("none", tok, {}, {}, "none", "none", NOT_TESTED_WITHOUT_REFERENCE, notes)


def _has_local_weights(m: str) -> bool:
    """True when ``m`` is a bundled model name, a ``.gguf`` file or a directory holding weight files
    (``*.safetensors``/``*.bin``/``*.gguf``): loading it never contacts a hub."""
    from pathlib import Path

    from reference.models import BUNDLED, model_cache_dir

    if m in BUNDLED:
        return True
    p = Path(m).expanduser()
    if p.is_file():
        return p.suffix == ".gguf"
    for d in (p, model_cache_dir() / m):
        if d.is_dir() and any(next(d.glob(g), None) is not None for g in ("*.safetensors", "*.bin", "*.gguf")):
            return True
    return False


def _vllm_floor_weights(rc: ReferenceConfig, device: str | None) -> tuple[dict[str, LoadedModel], str]:
    """Local float32 weights of a vLLM reference's served model, for the noise floor only.

    The floor (``auditor.check.measured_floors``) needs the model's weights: it decodes through honest simulated
    deployments (fp32, kernel noise, bf16) and teacher-forces their tokens. A trusted vLLM engine
    exposes only top-k ``prompt_logprobs``, not weights, so the floor can be measured only when the
    same model's weights are also here: the table's ``tokenizer`` (else ``model``) names a bundled
    model or a local directory / ``.gguf`` with weight files. Hub ids are never downloaded for this.

    Returns:
        ({"float32": LoadedModel}, source name), or ({}, "") when no local weights exist or they do
        not load (the audit then runs without a floor, as documented in the reference notes).
    """
    for cand in (rc.tokenizer, rc.model):
        if cand and _has_local_weights(str(cand)):
            try:
                return get_reference_models(str(cand), ["float32"], device=device), str(cand)
            except AuditError:
                continue
    return {}, ""
