"""Reference stage of ``auditor check``: the audit's reference, set up before any probe is sent.

- :func:`check_device` and :func:`check_reference_api` refuse, before probing, a device that is not
  there and a chat audit against a base model (no chat template).
- :func:`resolve_reference` builds a :class:`ReferenceSetup` from a provider's ``reference``: local
  weights (:func:`get_reference_models`, loaded once per process in ``_MODELS``), a trusted vLLM
  server, or none (reference-free tests only). Its scorers are used by the scoring stage
  (:mod:`auditor.scoring`); ``ReferenceSetup.close`` is the teardown.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from auditor.errors import AuditError

if TYPE_CHECKING:  # pragma: no cover
    from auditor.scoring import Scorer
    from probes.config import ProviderConfig, ReferenceConfig
    from probes.model_card import ModelCard
    from reference.models import LoadedModel

__all__ = [
    "NOT_TESTED_WITHOUT_REFERENCE",
    "ReferenceSetup",
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
    """The reference model in every honest precision (``auditor.noise.REFERENCE_DTYPES``), loaded
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
    from auditor.noise import REFERENCE_DTYPES
    from probes.config import ConfigError, load_references

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
    from probes.config import ConfigError, get_reference
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

    def close(self) -> None:
        """Close the backend's HTTP client (vllm); no-op otherwise."""
        close = getattr(self.backend, "close", None)
        if callable(close):
            close()


def check_card(config: ProviderConfig | ModelCard | None, ref: ReferenceSetup, *, provider: str | None = None) -> None:
    """Refuse a model card the loaded local reference contradicts (issue 36, item 1): a block or group
    size that does not divide its weight shapes, or a recipe its ``config.json``'s own
    ``quantization_config`` contradicts (:func:`probes.model_card.check_shapes`,
    :func:`probes.model_card.check_quantization_config`). No-op without a card or local weights.

    Args:
        config: the provider (its card: :func:`probes.config.provider_card`) or the card itself.
        ref: the audit's reference; provider: the name in messages (default the config's).

    Raises:
        AuditError: ``parameter="card"`` (exit 3), naming ``providers.NAME.card...`` and the fix (also for a
            card name no loaded file defines).
    """
    import json
    from pathlib import Path

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
        return

    lm = next(iter(ref.lms.values()))
    qc = getattr(getattr(lm.model, "config", None), "quantization_config", None)
    cfg = Path(str(lm.path)) / "config.json"
    if cfg.is_file():
        with contextlib.suppress(OSError, ValueError):
            qc = json.loads(cfg.read_text(encoding="utf-8")).get("quantization_config", qc)
    if qc is not None and not isinstance(qc, Mapping):
        qc = qc.to_dict() if hasattr(qc, "to_dict") else None
    where = f"providers.{provider}.card ({card.name})"
    try:
        check_quantization_config(card, qc, where=where)
        check_shapes(card, {n: tuple(p.shape) for n, p in lm.model.named_parameters()}, where=where)
    except CardError as exc:
        raise AuditError(str(exc), parameter="card") from None


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
    from probes.config import ConfigError, load_references
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
    from auditor.scoring import local_scorers
    from probes.config import ConfigError, get_reference
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

    The floor (``auditor.noise``) needs the model's weights: it decodes through honest simulated
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
