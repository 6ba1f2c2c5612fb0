"""Request schemas of the OpenAI-compatible endpoints (pydantic v2), validated strictly.

Follows OpenAI's documented request bodies for ``POST /v1/chat/completions`` and
``POST /v1/completions`` (https://platform.openai.com/docs/api-reference), with vLLM's ``top_k``
extension. Fields the simulator does not model are accepted when neutral (e.g. penalties of 0)
and rejected with a 400 naming the field otherwise, so a client never silently gets behaviour it
did not ask for. Unknown fields are ignored (as vLLM does).

Bad types are errors (strict mode: ``"max_tokens": "5"`` or ``1.5`` is a 400), except that ints are
accepted where a float is expected. :func:`parse_request` reads a request's JSON body into a schema,
every failure an :class:`InvalidRequest` (HTTP 400).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

if TYPE_CHECKING:
    from fastapi import Request

MAX_N = 16
MAX_STOP = 4
#: vLLM's default ``--max-logprobs``: the largest ``prompt_logprobs`` accepted.
MAX_PROMPT_LOGPROBS = 20


class InvalidRequest(ValueError):
    """A request that must be answered with an OpenAI-style 400 error.

    Attributes:
        message: human-readable explanation naming the fix.
        param: the offending field (dotted path) or None.
        code: machine code (``invalid_value``, ``model_not_found``, ...).
    """

    def __init__(self, message: str, param: str | None = None, code: str | None = "invalid_value"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class _Base(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class ContentPart(_Base):
    """One part of a message's content (only text parts are supported)."""

    type: str
    text: str | None = None


class ChatMessage(_Base):
    """A chat message: ``role`` and ``content`` (text, or a list of text parts)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        out = []
        for i, part in enumerate(self.content):
            if part.type != "text" or part.text is None:
                raise InvalidRequest(
                    f"content part type {part.type!r} is not supported; send text parts only",
                    param=f"messages.content.{i}.type",
                )
            out.append(part.text)
        return "".join(out)


class StreamOptions(_Base):
    """``stream_options``: ``include_usage`` adds a final chunk with usage."""

    include_usage: bool = False


class _Sampling(_Base):
    model: str
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Any) -> Any:
        if isinstance(v, list) and len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences are allowed")
        return v

    @model_validator(mode="after")
    def _unsupported(self) -> Any:
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if v not in (None, 0, 0.0):
                raise ValueError(f"{name}={v} is not supported by this server; send 0 or omit it")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by this server; omit it")
        return self

    def stop_list(self) -> list[str]:
        """Stop sequences as a list (empty strings dropped)."""
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions`` body."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> Any:
        if self.top_logprobs is not None and self.top_logprobs > 0 and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true")
        if self.tools:
            raise ValueError("tools are not supported by this server; omit them")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise ValueError("only response_format type 'text' is supported")
        return self


class CompletionRequest(_Sampling):
    """``POST /v1/completions`` body (legacy)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=MAX_N)
    #: vLLM extensions (``vllm/entrypoints/openai/completion/protocol.py``): teacher-forced
    #: logprobs of the prompt itself (top-k per position, capped like vLLM's default
    #: ``--max-logprobs 20``), and the ids of the prompt and of the generated tokens.
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_PROMPT_LOGPROBS)
    return_token_ids: bool = False

    @model_validator(mode="after")
    def _check(self) -> Any:
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("`prompt_logprobs` are not available when `stream=True`")
        if self.suffix:
            raise ValueError("suffix is not supported by this server; omit it")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of different from n is not supported by this server")
        if isinstance(self.prompt, list) and len(self.prompt) == 0:
            raise ValueError("prompt must not be empty")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompt(s) as a list: strings or token-id lists."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


def _validation_to_invalid(e: ValidationError) -> InvalidRequest:
    """The first error of a pydantic ``ValidationError`` as an :class:`InvalidRequest` naming the field."""
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("function-after",))
    msg = err.get("msg", "invalid value")
    msg = msg.removeprefix("Value error, ")
    inp = err.get("input")
    shown = "" if isinstance(inp, dict) or err.get("type") == "missing" else f" (got {json.dumps(inp, default=str)[:80]})"
    return InvalidRequest(f"{loc or 'body'}: {msg}{shown}", param=loc or None, code="invalid_value")


_Req = TypeVar("_Req", bound=BaseModel)


async def parse_request(request: Request, schema: type[_Req]) -> _Req:
    """The request's JSON body validated against ``schema`` (:class:`ChatCompletionRequest`,
    :class:`CompletionRequest`).

    Raises:
        InvalidRequest: a body that is not JSON (``invalid_json``), not a JSON object, or that
            ``schema`` refuses (``invalid_value``; the message and ``param`` name the first bad field).
    """
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"the request body is not valid JSON ({e}); send a JSON object", code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_json")
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        raise _validation_to_invalid(e) from None
    except InvalidRequest:
        raise
