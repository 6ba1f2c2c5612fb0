"""``local`` reference backend: a transformers model on CPU, one GPU, or several GPUs.

Devices: ``auto`` (CUDA when available), ``cpu``, ``cuda``, ``cuda:N``; ``device_map="auto"``
spreads the layers over every visible GPU through accelerate (optional ``max_memory`` caps per
device). Precision: float32 by default (the reference precision); bfloat16/float16 allowed — the
noise floor of that precision is measured separately (``auditor.check.measured_floors``).

Scoring is :func:`reference.scoring.score_continuations` (token-budgeted batches, logits reduced in
chunks); greedy decoding is an argmax loop with the KV cache (transformers ``past_key_values``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from reference.backends.base import ReferenceBackend
from reference.models import LoadedModel, MaxMemory, load_model
from reference.scoring import (
    DEFAULT_TOKEN_BUDGET,
    ScoredContinuation,
    check_score_args,
    input_device,
    score_continuations,
)


class LocalBackend(ReferenceBackend):
    """A loaded transformers model behind the :class:`ReferenceBackend` interface.

    Args:
        loaded: the ``reference.models.LoadedModel``.
        token_budget: padded tokens per scoring forward pass (memory bound, see ``reference.scoring``).
        batch_size: sequences per scoring forward pass.

    Attributes:
        loaded: the LoadedModel (``.model``, ``.tokenizer``, ``.revision``, ``.device``).
    """

    kind = "local"

    def __init__(self, loaded: LoadedModel, *, token_budget: int = DEFAULT_TOKEN_BUDGET, batch_size: int = 64):
        if token_budget < 1:
            raise ValueError(f"token_budget={token_budget} must be >= 1 (padded tokens per forward pass)")
        self.loaded = loaded
        self.name = loaded.name
        self.revision = loaded.revision
        self.dtype = str(loaded.dtype).replace("torch.", "")
        self.tokenizer = loaded.tokenizer
        self.token_budget = int(token_budget)
        self.batch_size = int(batch_size)

    @classmethod
    def load(
        cls,
        model: str,
        *,
        device: str = "auto",
        dtype: str = "float32",
        device_map: str | None = None,
        max_memory: MaxMemory | None = None,
        token_budget: int = DEFAULT_TOKEN_BUDGET,
    ) -> LocalBackend:
        """Load ``model`` (bundled name, directory, .gguf, hub id) — see ``reference.models.load_model``.

        Raises:
            ValueError: bad dtype/device, CUDA without a GPU.
            reference.models.ModelNotAvailableError: the model or its tokenizer cannot be loaded.
        """
        lm = load_model(model, dtype=dtype, device=device, device_map=device_map, max_memory=max_memory)
        return cls(lm, token_budget=token_budget)

    # the LoadedModel attributes older code reads (``lm.model``, ``lm.device``, ``lm.eos_token_ids``)
    @property
    def model(self) -> Any:
        """The transformers causal LM."""
        return self.loaded.model

    @property
    def device(self) -> torch.device:
        """Device of the input embedding (where ``input_ids`` go)."""
        return input_device(self.loaded.model)

    @property
    def eos_token_ids(self) -> list[int]:
        """End-of-sequence ids (tokenizer + generation config)."""
        return self.loaded.eos_token_ids

    def describe(self) -> dict[str, Any]:
        """Kind, name, revision, dtype, device (and the GPU split under ``device_map``)."""
        d = super().describe()
        d["device"] = str(self.device)
        hf_map = getattr(self.loaded.model, "hf_device_map", None)
        if hf_map:
            d["device_map"] = sorted({str(v) for v in hf_map.values()})
        return d

    def score(
        self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], *, top_k: int = 20
    ) -> list[ScoredContinuation]:
        """Teacher-forced scores (see :meth:`ReferenceBackend.score`), memory-bounded by ``token_budget``."""
        return score_continuations(
            self.loaded, prompts, continuations, top_k=top_k, batch_size=self.batch_size, token_budget=self.token_budget
        )

    def greedy(self, prompt: Sequence[int], max_new_tokens: int, *, stop_at_eos: bool = True) -> list[int]:
        """Argmax continuation with the KV cache (see :meth:`ReferenceBackend.greedy`)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
        V = int(self.loaded.model.config.vocab_size)
        ((pr, _),) = check_score_args([prompt], [[]], 0, V)
        model = self.loaded.model
        eos = set(self.eos_token_ids) if stop_at_eos else set()
        dev = self.device
        out: list[int] = []
        with torch.inference_mode():
            res = model(input_ids=torch.tensor([pr], device=dev), use_cache=True)
            for _ in range(max_new_tokens):
                nxt = int(res.logits[0, -1].float().argmax())
                out.append(nxt)
                if nxt in eos or len(out) >= max_new_tokens:
                    break
                res = model(input_ids=torch.tensor([[nxt]], device=dev), past_key_values=res.past_key_values,
                            use_cache=True)
        return out
