"""Reasoning-model facts shared by the normalizer and the analysis stages (issue 35): the fields
and think tags of a reasoning response, and which tokens spell a tag.

Kept apart from :mod:`probes.normalize` so that the analysis stages (``auditor.check.observations``,
``auditor.check.preflight``'s evaluation) use them without importing the normalizer (each response is
normalized once, at probe time). Formats: vLLM v0.11 ``vllm/reasoning/`` (``deepseek_r1``,
``qwen3``; field ``reasoning``, ``reasoning_content`` before), SGLang v0.5 reasoning parsers
(``reasoning_content``; ``kimi_k2``'s ``◁think▷``), DeepSeek's API (``reasoning_content``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from probes.records import TokenRecord

__all__ = ["REASONING_FIELDS", "THINK_TAGS", "reasoning_field", "think_tag_positions"]

#: Reasoning fields of a chat ``message`` or streamed ``delta``, in the order they are read:
#: ``reasoning_content`` (DeepSeek's API, SGLang ``--reasoning-parser``, vLLM up to v0.10),
#: ``reasoning`` (vLLM since v0.11, OpenRouter).
REASONING_FIELDS: tuple[str, ...] = ("reasoning_content", "reasoning")
#: ``(open, close)`` think tags: DeepSeek-R1/V3.x and Qwen3 (``<think>``), Seed-OSS, Kimi K2-Thinking.
THINK_TAGS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),
    ("<seed:think>", "</seed:think>"),
    ("\u25c1think\u25b7", "\u25c1/think\u25b7"),
)


def think_tag_positions(tokens: Sequence[TokenRecord]) -> frozenset[int]:
    """Indices (into ``tokens``) of the tokens whose bytes overlap a think tag
    (:data:`THINK_TAGS`) of a reasoning response; empty when no token is labelled ``reasoning``.
    Tokens after one with unknown bytes are not examined.

    No detector or pre-flight check scores them: an engine with a thinking budget forces the
    close tag (vLLM's ``thinking_token_budget``, the simulator's ``--reasoning`` mode), and a
    forced token is no sample of the model (``auditor.check.observations.Observation.tag_positions``).
    """
    if not any(t.span == "reasoning" for t in tokens):
        return frozenset()
    starts: list[int] = []
    pos = 0
    parts: list[bytes] = []
    for t in tokens:
        if t.bytes is None:
            break
        starts.append(pos)
        parts.append(t.bytes)
        pos += len(t.bytes)
    data = b"".join(parts)
    ranges: list[tuple[int, int]] = []
    for tag in {x.encode() for pair in THINK_TAGS for x in pair}:
        i = data.find(tag)
        while i >= 0:
            ranges.append((i, i + len(tag)))
            i = data.find(tag, i + 1)
    out = set()
    for k, a in enumerate(starts):
        b = a + len(parts[k])
        if any(a < e and s < b for s, e in ranges) or (a == b and any(s <= a < e for s, e in ranges)):
            out.add(k)
    return frozenset(out)


def reasoning_field(obj: dict[str, Any]) -> tuple[str, str] | None:
    """``(field name, text)`` of the reasoning field in a ``message`` or ``delta`` object: the first
    (``REASONING_FIELDS`` order) holding a non-empty string, else the first holding a string (a
    server sending both names, one of them empty), else ``None``."""
    found = [(name, v) for name in REASONING_FIELDS if isinstance(v := obj.get(name), str)]
    return next((f for f in found if f[1]), found[0] if found else None)
