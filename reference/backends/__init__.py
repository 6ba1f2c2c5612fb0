"""Reference backends: one interface (:class:`ReferenceBackend`), three kinds (local, vllm, none).

:func:`make_backend` builds one from a ``probes.config.ReferenceConfig`` (a ``[references.NAME]``
table, or a plain model name resolved by ``probes.providers_file.get_reference``); CLI flags override the
table's device/dtype. Errors are :class:`ReferenceError` (exit code 3) with the fix in the message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reference.backends.base import (
    BACKEND_KINDS,
    NoReferenceError,
    ReferenceBackend,
    ReferenceError,
    ReferenceSpec,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "BACKEND_KINDS",
    "NoReferenceError",
    "ReferenceBackend",
    "ReferenceError",
    "ReferenceSpec",
    "load_tokenizer",
    "make_backend",
]


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a model name (bundled name, directory, .gguf, cache dir, hub id).

    Raises:
        ReferenceError: the tokenizer cannot be loaded (one line: the model, what is wrong with its
            directory, e.g. no or corrupt tokenizer files, and the fix).
    """
    from transformers import AutoTokenizer

    from reference.models import ModelNotAvailableError, one_line, resolve_model_path, tokenizer_error

    try:
        path = resolve_model_path(name_or_path)
    except ModelNotAvailableError as exc:
        raise ReferenceError(f"the tokenizer of {name_or_path!r} cannot be loaded: {one_line(exc)}") from None
    src = str(path) if path is not None else name_or_path
    try:
        return AutoTokenizer.from_pretrained(src)
    except Exception as exc:  # transformers raises OSError/ValueError/KeyError/TypeError variants
        raise ReferenceError(tokenizer_error(
            name_or_path, src, exc, fix="set tokenizer = a local directory with the served model's tokenizer files "
            "(tokenizer.json and tokenizer_config.json, as written by save_pretrained)")) from None


def make_backend(
    cfg: ReferenceSpec,
    *,
    device: str | None = None,
    dtype: str | None = None,
    check: bool = True,
) -> ReferenceBackend:
    """Build the backend a reference config describes.

    Args:
        cfg: a :class:`ReferenceSpec`, e.g. ``probes.config.ReferenceConfig``.
        device, dtype: overrides (``--device`` / ``--dtype`` on the CLI) for ``local``.
        check: for ``vllm``, send one tiny request to verify the endpoint answers with
            ``prompt_logprobs``.

    Returns:
        LocalBackend, VLLMBackend or NoneBackend.

    Raises:
        ReferenceError: the model/tokenizer cannot be loaded, CUDA asked without a GPU, the vLLM
            endpoint does not answer or lacks ``prompt_logprobs``, the API key env var is unset.
    """
    if cfg.kind == "none":
        from reference.backends.none import NoneBackend

        return NoneBackend(cfg.name)
    if cfg.kind == "local":
        from reference.backends.local import LocalBackend
        from reference.models import ModelNotAvailableError

        try:
            return LocalBackend.load(
                str(cfg.model), device=device or cfg.device, dtype=dtype or cfg.dtype, device_map=cfg.device_map,
                max_memory=dict(cfg.max_memory) or None, token_budget=cfg.token_budget,
            )
        except (ModelNotAvailableError, ValueError, OSError) as exc:
            raise ReferenceError(f"reference {cfg.name!r} (kind local, model {cfg.model!r}): {exc}") from None
    if cfg.kind == "vllm":
        from reference.backends.vllm import VLLMBackend, api_key_from_env

        tok = load_tokenizer(cfg.tokenizer or str(cfg.model))
        be = VLLMBackend(
            str(cfg.base_url), str(cfg.model), tokenizer=tok, api_key=api_key_from_env(cfg.api_key_env),
            timeout_s=cfg.timeout_s, token_budget=cfg.token_budget,
        )
        if check:
            try:
                be.check()
            except ReferenceError:
                be.close()
                raise
        return be
    raise ReferenceError(f"reference {cfg.name!r}: kind={cfg.kind!r} is not one of {', '.join(BACKEND_KINDS)}")
