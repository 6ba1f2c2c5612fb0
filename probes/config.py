"""Provider configuration schema: which OpenAI-compatible endpoint to audit, and how to talk to it.

One pydantic model per table of the providers file: :class:`ProviderConfig` (``[providers.NAME]``) and
its sub-tables (:class:`Capabilities`, :class:`EnforcedParams`, :class:`RateLimits`, :class:`Pricing`,
:class:`RetryPolicy`, :class:`ResponseLimits`), and :class:`ReferenceConfig` (``[references.NAME]``);
:func:`provider_card` is the model card an audit of a provider uses. Where the file is found, how it is
read, validated and written back: :mod:`probes.providers_file`.

Secrets: a provider's API key is read from the environment variable named by ``api_key_env``
(:meth:`ProviderConfig.resolve_api_key`) at request time. It is never a config field, never
written to a file, the database, a log or a report; :meth:`ProviderConfig.safe_dump` is the
snapshot to persist (sensitive-looking header values are redacted there too).

Errors: every problem raises :class:`ConfigError` whose message names the file (where there is one),
the dotted field path and the fix.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from probes.model_card import BUNDLED_CARDS, ModelCard, card_for_reference

__all__ = [
    "CLAIMED_PRECISIONS",
    "DEFAULT_REFERENCE",
    "ENFORCEABLE",
    "Capabilities",
    "ConfigError",
    "EnforcedParams",
    "Pricing",
    "ProviderConfig",
    "RateLimits",
    "ReferenceConfig",
    "ResponseLimits",
    "RetryPolicy",
    "provider_card",
]

#: Request parameters a provider may fix or refuse (``[providers.NAME.enforced]``, issue 35 item 4).
ENFORCEABLE = ("temperature", "top_p", "top_k", "seed")
_SamplingParam = Literal["temperature", "top_p", "top_k", "seed"]

#: The bundled reference model (see ``reference.models.DEFAULT_MODEL``; duplicated here because
#: ``probes`` never imports ``reference``).
DEFAULT_REFERENCE = "smollm2-135m-instruct"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SENSITIVE_HEADER_RE = re.compile(r"(auth|key|token|secret|cookie|password)", re.IGNORECASE)


#: Precision labels a provider may claim (``claimed_precision``): OpenRouter's per-endpoint
#: ``quantization`` vocabulary (https://openrouter.ai/docs, provider routing: quantizations).
CLAIMED_PRECISIONS = ("int4", "int8", "fp4", "fp6", "fp8", "fp16", "bf16", "fp32")
ClaimedPrecision = Literal["int4", "int8", "fp4", "fp6", "fp8", "fp16", "bf16", "fp32"]


class ConfigError(ValueError):
    """A provider configuration problem; the message names the file, the field and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Capabilities(_Strict):
    """What the endpoint supports. Declared by hand or discovered by ``auditor providers probe``."""

    max_top_logprobs: int = Field(5, ge=0, le=100)
    """Largest ``top_logprobs`` (chat) / ``logprobs`` (completions) the endpoint accepts; requests
    ask for ``min(probe.top_logprobs, max_top_logprobs)`` alternatives per token. OpenAI: 20 for
    chat, 5 for legacy completions."""

    logprobs: bool = True
    """Whether the endpoint returns logprobs at all. Without them only greedy-match and
    sampling detectors can run."""

    n: bool = False
    """Whether ``n > 1`` (several choices per request) is honoured."""

    seed: bool = False
    """Whether a ``seed`` field is accepted and makes sampling reproducible."""

    echo: bool = False
    """Whether ``echo = true`` returns prompt-token logprobs (legacy completions only)."""

    streaming: bool = True
    """Whether ``stream = true`` (server-sent events) works; streaming gives TTFT and chunk timing."""

    stream_usage: bool = True
    """Whether streamed requests ask for ``stream_options = {include_usage = true}`` (token counts
    in the last chunk; without them spend is estimated with the reference tokenizer). A provider
    that rejects the field with HTTP 400 naming ``stream_options`` is retried at once without it,
    and the client stops sending it to that provider; set ``false`` to never send it."""

    concurrent_streams_ok: bool = True
    """Whether overlapping requests (two streams, two plain requests) all complete. ``false``
    when one was cut while another ran (a llama.cpp server cancels a running stream whenever
    another request waits); ``providers probe --write`` then also lowers
    ``rate_limits.concurrency`` to the widest overlap that survived (1 if none)."""


