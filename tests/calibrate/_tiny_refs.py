"""A picklable loader of the tests' tiny references, for worker processes (``auditor calibrate --workers``)."""

from __future__ import annotations

import copy

import torch


def load_tiny_refs() -> dict:
    """{"float32": the tiny random Llama of ``tiny_lm``, "bfloat16": its bfloat16 copy} (same seed, same weights)."""
    from transformers import AutoTokenizer

    from reference.models import LoadedModel, pull_default_model
    from tests.conftest import _wrap, make_tiny_model

    tok = AutoTokenizer.from_pretrained(str(pull_default_model()))
    f32 = _wrap(make_tiny_model(seed=0), tok, "tiny-llama-seed0")
    bf = LoadedModel(model=copy.deepcopy(f32.model).to(torch.bfloat16), tokenizer=tok, name=f32.name, path=f32.path,
                     revision=f32.revision, dtype=torch.bfloat16, device=f32.device)
    return {"float32": f32, "bfloat16": bf}
