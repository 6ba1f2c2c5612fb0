"""Estimate a request's prompt tokens when the provider sends no ``usage`` (spend accounting).

A llama.cpp server streams no ``usage`` unless asked, and some providers never send it; the
run's cost line then read "0 prompt tokens". :class:`PromptTokenEstimator` counts them instead:

- ``"tokenizer"``: the reference's own ``tokenizer.json`` (HF ``tokenizers``, loaded once,
  ~0.1 s) from the local model cache (``$SPEC_AUDITOR_HOME/models/<reference>`` or the
  platformdirs user cache, the layout of ``reference.models.model_cache_dir``), on the prompt
  rendered with the model's ``chat_template.jinja`` (sandboxed Jinja, as transformers'
  ``apply_chat_template`` renders it) for the chat API;
- ``"chars/4"``: ``ceil(characters / 4)`` of the request's text (OpenAI's rule of thumb for
  English) when no cached tokenizer matches the reference name.

Either way the figure is an estimate and callers mark it so (``usage_estimated``). ``probes``
never imports ``reference`` or ``transformers``: this stays cheap for the probes-only runner.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["PromptTokenEstimator", "UsageEstimates", "request_text"]


def _cache_dir() -> Path:
    home = os.environ.get("SPEC_AUDITOR_HOME")
    if home:
        return Path(home).expanduser() / "models"
    import platformdirs

    return Path(platformdirs.user_cache_dir("spec-auditor")) / "models"


def request_text(request: dict[str, Any]) -> str:
    """The prompt text of a chat (``messages[].content``, text parts of lists) or completions
    (``prompt``) request body, joined with newlines; ``""`` when there is none."""
    prompt = request.get("prompt")
    if isinstance(prompt, str):
        return prompt
    parts: list[str] = []
    for m in request.get("messages") or []:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts.extend(p["text"] for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "\n".join(parts)


class PromptTokenEstimator:
    """Counts prompt tokens for ``reference`` (a model name in the local cache).

    ``method`` is ``"tokenizer"`` when the reference's ``tokenizer.json`` was found and loads,
    else ``"chars/4"``. :meth:`count` never raises on a malformed request (it counts what text
    there is).
    """

    def __init__(self, reference: str | None) -> None:
        self._tok: Any = None
        self._template: Any = None
        self._specials: dict[str, str] = {}
        d = _cache_dir() / reference if reference and "/" not in reference and reference != "none" else None
        if d is not None and (d / "tokenizer.json").is_file():
            try:
                from tokenizers import Tokenizer

                self._tok = Tokenizer.from_file(str(d / "tokenizer.json"))
                tpl = d / "chat_template.jinja"
                if tpl.is_file():
                    from jinja2.sandbox import ImmutableSandboxedEnvironment

                    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
                    self._template = env.from_string(tpl.read_text(encoding="utf-8"))
                cfg = d / "tokenizer_config.json"
                if cfg.is_file():
                    raw = json.loads(cfg.read_text(encoding="utf-8"))
                    self._specials = {k: v for k, v in raw.items() if k.endswith("_token") and isinstance(v, str)}
            except Exception:
                self._tok, self._template = None, None

    @property
    def method(self) -> str:
        """``"tokenizer"`` or ``"chars/4"``."""
        return "tokenizer" if self._tok is not None else "chars/4"

    def count(self, request: dict[str, Any]) -> int:
        """Estimated prompt tokens of ``request`` (a chat or completions body), ≥ 0."""
        text = request_text(request)
        if self._tok is None:
            return math.ceil(len(text) / 4)
        msgs = request.get("messages")
        if self._template is not None and isinstance(msgs, list):
            try:
                def _raise(msg: str) -> None:
                    raise ValueError(msg)

                text = self._template.render(
                    messages=msgs, add_generation_prompt=True, raise_exception=_raise, **self._specials
                )
            except Exception:
                text = request_text(request)
        return self.count_text(text)

    def count_text(self, text: str | None) -> int:
        """Tokens of plain ``text`` (no template, no special tokens), ≥ 0."""
        if not text:
            return 0
        if self._tok is None:
            return math.ceil(len(text) / 4)
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def estimate(
        self, request: dict[str, Any], *, n_tokens: int, chunk_tokens: Sequence[int] = (), text: str | None = None
    ) -> tuple[int, int]:
        """(prompt tokens, completion tokens) of a response that came without ``usage``.

        Completion tokens, in order of preference: ``n_tokens`` (the normalized tokens, one
        per logprobs entry), the sum of ``chunk_tokens`` (tokens per streamed chunk, see
        ``probes.wire.count_chunk_tokens``), else :meth:`count_text` of the generated ``text``.
        """
        ct = n_tokens or sum(chunk_tokens) or self.count_text(text)
        return self.count(request), int(ct)


class UsageEstimates:
    """Per-run tally of responses without ``usage`` (the runner's spend accounting).

    The estimator is loaded on first use only (a run whose provider reports usage never loads
    a tokenizer). :meth:`record` writes into the run's summary dict:
    ``usage_estimated`` (True), ``usage_missing_responses`` (added to an earlier session's
    count when a run is resumed) and ``usage_prompt_tokens_method`` (``"tokenizer"`` or
    ``"chars/4"``); nothing when every response carried usage.
    """

    def __init__(self, reference: str | None) -> None:
        self.reference = reference
        self.missing = 0
        self._est: PromptTokenEstimator | None = None

    def get(self) -> PromptTokenEstimator:
        """The estimator (loaded once)."""
        if self._est is None:
            self._est = PromptTokenEstimator(self.reference)
        return self._est

    def record(self, summary: dict[str, Any]) -> None:
        """Mark ``summary`` (a run's JSON summary) as holding estimated token/cost figures."""
        if not self.missing:
            return
        summary["usage_estimated"] = True
        summary["usage_missing_responses"] = int(summary.get("usage_missing_responses") or 0) + self.missing
        summary["usage_prompt_tokens_method"] = self.get().method