class EnforcedParams(_Strict):
    """Sampling parameters the provider applies whatever the request says, or refuses
    (``[providers.NAME.enforced]``; ``auditor providers probe NAME --write`` records what it observes).

    Some official APIs fix ``temperature = 1.0`` and ``top_p = 0.95`` (Kimi's), others answer HTTP 400
    when a reasoning model is sent ``temperature`` (OpenAI's o-series: "Unsupported value: 'temperature'
    does not support 0 with this model. Only the default (1) value is supported."). The audit then sends
    the declared value (never a rejected field), plans no greedy test when the temperature is fixed above 0,
    and tests the sampled tokens against the declared law (the reference's distribution at that temperature,
    cut to its top-p nucleus / top-k and renormalised). Example::

        [providers.kimi.enforced]
        temperature = 1.0     # applied whatever is asked (the provider's documentation, or its 400 message)
        top_p = 0.95
        rejected = ["temperature"]   # a request carrying it gets HTTP 400: it is left out

    A parameter in ``overridden`` or ``rejected`` without a declared value (temperature, top_p, top_k) has
    an unknown law: an audit refuses to start until its value is declared.
    """

    temperature: float | None = Field(None, ge=0.0, le=2.0)
    """Temperature the provider applies to every request; None = the requested one."""

    top_p: float | None = Field(None, gt=0.0, le=1.0)
    """Nucleus the provider applies (the smallest top set with probability >= top_p, renormalised)."""

    top_k: int | None = Field(None, ge=1, le=1_000_000)
    """Top-k the provider applies; None = none beyond the requested one."""

    overridden: list[_SamplingParam] = Field(default_factory=list)
    """Parameters observed to be replaced by the provider's own value (e.g. temperature-0 answers
    that differ, or emit tokens below the provider's own top-1); ``seed`` here = the seed is ignored."""

    rejected: list[_SamplingParam] = Field(default_factory=list)
    """Parameters the provider refuses with HTTP 400: never sent."""

    @field_validator("temperature", "top_p")
    @classmethod
    def _require_finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number (or omitted)")
        return v

    @field_validator("overridden", "rejected")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"lists a parameter twice ({v}); name each once")
        return v

    def value(self, param: str) -> float | int | None:
        """The declared value of ``param`` (temperature / top_p / top_k), None when not fixed."""
        return getattr(self, param) if param in ("temperature", "top_p", "top_k") else None

    def fixed(self) -> dict[str, float | int]:
        """``{param: value}`` for every parameter with a declared value."""
        return {p: v for p in ("temperature", "top_p", "top_k") if (v := self.value(p)) is not None}

    def unknown(self) -> list[str]:
        """Sampling parameters overridden or rejected whose applied value is not declared: the law the
        provider samples from is then unknown. (A rejected top_p / top_k leaves the provider's default,
        no truncation, which the pre-flight's top-p check tests, so only the temperature counts.)"""
        return ["temperature"] if self.temperature is None and "temperature" in {*self.overridden, *self.rejected} else []

    def temperature_for(self, requested: float) -> float:
        """The temperature a request asking ``requested`` is sampled at."""
        return float(self.temperature) if self.temperature is not None else float(requested)

    def greedy_possible(self) -> bool:
        """Whether a temperature-0 (greedy) request is honoured."""
        return self.temperature in (None, 0.0) and not self.unknown()

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` (a request, modified in place and returned) as the provider allows it: each declared
        value replaces the requested one (so the stored request states the law applied), each rejected
        parameter is removed."""
        for p, v in self.fixed().items():
            body[p] = v
        for p in self.rejected:
            body.pop(p, None)
        return body

    def describe(self) -> str:
        """One line for reports: ``temperature = 1.0, top_p = 0.95 (rejected: temperature)``; "" when none."""
        parts = [f"{p} = {v:g}" for p, v in self.fixed().items()]
        parts += [f"{p} overridden (value not declared)" for p in self.overridden if p not in self.fixed() and p != "seed"]
        if "seed" in self.overridden:
            parts.append("seed ignored")
        if self.rejected:
            parts.append(f"rejected with HTTP 400: {', '.join(self.rejected)}")
        return ", ".join(parts)


class RateLimits(_Strict):
    """Client-side limits the probe client enforces for this provider."""

    requests_per_s: float | None = Field(None, gt=0)
    """Maximum request starts per second (retries included); ``None`` = unlimited."""

    concurrency: int = Field(8, ge=1, le=1024)
    """Maximum requests in flight at once."""


class Pricing(_Strict):
    """List prices, used for the spend ledger and budgets (USD)."""

    usd_per_1m_input: float = Field(0.0, ge=0)
    """USD per one million prompt (input) tokens."""

    usd_per_1m_output: float = Field(0.0, ge=0)
    """USD per one million completion (output) tokens."""

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        """Cost in USD of ``prompt_tokens`` input and ``completion_tokens`` output tokens."""
        return (prompt_tokens * self.usd_per_1m_input + completion_tokens * self.usd_per_1m_output) / 1e6


class RetryPolicy(_Strict):
    """Retries on 429/5xx/timeouts/connection errors/truncated or malformed bodies (tenacity)."""

    max_attempts: int = Field(4, ge=1, le=20)
    """Total attempts per request, the first included."""

    backoff_initial_s: float = Field(0.5, ge=0)
    """First backoff wait in seconds; doubles each retry (with jitter)."""

    backoff_max_s: float = Field(30.0, ge=0)
    """Upper bound on one exponential backoff wait, seconds."""

    max_retry_after_s: float = Field(120.0, ge=0)
    """Upper bound on honouring a server's ``Retry-After`` header, seconds."""

    retry_malformed: bool = True
    """Also retry a 2xx whose body is not valid JSON or a stream cut before ``[DONE]``."""


class ResponseLimits(_Strict):
    """Bounds on what one provider may make the auditor read, so that one hostile or broken
    provider cannot exhaust the machine that audits the others. Exceeding a bound ends that
    request with a named failure kind (recorded, never an exception); none of them is retried."""

    max_response_bytes: int = Field(32 * 1024 * 1024, ge=4096, le=1024 * 1024 * 1024)
    """Largest response body read, in bytes (after any Content-Encoding is undone); the body is
    read incrementally and dropped at this size: ``response_too_large`` (the first 64 KiB are
    kept as evidence). Default 32 MiB: a 4096-token answer with 20 alternatives per token, streamed,
    is about 8 MiB. Peak client memory is about ``concurrency`` × this."""

    stream_token_factor: float = Field(4.0, ge=1.0, le=1000.0)
    """A stream may carry at most ``stream_token_factor × max_tokens × n + stream_token_slack``
    tokens (counted per chunk from its logprobs entries, else 1 per text-bearing chunk); a stream
    beyond that (a provider ignoring ``max_tokens``), or with more than twice that many events
    plus 256 (empty events), is cut: ``stream_token_overrun``. No bound when the request has no
    ``max_tokens``."""

    stream_token_slack: int = Field(64, ge=0, le=1_000_000)
    """Tokens allowed beyond ``stream_token_factor × max_tokens × n`` (see there)."""

    max_stored_body_bytes: int = Field(8 * 1024 * 1024, ge=4096, le=1024 * 1024 * 1024)
    """Most characters (≈ bytes) of one attempt's raw body kept in the store; the cap is lower when
    the request asks for less (:func:`probes.wire.stored_body_cap`: what ``max_tokens``, ``n`` and
    the asked alternatives can fill), so a provider sending 100,000 alternatives per token cannot
    fill the database. The part beyond is dropped with a note saying how much."""

    max_stored_bytes_per_run: int = Field(64 * 1024 * 1024, ge=65536, le=64 * 1024 * 1024 * 1024)
    """Most characters of raw bodies one run keeps in the store, all attempts together; past it
    each further body keeps only its first 4 KiB (the normalized tokens are stored in full)."""

    stall_timeout_s: float = Field(30.0, gt=0, le=3600)
    """Seconds an answer may make no progress once its headers came (issue 37, item 9): a stream
    with no ``data:`` event for this long (keep-alive comments and empty events are not progress),
    or a plain body still incomplete this long after its first non-blank byte (a body trickling
    bytes), ends the attempt as ``stalled`` (not retried: a stalling provider stalls again). A
    plain body's wait for its first byte (the answer being generated) is bounded by ``timeout_s``."""

    request_deadline_s: float | None = Field(None, gt=0)
    """Wall-clock bound on one request in seconds, every retry and backoff wait included
    (``timeout_s`` bounds one attempt). Past it the request ends as ``deadline_exceeded``.
    ``None`` = ``timeout_s × retry.max_attempts``."""

    @field_validator("request_deadline_s")
    @classmethod
    def _finite_deadline(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number of seconds (or omitted)")
        return v


class ReferenceConfig(_Strict):
    """A named reference engine, ``[references.NAME]``; a provider selects it with ``reference = "NAME"``.

    Example (TOML)::

        [references.llama8b-gpu]
        kind = "local"                 # transformers in this process
        model = "/models/Llama-3.1-8B-Instruct"
        device = "cuda"                # auto | cpu | cuda | cuda:N
        dtype = "bfloat16"             # float32 (default) | bfloat16 | float16

        [references.llama70b-multi]
        kind = "local"
        model = "/models/Llama-3.1-70B-Instruct"
        dtype = "bfloat16"
        device_map = "auto"            # spread over every visible GPU (accelerate)
        max_memory = { "0" = "70GiB", "1" = "70GiB", "cpu" = "200GiB" }

        [references.deepseek-cluster]
        kind = "vllm"                  # a trusted vLLM server the owner runs
        model = "deepseek-ai/DeepSeek-V3"
        base_url = "http://10.0.0.5:8000/v1"
        api_key_env = "TRUSTED_VLLM_KEY"

    A provider's ``reference`` that names no table keeps meaning a model (bundled name, directory,
    .gguf file, hub id) loaded locally with the defaults; ``reference = "none"`` runs only the
    reference-free tests.
    """

    name: str
    """The table key."""

    kind: Literal["local", "vllm", "none"] = "local"
    """``local`` (transformers here), ``vllm`` (a trusted vLLM server), ``none`` (no reference)."""

    model: str | None = None
    """Model to load (``local``) or the served model name (``vllm``); required unless kind = none."""

    base_url: str | None = None
    """``vllm`` only: the server's API root up to ``/v1``."""

    api_key_env: str | None = None
    """``vllm`` only: NAME of the env var holding the server's key (never the key itself)."""

    tokenizer: str | None = None
    """``vllm``: where to load the served model's tokenizer (bundled name, directory, hub id);
    default = ``model``."""

    device: str = "auto"
    """``local``: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``."""

    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """``local``: weight precision (float32 is the reference precision)."""

    device_map: Literal["auto"] | None = None
    """``local``: ``"auto"`` spreads the model over every visible GPU (then CPU) via accelerate."""

    max_memory: dict[str, str] = Field(default_factory=dict)
    """``local`` with ``device_map``: per-device caps, keys a GPU index or ``cpu``, values like ``"70GiB"``."""

    token_budget: int = Field(4096, ge=1, le=10_000_000)
    """Padded tokens per scoring forward pass (``local``) or prompt tokens per request (``vllm``)."""

    timeout_s: float = Field(120.0, gt=0)
    """``vllm``: per-request deadline in seconds."""

    @field_validator("device")
    @classmethod
    def _check_device(cls, v: str) -> str:
        v = v.strip().lower()
        if not re.match(r"^(auto|cpu|cuda(:\d+)?)$", v):
            raise ValueError("use auto, cpu, cuda or cuda:N (e.g. 'cuda:1')")
        return v

    @field_validator("api_key_env")
    @classmethod
    def _check_ref_key_env(cls, v: str | None) -> str | None:
        if v in (None, ""):
            return None
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", v):
            raise ValueError("must be the NAME of an environment variable (e.g. 'VLLM_API_KEY'), not the key itself")
        return v

    @field_validator("max_memory")
    @classmethod
    def _check_max_memory(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not (k.isdigit() or k == "cpu"):
                raise ValueError(f"key {k!r} must be a GPU index ('0', '1', ...) or 'cpu'")
            if not re.match(r"^\d+(\.\d+)?\s*(KiB|MiB|GiB|TiB|KB|MB|GB|TB)$", str(val)):
                raise ValueError(f"value {val!r} for {k!r} must be a size like '70GiB' or '500MB'")
        return v

    @model_validator(mode="after")
    def _check_kind(self) -> ReferenceConfig:
        if self.kind != "none" and not self.model:
            raise ValueError(f"kind = '{self.kind}' needs model = \"...\" (a bundled name, directory or served model)")
        if self.kind == "vllm":
            if not self.base_url or not re.match(r"^https?://[^/\s]+", self.base_url):
                raise ValueError("kind = 'vllm' needs base_url = \"http://HOST:PORT/v1\" (the trusted vLLM server)")
            self.__dict__["base_url"] = self.base_url.rstrip("/")
        elif self.base_url:
            raise ValueError(f"base_url is only used with kind = 'vllm' (kind is '{self.kind}'); remove it")
        if self.max_memory and self.device_map is None:
            raise ValueError("max_memory needs device_map = \"auto\" (it caps what each device receives)")
        return self


class ProviderConfig(_Strict):
    """One OpenAI-compatible provider endpoint and how to audit it."""

    name: str
    """Provider name (kebab-case), the key of its ``[providers.NAME]`` table."""

    base_url: str
    """API root up to and including ``/v1``, e.g. ``https://api.example.com/v1``; the client
    appends ``/chat/completions`` or ``/completions``."""

    model: str
    """Model id sent in the request body's ``model`` field."""

    api: Literal["chat", "completions"] = "chat"
    """Wire API: ``chat`` (``/v1/chat/completions``) or ``completions`` (legacy ``/v1/completions``)."""

    api_key_env: str | None = None
    """Name of the environment variable holding the API key (sent as ``Authorization: Bearer``).
    ``None`` for endpoints without auth. The key itself never appears in the config."""

    reference: str = DEFAULT_REFERENCE
    """Reference the provider is compared against: the NAME of a ``[references.NAME]`` table
    (:class:`ReferenceConfig`: local/GPU/vLLM), ``"none"`` (reference-free tests only), or a model
    loaded locally with the defaults (bundled ``smollm2-135m-instruct`` / ``gemma-3-270m``, a
    directory, a .gguf file or a Hugging Face id)."""

    reasoning_opener: str | None = Field(None, max_length=64)
    """Text the model's chat template puts after the generation prompt to open the reasoning
    span, e.g. ``"<think>\\n"`` (DeepSeek-R1's template; the simulator's ``--reasoning`` mode).
    The reference's prompt ends with it, as the provider's does. ``None`` (default): the template
    opens none (a model that writes its own ``<think>``, or a plain chat model)."""

    card: str | ModelCard | None = None
    """The model's native serving recipe (:mod:`probes.model_card`): the NAME of a ``[cards.NAME]``
    table or of a bundled card, or an inline table. Resolved to a :class:`ModelCard` when the file is
    loaded (an unknown name is a ConfigError). None: the bundled card of a bundled ``reference``, else
    no card (the reference's own dtype is taken as the native precision)."""

    claimed_precision: ClaimedPrecision | None = None
    """The precision the provider claims to serve (as OpenRouter's per-endpoint quantization label):
    the report checks it against the measured precision (``auditor.verdict.precision_estimate``):
    matches / does not match / cannot tell, with the power."""

    capabilities: Capabilities = Field(default_factory=Capabilities)
    """Declared or discovered capabilities (``auditor providers probe NAME --write``)."""

    enforced: EnforcedParams = Field(default_factory=EnforcedParams)
    """Sampling parameters the provider fixes or refuses (:class:`EnforcedParams`; issue 35 item 4)."""

    rate_limits: RateLimits = Field(default_factory=RateLimits)
    """Client-side request rate and concurrency limits."""

    pricing: Pricing = Field(default_factory=Pricing)
    """USD prices per 1M input/output tokens."""

    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    """Retry and backoff policy."""

    timeout_s: float = Field(60.0, gt=0)
    """Per-attempt wall-clock deadline in seconds (whole response, streamed or not); the whole
    request, retries included, is bounded by ``response_limits.request_deadline_s``."""

    response_limits: ResponseLimits = Field(default_factory=ResponseLimits)
    """Per-response byte cap, streamed-token cap and whole-request deadline."""

    audit_deadline_s: float = Field(3600.0, gt=0, le=7 * 86400)
    """Wall-clock bound on sending one audit's probes, seconds (default 3600 = 1 h; ``auditor
    check --deadline`` overrides it; issue 37, item 9). Past it the requests in flight are
    cancelled, the probes not finished stay pending (a ``--resume`` sends them), and the verdict is
    computed on what was collected, the report saying so (summary key ``deadline``)."""

    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Extra JSON fields merged into every request body (e.g. ``{ top_k = -1 }``). They override
    the probe's own fields, so use with care."""

    headers: dict[str, str] = Field(default_factory=dict)
    """Extra HTTP headers. ``Authorization`` is refused here: use ``api_key_env``."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("use letters, digits, '.', '_' or '-' (e.g. 'my-provider')")
        return v

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, v: str) -> str:
        v = v.strip()
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError("must start with http:// or https:// and name a host, e.g. 'http://127.0.0.1:8000/v1'")
        for suffix in ("/chat/completions", "/completions"):
            if v.rstrip("/").endswith(suffix):
                raise ValueError(f"give the API root without '{suffix}' (e.g. '.../v1')")
        return v.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _check_key_env(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", v):
            raise ValueError(
                "must be the NAME of an environment variable (e.g. 'OPENAI_API_KEY'), not the key itself"
            )
        return v

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if k.lower() in ("authorization", "proxy-authorization"):
                raise ValueError(f"header '{k}' is not allowed in a file; put the key in an env var named by api_key_env")
        return v

    @field_validator("timeout_s")
    @classmethod
    def _finite_timeout(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number of seconds")
        return v

    @model_validator(mode="after")
    def _check_api_caps(self) -> ProviderConfig:
        if self.capabilities.echo and self.api != "completions":
            raise ValueError("capabilities.echo needs api = 'completions' (chat has no echo); set echo = false")
        return self

    # -- behaviour -------------------------------------------------------------------------
    def request_deadline_s(self) -> float:
        """Whole-request deadline in seconds (``response_limits.request_deadline_s`` or its default)."""
        d = self.response_limits.request_deadline_s
        return float(d) if d is not None else float(self.timeout_s) * self.retry.max_attempts

    def endpoint_url(self) -> str:
        """Full request URL: ``base_url`` + ``/chat/completions`` or ``/completions``."""
        return self.base_url + ("/chat/completions" if self.api == "chat" else "/completions")

    def resolve_api_key(self, environ: dict[str, str] | None = None) -> str | None:
        """Read the API key from the env var named by ``api_key_env``.

        Returns ``None`` when ``api_key_env`` is unset. Raises :class:`ConfigError` when the
        variable is named but empty or missing (the fix: export it).
        """
        if self.api_key_env is None:
            return None
        env = os.environ if environ is None else environ
        key = env.get(self.api_key_env)
        if not key:
            raise ConfigError(
                f"provider '{self.name}': api_key_env = '{self.api_key_env}' but that environment "
                f"variable is not set. Fix: export {self.api_key_env}=<your key> (or remove api_key_env "
                "for an endpoint without auth)."
            )
        return key

    def safe_dump(self) -> dict[str, Any]:
        """JSON-ready snapshot for the database/report: no key, sensitive header values redacted."""
        d = self.model_dump(mode="json")
        d["headers"] = {k: ("[REDACTED]" if _SENSITIVE_HEADER_RE.search(k) else v) for k, v in self.headers.items()}
        return d


def provider_card(config: ProviderConfig) -> ModelCard | None:
    """The card an audit of ``config`` uses: its own (resolved at load), else the bundled card of a
    bundled ``reference``, else None. A ``card`` still given by name (a config built in code) is
    looked up among the bundled cards; an unknown name raises :class:`ConfigError`."""
    c = config.card
    if isinstance(c, ModelCard):
        return c
    if isinstance(c, str):
        if c not in BUNDLED_CARDS:
            raise ConfigError(f"providers.{config.name}.card: no card named {c!r} (known: "
                              f"{', '.join(sorted(BUNDLED_CARDS))}). Fix: load the providers file that defines it.")
        return BUNDLED_CARDS[c]
    return card_for_reference(config.reference)

