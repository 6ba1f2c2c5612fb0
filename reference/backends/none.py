"""``none`` reference backend: no reference model (closed weights, or no hardware).

Every scoring or decoding call raises :class:`reference.backends.base.NoReferenceError`; the
pipeline then runs only the reference-free tests (self-consistency of the provider's samples
against its own logprobs, greedy against its own top-1, parameter compliance) and the report says
which causes (QUANTIZATION, SUBSTITUTION through logprobs) could not be tested.
"""

from __future__ import annotations

from collections.abc import Sequence

from reference.backends.base import NoReferenceError, ReferenceBackend
from reference.scoring import ScoredContinuation

NO_REFERENCE_MESSAGE = (
    "no reference model is configured (reference = 'none'): teacher-forced scoring and the reference "
    "greedy continuation are unavailable, so only the reference-free tests run (self-consistency, "
    "self-greedy, parameter compliance). Fix: point the provider's reference at a model or at a "
    "[references.NAME] table with kind = 'local' or 'vllm' to test quantization and substitution."
)


class NoneBackend(ReferenceBackend):
    """The absence of a reference, as an explicit backend.

    Args:
        name: the configured name (reported), default ``"none"``.
        tokenizer: optional tokenizer of the claimed model (only used to name tokens in reports).
    """

    kind = "none"

    def __init__(self, name: str = "none", tokenizer: object | None = None):
        self.name = name
        self.revision = "none"
        self.dtype = "none"
        self.tokenizer = tokenizer

    @property
    def available(self) -> bool:
        """Always False: nothing can be scored."""
        return False

    def score(
        self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], *, top_k: int = 20
    ) -> list[ScoredContinuation]:
        """Raises NoReferenceError (always)."""
        raise NoReferenceError(NO_REFERENCE_MESSAGE)

    def greedy(self, prompt: Sequence[int], max_new_tokens: int, *, stop_at_eos: bool = True) -> list[int]:
        """Raises NoReferenceError (always)."""
        raise NoReferenceError(NO_REFERENCE_MESSAGE)
