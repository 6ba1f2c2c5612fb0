"""Response shaping in the OpenAI wire format: the pieces of chat and legacy completions bodies and chunks.

Pure functions of the engine and its results (no request state): the error body, the ``usage``
block, the operator's ``step_stats``, chat logprob entries as OpenAI spells them
(:func:`chat_logprob`) or as vLLM does (:class:`VllmLogprobs`), the legacy completions logprobs block
(:func:`legacy_logprobs`), vLLM's ``prompt_logprobs`` (:func:`vllm_prompt_logprobs`) and the
incremental UTF-8 text of a streamed choice (:class:`TextStream`). Formats: OpenAI API reference
(https://platform.openai.com/docs/api-reference); vLLM's OpenAI server (issue 40).
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from fastapi.responses import JSONResponse

from simulator.engine import ChoiceResult, SimulatorEngine, TokenInfo


def step_stats(chunks: list[int]) -> dict:
    """Operator statistics of one choice: tokens per speculative round (``ChoiceResult.chunks``)
    and their mean (= mean accepted tokens per verification step; plain decoding 1.0)."""
    n = len(chunks)
    return {"tokens_per_step": list(chunks), "steps": n,
            "mean_accepted_tokens_per_step": (sum(chunks) / n) if n else None}


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None, code: Any = None) -> dict:
    """OpenAI error JSON: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                   code: Any = None, headers: dict | None = None) -> JSONResponse:
    """A JSONResponse carrying :func:`error_body`."""
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


def usage(prompt_tokens: int, results: Iterable[ChoiceResult]) -> dict:
    """The ``usage`` block: prompt, completion and total tokens."""
    c = sum(len(r.tokens) for r in results)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": c, "total_tokens": prompt_tokens + c}


def chat_logprob(engine: SimulatorEngine, t: TokenInfo) -> dict:
    """OpenAI's chat logprob entry of one token: ``token``, ``logprob``, ``bytes`` and the ranked
    ``top_logprobs`` (each with its raw bytes; a partial UTF-8 character shows as ``\\xNN`` escapes)."""
    e = engine
    return {
        "token": e.token_str(t.token_id),
        "logprob": t.logprob,
        "bytes": list(e.token_bytes(t.token_id)),
        "top_logprobs": [
            {"token": e.token_str(i), "logprob": lp, "bytes": list(e.token_bytes(i))}
            for i, lp in zip(t.top_ids, t.top_logprobs, strict=True)
        ],
    }


def decode_piece(b: bytes) -> tuple[str, bool]:
    """``(text, complete)`` of a byte string: incomplete = it ends inside a UTF-8 character (text "")."""
    try:
        return b.decode("utf-8"), True
    except UnicodeDecodeError as ex:
        if ex.reason == "unexpected end of data" and ex.end == len(b):
            return "", False
        return b.decode("utf-8", errors="replace"), True


class VllmLogprobs:
    """vLLM's chat logprob entries for one choice (issue 40, item 2), stateful over its tokens in order.

    Follows vLLM's OpenAI server as measured in issue 40 (vLLM 0.32 CPU build; ``serving_chat.py``
    ``_get_top_logprobs`` and the incremental detokenizer): the sampled token is the first entry of
    ``top_logprobs``, followed by the best other tokens (k + 1 entries when it is not among the top k);
    a token that ends inside a UTF-8 character is returned as ``""`` with ``bytes: []`` and the token
    that completes the character carries the whole character (the pending bytes + its own), as do its
    alternatives (pending bytes + theirs; ``""`` when still incomplete, U+FFFD where invalid).
    """

    def __init__(self, engine: SimulatorEngine):
        self.engine = engine
        self.pending = b""

    def _alt(self, tid: int, lp: float) -> dict:
        text, _ = decode_piece(self.pending + self.engine.token_bytes(tid))
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    def entry(self, t: TokenInfo) -> dict:
        e = self.engine
        special = t.token_id in e.special_ids
        text, complete = (e.token_str(t.token_id), True) if special else decode_piece(self.pending + e.token_bytes(t.token_id))
        own = {"token": text, "logprob": t.logprob, "bytes": list(text.encode("utf-8"))}
        alts = [own] + [self._alt(i, lp) for i, lp in zip(t.top_ids, t.top_logprobs, strict=True) if i != t.token_id]
        if not t.top_ids:  # top_logprobs = 0: no list
            alts = []
        self.pending = b"" if complete or special else self.pending + e.token_bytes(t.token_id)
        return {**own, "top_logprobs": alts}


