"""Discover a provider's capabilities by asking (``auditor providers probe NAME``).

Small requests (a few tokens each, ~12 requests in all), each answering one question:

- ``enforced`` (issue 35 item 4): which sampling parameters the provider refuses or replaces.
  *Rejected*: a first request carrying ``temperature = 0``, ``top_p = 1``, ``top_k = -1`` and ``seed`` that
  comes back HTTP 400 / 422 naming one of them (the error's ``param``, else the name quoted in its
  message) records it as rejected, and it is sent again without it until it passes; the value the
  provider applies instead is read from the message when it says so (OpenAI: "Only the default (1) value
  is supported."). *Overridden*: two temperature-0 requests (16 tokens) whose tokens fall below the
  provider's own reported top-1 (more than 0.01 nats, twice or more: a greedy engine emits none), or,
  without logprobs, whose answers differ, mean the temperature is replaced; the value is then not
  observable in a few requests, so it is kept from ``[providers.NAME.enforced]`` when declared there
  (the provider's documentation), else the audit asks for it. A seed that does not reproduce an answer
  is recorded as overridden (ignored). Top-p / top-k overrides are not observable in so few tokens:
  declare them. :attr:`DiscoveryReport.enforced`;
- ``logprobs`` / ``max_top_logprobs``: ask 20 alternatives, fall back to 5, then to logprobs
  without alternatives; the cap is the largest number of alternatives actually returned;
- ``n``: ``n = 2`` returns two choices;
- ``seed``: two ``T = 1`` requests with the same seed return the same text, a third with another
  seed returns another text;
- ``echo`` (completions only): ``echo = true`` returns prompt-token logprobs;
- ``logprob_convention`` (when alternatives came back): the seeded ``T = 1`` requests ask for up to 5
  alternatives and :func:`probes.conventions.learn_convention` reads how the lists are built (ranked, or
  vLLM's sampled token first) and how split characters are spelled; :attr:`DiscoveryReport.convention`;
- ``streaming``: ``stream = true`` returns a well-formed SSE stream ending in ``[DONE]``;
- ``concurrency``: the ``n = 2`` request with the other-seed request, and two streaming
  requests, are sent at the same time; an attempt of either pair cut (truncated stream, an answer
  ended empty — ``empty_stream`` / ``empty_answer`` —, 429/503, dropped connection), or one answer
  without content beside a twin with content, means overlapping requests do not survive. A llama.cpp
  server cancels a running stream whenever another request waits: 48 of 52 requests of one
  audit at the default width 8 ended as truncated streams (and, in another version, 51 of 52 as a
  role chunk then ``[DONE]``). Then ``concurrent_streams_ok`` is
  false and :attr:`DiscoveryReport.safe_concurrency` is 1, which ``providers probe --write``
  stores as ``rate_limits.concurrency`` (the widths above 2 are not tried, to keep the probe at
  ~10 tiny requests; the client's adaptive limit finds the width at run time). A request of a pair
  cut that way is sent again alone, so its own capability is still observed.

Only what was observed is reported (issue 37, item 3): a request that fails for any reason other than
the server refusing the option asked about (HTTP 400 / 422) — a 401, an unknown model, a 5xx, a refused
connection, an HTML page, a redirect — ends the probe there, with :attr:`DiscoveryReport.error` quoting
the status and the server's message and no capabilities (``providers probe`` then exits 3 and writes
nothing).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

from probes.client import ProbeClient, ProbeResult
from probes.concurrency import is_pressure
from probes.config import ENFORCEABLE, Capabilities, EnforcedParams, ProviderConfig
from probes.conventions import learn_convention
from probes.normalize import normalize_response
from probes.wire import describe_error

__all__ = ["CapabilityCheck", "DiscoveryReport", "discover_capabilities"]

_PROMPT = "Count from one to ten: one, two,"
_RANDOM_PROMPT = "Write a list of ten random, unrelated words."
#: Statuses with which a server refuses an option it does not support (an observation, not a failure).
_REFUSAL_STATUS = frozenset({400, 422})
#: Nats by which a temperature-0 token may trail the provider's own top-1 (ties, rounding).
_GREEDY_TIE_NATS = 0.01
#: What a refusal says the provider applies instead (OpenAI's reasoning models).
_DEFAULT_VALUE_RE = re.compile(r"only the default \(([0-9.]+)\) value is supported", re.IGNORECASE)


@dataclass(frozen=True)
class CapabilityCheck:
    """One question asked of the provider and its answer."""

    name: str
    supported: bool
    value: Any
    detail: str
    http_status: int | None = None


@dataclass
class DiscoveryReport:
    """Every check, and the :class:`Capabilities` they imply (None when the probe failed: ``error``)."""

    provider: str
    checks: list[CapabilityCheck] = field(default_factory=list)
    capabilities: Capabilities | None = None
    """What was observed; None when a request failed for a reason other than the server refusing the
    option asked about (``error``): nothing may then be written, nor a capability reported."""
    requests: int = 0
    safe_concurrency: int | None = None
    """Concurrency to write into ``rate_limits``: 1 when overlapping requests were cut, ``None``
    when they survived (the configured width is kept)."""
    error: str | None = None
    """Why the probe failed: the failing request's status and the server's own message
    (:func:`probes.wire.describe_error`), e.g. ``HTTP 401: Incorrect API key provided ...``."""
    convention: dict[str, Any] | None = None
    """The logprob convention observed (:meth:`probes.conventions.LogprobConvention.to_dict`), None when
    no alternatives came back."""
    enforced: EnforcedParams | None = None
    """The parameters observed rejected (HTTP 400 naming them) or overridden, with the values the provider
    said it applies (None when the probe failed)."""


class _ProbeFailed(Exception):
    """A discovery request failed for a reason that is no answer about a capability."""


def _base(config: ProviderConfig, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": config.model, "max_tokens": 4, "temperature": 0.0}
    if config.api == "chat":
        body["messages"] = [{"role": "user", "content": _PROMPT}]
    else:
        body["prompt"] = _PROMPT
    body.update(config.extra_body)
    body.update(kw)
    return body


def _max_alts(config: ProviderConfig, res: ProbeResult) -> tuple[bool, int]:
    """(logprobs came back?, largest number of alternatives at any position)."""
    if not res.success:
        return False, 0
    norm = normalize_response(config.api, res.request, response_text=res.response_text, stream=res.stream)
    if not norm.tokens:
        return False, 0
    return True, max(len(t.top_logprobs) for t in norm.tokens)


def _refused(res: ProbeResult) -> bool:
    """The server answered, and refused an option of the request (HTTP 400 / 422): an observation
    that the capability asked about is not supported."""
    return not res.success and res.http_status in _REFUSAL_STATUS


def _named_param(res: ProbeResult, sent: dict[str, Any]) -> str | None:
    """The enforceable parameter a refusal names (its ``error.param``, else a quoted name in its message),
    among those ``sent``; None when it names none of them."""
    err = res.json.get("error") if isinstance(res.json, dict) else None
    param = err.get("param") if isinstance(err, dict) else None
    cands = [p for p in ENFORCEABLE if p in sent]
    if isinstance(param, str) and param in cands:
        return param
    msg = str(err.get("message") if isinstance(err, dict) else "") + " " + str(res.error or "")
    quoted = next((p for p in cands if re.search(rf"['\"`]{p}['\"`]", msg)), None)
    return quoted or next((p for p in cands if re.search(rf"\b{p}\b", msg)), None)


def _default_value(res: ProbeResult) -> float | None:
    """The value a refusal says the provider applies ("Only the default (1) value is supported."), or None."""
    m = _DEFAULT_VALUE_RE.search(str(res.response_text or "") + " " + str(res.error or ""))
    return float(m.group(1)) if m else None


def _below_own_top1(config: ProviderConfig, res: ProbeResult) -> int | None:
    """Tokens of a temperature-0 answer that trail the provider's own reported top-1 by more than
    ``_GREEDY_TIE_NATS`` (a greedy engine emits none); None without logprobs."""
    if not res.success:
        return None
    norm = normalize_response(config.api, res.request, response_text=res.response_text, stream=res.stream)
    gaps = [max(alts) - t.logprob for t in norm.tokens
            if t.logprob is not None and (alts := [lp for (_s, _b, lp) in t.top_logprobs if lp is not None])]
    return sum(g > _GREEDY_TIE_NATS for g in gaps) if gaps else None


def _failure(res: ProbeResult, what: str) -> str | None:
    """Why ``res`` says nothing about a capability (a failure that is not a refusal), or None."""
    if res.success or _refused(res):
        return None
    return f"{what} failed: {describe_error(res.error or res.error_kind or 'no response')}"


async def discover_capabilities(
    config: ProviderConfig,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    api_key: str | None = None,
) -> DiscoveryReport:
    """Ask ``config``'s endpoint what it supports.

    A capability is reported only as observed: supported when a request using it succeeded,
    unsupported when it succeeded without it or the server refused it (HTTP 400 / 422). Any other
    failure (401, unknown model, 5xx, connection refused, an HTML page, a redirect, ...) ends the probe
    at that request with :attr:`DiscoveryReport.error` set and ``capabilities`` None; so does a probe
    where no request succeeded. A request of an overlap pair cut by the overlap itself is sent again
    alone, so the capability is still observed.

    Raises ``ConfigError`` only when ``api_key_env`` names an unset variable.
    """
    rep = DiscoveryReport(provider=config.name)
    try:
        await _discover(config, rep, transport, api_key)
    except _ProbeFailed as exc:
        rep.error = str(exc)
        rep.capabilities = None
        rep.safe_concurrency = None
    return rep


async def _discover(config: ProviderConfig, rep: DiscoveryReport, transport: httpx.AsyncBaseTransport | None,
                    api_key: str | None) -> None:
    cfg = config.model_copy(
        update={
            "retry": config.retry.model_copy(update={"max_attempts": 2, "backoff_max_s": 2.0}),
            # at least 2 in flight, so the overlap pairs below really overlap
            "rate_limits": config.rate_limits.model_copy(update={"concurrency": max(2, config.rate_limits.concurrency)}),
        }
    )
    chat = config.api == "chat"
    succeeded = [0]
    first_error: list[str] = []
    async with ProbeClient(cfg, transport=transport, api_key=api_key) as client:

        async def send(body: dict[str, Any]) -> ProbeResult:
            rep.requests += 1
            res = await client.send(body, key="discover", stream=bool(body.get("stream")))
            succeeded[0] += res.success
            if not res.success and not first_error:
                first_error.append(describe_error(res.error or res.error_kind or "no response"))
            return res

        async def ask(body: dict[str, Any], what: str) -> ProbeResult:
            """One request whose failure, other than a refusal, ends the probe."""
            res = await send(body)
            if (why := _failure(res, what)) is not None:
                raise _ProbeFailed(why)
            return res

        async def pair(a: dict[str, Any], b: dict[str, Any], what: tuple[str, str]) -> tuple[ProbeResult, ProbeResult, ProbeResult, ProbeResult]:
            """Send ``a`` and ``b`` at the same time; a member that ended in a pressure failure (the overlap
            cut it) is sent again alone. Returns (a, b as overlapped, a, b as observed)."""
            ra, rb = await asyncio.gather(send(a), send(b))
            out = []
            for res, body, w in ((ra, a, what[0]), (rb, b, what[1])):
                if not res.success and is_pressure(res.error_kind, res.http_status, bool(res.attempts and res.attempts[-1].retryable)):
                    res = await send(body)
                if (why := _failure(res, w)) is not None:
                    raise _ProbeFailed(why)
                out.append(res)
            return ra, rb, out[0], out[1]

        # enforced parameters, 1: a refusal naming a sampling parameter (sent again without it)
        rejected: list[str] = []
        values: dict[str, float] = {}
        body = _base(cfg, top_p=1.0, top_k=-1, seed=1)
        while True:
            res = await ask(body, "the first request (temperature 0, top_p 1, top_k -1, seed)")
            named = _named_param(res, body) if _refused(res) else None
            if named is None:
                break
            rejected.append(named)
            if (v := _default_value(res)) is not None and named in ("temperature", "top_p", "top_k"):
                values[named] = v
            body.pop(named)
        if rejected:
            rep.checks.append(CapabilityCheck(
                "rejected", True, rejected, "HTTP 400 naming " + ", ".join(rejected)
                + "".join(f"; applies {p} = {v:g}" for p, v in values.items()), 400))

        def base(**kw: Any) -> dict[str, Any]:
            """A discovery request without the parameters the provider rejects."""
            b = _base(cfg, **kw)
            for p in rejected:
                b.pop(p, None)
            return b

        def on_open_prompt(body: dict[str, Any], alternatives: int) -> dict[str, Any]:
            """``body`` (changed in place) on the open prompt ``_RANDOM_PROMPT``, asking for ``alternatives``
            top_logprobs when above 0."""
            if alternatives > 0:
                body.update({"logprobs": True, "top_logprobs": alternatives} if chat else {"logprobs": alternatives})
            body.update({"messages": [{"role": "user", "content": _RANDOM_PROMPT}]} if chat else {"prompt": _RANDOM_PROMPT})
            return body

        # logprobs and the alternatives cap
        lp_ok, cap, status, note = False, 0, None, ""
        for k in (20, 5):
            body = base(logprobs=True, top_logprobs=k) if chat else base(logprobs=k)
            res = await ask(body, f"the first request (logprobs, {k} alternatives)" if k == 20 else "logprobs")
            status = res.http_status
            ok, n_alt = _max_alts(cfg, res)
            if ok:
                lp_ok, cap = True, min(n_alt, k)
                note = f"asked {k}, got up to {n_alt}"
                break
            note = res.error or "no logprobs returned"
        if not lp_ok and not res.success:  # alternatives refused: logprobs alone? (a 200 without any logprobs
            # already says the server ignores logprobs=true; asking again without top_logprobs would not change it)
            body = base(logprobs=True) if chat else base(logprobs=0)
            res = await ask(body, "logprobs")
            ok, _ = _max_alts(cfg, res)
            if ok:
                lp_ok, cap, note = True, 0, "logprobs without alternatives only"
            status = res.http_status
        rep.checks.append(CapabilityCheck("logprobs", lp_ok, lp_ok, note, status))
        rep.checks.append(CapabilityCheck("max_top_logprobs", cap > 0, cap, note, status))

        # seed: same seed → same text, and another seed → another text (else the seed is not
        # what decides). a and b run one after the other (overlap could change a batch-variant
        # server's sample); the n = 2 request and c run at the same time: the plain-request
        # overlap test, neither of which needs a reproducible sample.
        # enforced parameters, 2: is temperature 0 honoured? (two greedy answers on an open prompt)
        greedy = on_open_prompt(base(max_tokens=16), min(cap, 5))  # cap > 0 only when logprobs work
        g1 = await ask(greedy, "a temperature-0 request")
        g2 = await ask(greedy, "a temperature-0 request")
        below = [x for x in (_below_own_top1(cfg, g1), _below_own_top1(cfg, g2)) if x is not None]
        overridden: list[str] = []
        if "temperature" not in rejected and g1.success and g2.success:
            if below:
                t_over = sum(below) >= 2
                det = f"{sum(below)} temperature-0 tokens below the provider's own top-1"
            else:
                t_over = g1.text != g2.text
                det = "two temperature-0 answers " + ("differ" if t_over else "are identical") + " (no logprobs to tell)"
            if t_over:
                overridden.append("temperature")
            rep.checks.append(CapabilityCheck("temperature_0", not t_over, not t_over,
                                              det + ("; the provider replaces temperature 0" if t_over else ""), g2.http_status))

        k_conv = min(cap, 5)  # the sampled answers also show the logprob convention (issue 40)
        body = on_open_prompt(base(temperature=1.0, seed=12345, max_tokens=16), k_conv)
        a = await ask(body, "a seeded request")
        b = await ask(body, "a seeded request")
        n_cut, c_cut, res, c = await pair(base(n=2, temperature=1.0, max_tokens=16),
                                          {**body, **({} if "seed" in rejected else {"seed": 54321})},
                                          ("the n=2 request", "a seeded request"))

        # n > 1
        n_choices = len(res.json.get("choices", [])) if res.success and isinstance(res.json, dict) else 0
        rep.checks.append(CapabilityCheck("n", n_choices >= 2, n_choices, res.error or f"{n_choices} choices for n=2", res.http_status))

        same = a.success and b.success and a.text == b.text
        differs = c.success and c.text != a.text
        seed_ok = same and differs
        if a.error or b.error or c.error:
            detail = a.error or b.error or c.error or ""
        elif not same:
            detail = "different texts for the same seed"
        elif not differs:
            detail = "same text for different seeds at T=1 (seed not observable)"
        else:
            detail = "same text for the same seed, another for another seed"
        if "seed" in rejected:
            detail = "rejected with HTTP 400: not sent"
        elif not same and a.success and b.success:
            overridden.append("seed")  # the same seed gave another answer: the provider ignores it
        rep.checks.append(CapabilityCheck("seed", bool(seed_ok), bool(seed_ok), detail, b.http_status))
        if k_conv > 0:
            norms = [normalize_response(cfg.api, body, response=r.json) for r in (a, b, c)
                     if r.success and isinstance(r.json, dict)]
            conv = learn_convention([n.tokens for n in norms], k_conv)
            rep.convention = conv.to_dict()
            what = ("the sampled token first, then the best others" + (" (k + 1 entries)" if conv.max_entries > k_conv else "")
                    if conv.sampled_first else "ranked (best first)")
            rep.checks.append(CapabilityCheck(
                "logprob_convention", conv.n_positions > 0, conv.name,
                f"top_logprobs {what}; split characters: {conv.partial_chars} ({conv.n_positions} positions)",
                a.http_status))

        # echo (legacy completions only)
        if chat:
            rep.checks.append(CapabilityCheck("echo", False, False, "chat API has no echo", None))
            echo_ok = False
        else:
            body = base(echo=True, logprobs=1, max_tokens=1)
            res = await ask(body, "the echo request")
            norm = normalize_response("completions", body, response_text=res.response_text) if res.success else None
            echo_ok = bool(norm and norm.prompt_tokens and "echo_ignored" not in norm.anomalies)
            det = res.error or (f"{len(norm.prompt_tokens)} prompt tokens with logprobs" if echo_ok and norm is not None
                                else "prompt logprobs missing")
            rep.checks.append(CapabilityCheck("echo", echo_ok, echo_ok, det, res.http_status))

        # streaming, as two overlapping streams (also the stream overlap test)
        s1, s2, o1, o2 = await pair(base(stream=True, max_tokens=16), base(stream=True, max_tokens=16),
                                    ("a streamed request", "a streamed request"))
        res = o1 if o1.success or not o2.success else o2
        st_ok = res.success
        det = res.error or (f"TTFT {res.ttft_s:.3f}s, {len(res.tokens_per_chunk)} chunks" if res.ttft_s is not None else "stream ok")
        rep.checks.append(CapabilityCheck("streaming", st_ok, st_ok, det, res.http_status))

        # concurrency: was any overlapping attempt cut, or an overlapping answer empty, while its twin completed?
        conc_ok, det = _overlap_verdict({"streams": (s1, s2), "requests": (n_cut, c_cut)})
        rep.safe_concurrency = None if conc_ok else 1
        rep.checks.append(CapabilityCheck("concurrency", conc_ok, 2 if conc_ok else 1, det, res.http_status))

    if not succeeded[0]:
        raise _ProbeFailed(f"no request succeeded: {first_error[0] if first_error else 'no response'}")
    declared = config.enforced  # values declared by hand (the provider's documentation) stand where none was read
    rep.enforced = EnforcedParams(
        **{p: values.get(p, declared.value(p)) for p in ("temperature", "top_p", "top_k")},
        overridden=overridden, rejected=rejected)
    rep.capabilities = Capabilities(
        max_top_logprobs=cap,
        logprobs=lp_ok,
        n=n_choices >= 2,
        seed=bool(seed_ok),
        echo=echo_ok,
        streaming=st_ok,
        concurrent_streams_ok=conc_ok,
    )


def _overlap_verdict(pairs: dict[str, tuple[ProbeResult, ProbeResult]]) -> tuple[bool, str]:
    """(overlap survived?, detail) from pairs of requests sent at the same time.

    An overlap failed when an attempt of either request ended in a pressure failure
    (:func:`probes.concurrency.is_pressure`: truncated stream, 429/503, dropped connection)
    while some attempt of the pair succeeded — the server can answer, just not two at once.
    Pairs where nothing succeeded say nothing about overlap (that is the capability's own failure).
    """
    cut: list[str] = []
    for what, pair in pairs.items():
        tries = [t for r in pair for t in r.attempts]
        if not any(t.error is None for t in tries):
            continue
        kinds = sorted({str(t.error_kind) for t in tries if t.error is not None and is_pressure(t.error_kind, t.http_status, t.retryable)})
        if kinds:
            cut.append(f"overlapping {what} were cut ({', '.join(kinds)})")
        elif sum(1 for r in pair if r.success and not r.text) == 1:  # one twin has content, the other none
            cut.append(f"one of the overlapping {what} came back empty")
    if cut:
        return False, "; ".join(cut) + ": use rate_limits.concurrency = 1"
    return True, "2 overlapping streams and 2 overlapping requests completed with content"

