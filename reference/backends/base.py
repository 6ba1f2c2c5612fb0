"""The reference interface the audit talks to: greedy continuation and teacher-forced scoring.

A :class:`ReferenceBackend` answers two questions about the *target* model p (the model the
provider claims to serve), always on token ids of the reference tokenizer:

- :meth:`ReferenceBackend.greedy` — the target's greedy (temperature 0) continuation of a prefix;
- :meth:`ReferenceBackend.score` — teacher forcing: for given ``(prompt ids, continuation ids)``
  pairs, per continuation position the chosen token's logprob, the top-k ids/logprobs and the
  probability mass outside the top-k (``tail_mass``), in nats at temperature 1 (raw logprobs,
  like vLLM's default ``--logprobs-mode raw_logprobs``).

Backends: ``local`` (transformers on CPU/GPU/several GPUs, :mod:`reference.backends.local`),
``vllm`` (a trusted vLLM server, :mod:`reference.backends.vllm`) and ``none`` (no reference;
:mod:`reference.backends.none`). The pipeline, noise floor and calibration use only this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from reference.scoring import ScoredContinuation

#: Backend kinds accepted in ``[references.NAME] kind = ...``.
BACKEND_KINDS = ("local", "vllm", "none")


class ReferenceSpec(Protocol):
    """What :func:`reference.backends.make_backend` reads from a reference description.

    ``probes.config.ReferenceConfig`` (a ``[references.NAME]`` table) satisfies it; the protocol keeps
    ``reference/`` free of any import from ``probes/`` (layering rule L1, docs/ARCHITECTURE.md).
    Members are read-only properties so that narrower field types (``Literal`` kinds) still match.
    """

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...  # "local" | "vllm" | "none"
    @property
    def model(self) -> str | None: ...
    @property
    def base_url(self) -> str | None: ...
    @property
    def api_key_env(self) -> str | None: ...
    @property
    def tokenizer(self) -> str | None: ...
    @property
    def device(self) -> str: ...  # "auto" | "cpu" | "cuda" | "cuda:N"
    @property
    def dtype(self) -> str: ...  # "float32" | "bfloat16" | "float16"
    @property
    def device_map(self) -> str | None: ...
    @property
    def max_memory(self) -> Mapping[str, str]: ...
    @property
    def token_budget(self) -> int: ...  # padded tokens per forward (local) or prompt tokens per request (vllm)
    @property
    def timeout_s(self) -> float: ...  # seconds, vllm per-request deadline


class ReferenceError(RuntimeError):
    """A reference backend cannot answer (bad configuration, unreachable server, bad reply).

    The message names the field or the endpoint and the fix. ``exit_code`` is 3 (bad input).
    """

    exit_code = 3


class NoReferenceError(ReferenceError):
    """Raised by the ``none`` backend: there is no reference model to score against.

    Callers that can fall back to the reference-free tests (self-consistency of the provider's own
    samples and logprobs, greedy against its own top-1, parameter compliance) catch this.
    """


class ReferenceBackend(ABC):
    """The target model, as the audit needs it.

    Attributes:
        kind: ``"local"``, ``"vllm"`` or ``"none"``.
        name: the model name it was configured with (e.g. ``smollm2-135m-instruct``).
        revision: a string that pins the weights (sha256 prefix of the weights for ``local``,
            ``vllm:<model>@<base_url>`` for ``vllm``); part of every reference-cache key.
        dtype: reference precision name (``float32``, ``bfloat16``, ...) or ``"server"``.
        tokenizer: the transformers tokenizer of the reference (None for ``none``).
    """

    kind: str = "abstract"
    name: str = ""
    revision: str = "unknown"
    dtype: str = "float32"
    tokenizer: object | None = None

    @property
    def available(self) -> bool:
        """True when :meth:`score` and :meth:`greedy` can answer (False only for ``none``)."""
        return True

    @abstractmethod
    def score(
        self,
        prompts: Sequence[Sequence[int]],
        continuations: Sequence[Sequence[int]],
        *,
        top_k: int = 20,
    ) -> list[ScoredContinuation]:
        """Teacher-force each continuation after its prompt.

        Args:
            prompts: per item, the prompt ids (non-empty; special tokens such as BOS included
                exactly as the provider's server would build them).
            continuations: per item, the continuation ids (may be empty).
            top_k: alternatives per position (>= 0).

        Returns:
            One ``reference.scoring.ScoredContinuation`` per item, in input order: ``logprobs``
            ``[T]`` float64 (nats), ``top_ids`` ``[T, K]`` int64, ``top_logprobs`` ``[T, K]``
            float64, ``tail_mass`` ``[T]`` float64 (1 - sum of the top-k probabilities).

        Raises:
            ValueError: malformed ids (empty prompt, ids outside the vocabulary, top_k < 0).
            ReferenceError: the backend cannot answer (``NoReferenceError`` for ``none``).
        """

    @abstractmethod
    def greedy(self, prompt: Sequence[int], max_new_tokens: int, *, stop_at_eos: bool = True) -> list[int]:
        """The target's greedy (argmax, temperature 0) continuation of ``prompt``.

        Args:
            prompt: prefix ids (non-empty). max_new_tokens: >= 1.
            stop_at_eos: stop after the first end-of-sequence token (included in the result).

        Returns:
            list[int] of at most ``max_new_tokens`` new token ids.

        Raises:
            ValueError: empty prompt, max_new_tokens < 1. ReferenceError: cannot answer.
        """

    def describe(self) -> dict[str, Any]:
        """JSON-friendly identity of the backend (kind, name, revision, dtype) for reports."""
        return {"kind": self.kind, "name": self.name, "revision": self.revision, "dtype": self.dtype}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release held resources (HTTP clients); the default does nothing."""