class TextStream:
    """Incremental text of one choice from released tokens (UTF-8 held back until complete)."""

    def __init__(self, engine: SimulatorEngine):
        self.engine = engine
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def text(self, tokens: list[TokenInfo]) -> str:
        b = b"".join(self.engine.token_bytes(t.token_id) for t in tokens if t.token_id not in self.engine.special_ids)
        return self.dec.decode(b)

    def flush(self) -> str:
        return self.dec.decode(b"", final=True)


def vllm_prompt_logprobs(engine: SimulatorEngine, ids: Sequence[int], k: int) -> list[dict | None]:
    """vLLM's ``prompt_logprobs`` for one prompt under the served model (teacher forcing).

    Format of vLLM's ``CompletionResponseChoice.prompt_logprobs``
    (``vllm/entrypoints/openai/completion/protocol.py``): one entry per prompt position, the first
    ``None``; each a dict ``{token_id: {"logprob", "rank", "decoded_token"}}`` holding the top-``k``
    (ranks 1..k) plus the prompt token itself with its exact rank (1 + the number of ids with a
    higher logprob); ``-inf`` is sent as ``-9999.0``. Raw log-softmax of the served model, nats.
    """
    ids = [int(t) for t in ids]
    out: list[dict | None] = [None]
    if len(ids) < 2:
        return out
    with engine._lock, torch.inference_mode():
        engine.served.model.nonce = 0
        logits = engine.served.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, :-1]
        for j, t in enumerate(ids[1:]):
            row = torch.log_softmax(logits[j].float(), dim=-1)
            entry: dict = {}
            if k > 0:
                tv, ti = torch.topk(row, min(k, row.shape[-1]))
                for r, (tid, lp) in enumerate(zip(ti.tolist(), tv.tolist(), strict=True), start=1):
                    entry[str(tid)] = {"logprob": max(float(lp), -9999.0), "rank": r, "decoded_token": engine.token_str(tid)}
            if str(t) not in entry:
                lp = float(row[t])
                entry[str(t)] = {"logprob": max(lp, -9999.0), "rank": int((row > row[t]).sum()) + 1,
                                 "decoded_token": engine.token_str(t)}
            out.append(entry)
    return out

def chat_logprobs(engine: SimulatorEngine, convention: str) -> Callable[[TokenInfo], dict]:
    """The entry maker of one choice's chat logprobs under ``convention`` (``openai``: :func:`chat_logprob`;
    ``vllm``: :class:`VllmLogprobs`); call it on the choice's tokens in order (vLLM's partial characters
    need the pending bytes)."""
    if convention == "vllm":
        return VllmLogprobs(engine).entry
    return functools.partial(chat_logprob, engine)


def legacy_logprobs(engine: SimulatorEngine, tokens: list[TokenInfo], start_offset: int, prefix: bytes = b"") -> dict:
    """Legacy completions logprobs block; offsets are characters into the choice text."""
    e = engine
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    acc = bytearray(prefix)
    for t in tokens:
        out["tokens"].append(e.token_str(t.token_id))
        out["token_logprobs"].append(t.logprob)
        if t.logprob is None:
            out["top_logprobs"].append(None)
        else:
            d = {e.token_str(i): lp for i, lp in zip(t.top_ids, t.top_logprobs, strict=True)}
            d.setdefault(e.token_str(t.token_id), t.logprob)
            out["top_logprobs"].append(d)
        out["text_offset"].append(start_offset + len(bytes(acc).decode("utf-8", errors="ignore")))
        if t.token_id not in e.special_ids:
            acc.extend(e.token_bytes(t.token_id))
    return out
