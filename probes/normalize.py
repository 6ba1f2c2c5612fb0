"""Response normalizer: provider responses (chat or completions, plain or SSE) → per-token records.

Every provider answer is evidence, including the broken ones, so :func:`normalize_response`
never raises on a malformed body: it returns what it can and lists *anomalies* (vocabulary in
``../shared/cases/README.md``, plus the extra kinds below).

Per generated token it yields a :class:`TokenRecord` with

- ``bytes``: the authoritative bytes, recovered through the answer text (every reading of a
  token and the text-guided choice: :mod:`probes.byte_recovery`). A token's correct ``bytes``
  field is never overwritten by a U+FFFD of the text or token string; a token gets bytes only
  when every assignment that reproduces the text agrees on its span, otherwise ``None``
  (reported, never guessed);
- ``logprob``: the chosen token's logprob in nats as a finite number ≤ 0, or ``None`` when it is
  censored or untrustworthy: null/NaN/±inf (``nonfinite_logprob``), the ``-9999`` "not in top-k"
  sentinel or any value ≤ -9999 (``sentinel_logprob``), ≤ -1e30 (``masked_logit``), > 1e-6
  (``positive_logprob``), or exactly 0.0 while the other listed alternatives hold more than 1e-3
  of probability (``mass_exceeds_one``; two or more in a row → ``zero_logprob_run``);
- ``top_logprobs``: ``(token, bytes, logprob)`` alternatives, in the order given; logprobs obey the
  same rule (``None`` for masked, padded, sentinel or non-finite entries), so every float in a
  record is finite and JSON-safe. At most the asked count + 1 are kept while parsing (the
  chosen token's entry and the highest others; ``top_logprobs_excess`` counts the rest), so
  memory and storage follow the request, not the provider (issue 37, item 11).

Extra anomaly kinds (beyond the shared vocabulary; all listed in :data:`probes.anomalies.ANOMALY_KINDS`): ``malformed_json`` (body or an SSE event is
not JSON), ``truncated_stream`` (no ``data: [DONE]``), ``provider_error`` (an ``error`` object),
``malformed_response`` (JSON without the expected structure), ``spm_token_strings`` (SentencePiece
``▁`` leaked into token strings), ``replacement_char_text`` (the text and token strings carry
U+FFFD where the tokens' ``bytes`` hold a valid character: per-token decoding by the runtime;
the bytes are kept). Byte spellings of partial characters (``<0xC3>``,
``bytes:\\xc3``, `` \\xc3``) are a legitimate convention and are decoded without an anomaly.

Source for the wire formats: OpenAI API reference (chat ``logprobs.content[]`` with ``token``,
``logprob``, ``bytes``, ``top_logprobs``; legacy completions ``tokens``, ``token_logprobs``,
``top_logprobs`` dicts, ``text_offset``, ``echo``), and the public bug reports cited by each case.
Either logprobs shape is accepted on either API (some servers answer ``/v1/completions`` with
the chat shape). SSE and in-band error objects are read by :mod:`probes.sse`, the parser the
client uses too. ``text_offset`` is used only when it is monotonic and agrees with the tokens'
lengths.

Reasoning models (issue 35): the reasoning text arrives in ``message.reasoning_content`` /
``message.reasoning``, streamed as ``delta.reasoning_content`` / ``delta.reasoning``
(``probes.reasoning.REASONING_FIELDS``), or inline between think tags in ``content`` where no parser runs
(``probes.reasoning.THINK_TAGS``); ``logprobs.content`` covers the reasoning tokens (think tags included, as
the parser consumed them from the text) and then the answer, or the answer only. Each token gets
a span label (``TokenRecord.span``: ``reasoning`` / ``answer``); the tokens' bytes are recovered
against reasoning + answer where they cover both, against the answer where they cover only it,
and a reasoning response that fits neither is reported ``reasoning_logprobs_inconsistent``
(never ``bytes_text_mismatch``); the formats followed and the span rules: :mod:`probes.reasoning_spans`.

Usage: :attr:`NormalizedResponse.usage` keeps the provider's ``usage`` object with its token
counts checked (non-negative integers); :attr:`NormalizedResponse.usage_missing` is True when
the provider reported no usable ``prompt_tokens``/``completion_tokens`` (e.g. a stream without
``stream_options.include_usage``): the caller then counts with the reference tokenizer and marks
the figure estimated.

Parts: this module decodes the body (plain JSON or SSE, :mod:`probes.sse`), merges streamed chunks,
checks ``usage`` and splits echoed prompt tokens off (legacy completions); :mod:`probes.logprob_entries`
reads the ``logprobs`` object, :mod:`probes.reasoning_spans` places the reasoning span,
:mod:`probes.token_checks` builds the records and flags per-token anomalies (:mod:`probes.anomalies`).
"""

from __future__ import annotations

from typing import Any

from probes.anomalies import MAX_UNASKED_ALTERNATIVES, AnomalyLog, as_float
from probes.byte_recovery import assign_bytes, byte_spelling, candidates, gpt2_unicode_to_bytes
from probes.logprob_entries import RawToken, logprobs_entries
from probes.reasoning import reasoning_field
from probes.reasoning_spans import label_spans, reasoning_layout
from probes.records import NormalizedResponse
from probes.sse import find_error, loads_json, looks_like_plain_json, parse_sse
from probes.token_checks import build_tokens

__all__ = ["normalize_response"]


# -- streamed chunks and usage --------------------------------------------------------------

def _assemble_stream(
    api: str, events: list[Any], choice: int, acc: AnomalyLog, logprobs_asked: bool
) -> tuple[str, list[RawToken] | None, Any, Any, int, tuple[str, str] | None]:
    """Merge SSE chunks of one choice → (text, raw tokens or None, finish_reason, usage,
    number of content events, i.e. events that carry this choice, and ``(field, reasoning
    text)`` when any delta carried a reasoning field, else ``None``)."""
    texts: list[str] = []
    reasoning: list[str] = []
    reasoning_name: str | None = None
    toks: list[RawToken] | None = None
    finish = None
    usage = None
    chunks_without_lp = 0
    n_content = 0
    for ev in events:
        if not isinstance(ev, dict):
            acc.add("malformed_response", None, "stream event is not an object")
            continue
        if isinstance(ev.get("usage"), dict):
            usage = ev["usage"]
        chs = ev.get("choices")
        if not isinstance(chs, list):
            continue
        for ch in chs:
            if not isinstance(ch, dict) or ch.get("index", 0) != choice:
                continue
            n_content += 1
            if api == "chat":
                d = ch.get("delta")
                delta = d if isinstance(d, dict) else {}
                piece = delta.get("content")
                rf = reasoning_field(delta)
                if rf is not None:
                    reasoning_name = reasoning_name or rf[0]
                    reasoning.append(rf[1])
            else:
                piece = ch.get("text")
            entries = logprobs_entries(ch.get("logprobs"), acc)
            piece = piece if isinstance(piece, str) else ""
            texts.append(piece)
            if entries is not None:
                if toks is None:
                    toks = []
                toks.extend(entries)
            elif piece:
                chunks_without_lp += 1
            finish = ch.get("finish_reason") or finish
    if logprobs_asked and toks is not None and chunks_without_lp:
        acc.add("missing_logprobs", None, f"{chunks_without_lp} text chunk(s) without logprobs")
    found = (reasoning_name, "".join(reasoning)) if reasoning_name is not None else None
    return "".join(texts), toks, finish, usage, n_content, found


def _clean_usage(usage: Any, acc: AnomalyLog) -> tuple[dict[str, Any] | None, bool]:
    """(usage with checked counts, usage_missing). Counts that are not non-negative ints are
    dropped (``malformed_usage``) so no caller can trip on a hostile value."""
    if not isinstance(usage, dict):
        return None, True
    out = dict(usage)
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        if k in out:
            v = out[k]
            if v is None:
                del out[k]
            elif isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > 10**12:
                acc.add("malformed_usage", None, f"usage.{k} = {str(v)[:40]!r}")
                del out[k]
    missing = not ("prompt_tokens" in out and "completion_tokens" in out)
    return out, missing


# -- main entry point -----------------------------------------------------------------------

def _requested(api: str, request: dict[str, Any]) -> tuple[bool, int]:
    """(logprobs asked?, alternatives asked per token)."""
    if api == "chat":
        asked = bool(request.get("logprobs"))
        k = request.get("top_logprobs") if asked else 0
    else:
        lp = request.get("logprobs")
        asked = lp is not None and lp is not False
        k = lp if asked else 0
    k = k if isinstance(k, int) and not isinstance(k, bool) else 0
    return asked, max(0, k)


def normalize_response(
    api: str,
    request: dict[str, Any] | None,
    response: dict[str, Any] | list[Any] | None = None,
    response_text: str | None = None,
    stream: bool = False,
    *,
    choice: int = 0,
    max_top_logprobs: int | None = None,
) -> NormalizedResponse:
    """Normalize one provider response into per-token records plus anomalies. Never raises.

    Args:
        api: ``"chat"`` (``/v1/chat/completions``) or ``"completions"`` (``/v1/completions``).
        request: the JSON body that was sent (temperature, logprobs/top_logprobs, echo, prompt).
        response: the decoded JSON body (a list of chunk dicts when ``stream``), or ``None``.
        response_text: the raw body when ``response`` is ``None`` (non-strict JSON such as
            ``-Infinity`` is accepted; for ``stream`` the SSE text).
        stream: whether the body is a server-sent-events stream.
        choice: which choice to normalize (``n > 1``).
        max_top_logprobs: the provider's cap on alternatives, if known (``top_logprobs_short``
            is not reported when the provider returned its cap).

    Returns:
        :class:`NormalizedResponse`; the text is ``""`` and ``tokens`` empty when nothing usable
        came back (the anomalies say why).
    """
    acc = AnomalyLog()
    request = request if isinstance(request, dict) else {}
    if api not in ("chat", "completions"):
        acc.add("malformed_response", None, f"unknown api {api!r}")
        return NormalizedResponse(text="", n_tokens=None, tokens=[], anomalies=list(acc.anomalies), anomaly_details=acc.details)
    asked, k_req = _requested(api, request)
    acc.keep_alternatives = k_req + 1 if asked else MAX_UNASKED_ALTERNATIVES + 1  # +1: the chosen token (vLLM lists it)
    temperature = as_float(request.get("temperature"))
    greedy = temperature is not None and temperature == 0.0

    body: Any = response
    events: list[Any] | None = None
    if body is None and response_text is not None:
        if stream and looks_like_plain_json(response_text):
            stream = False  # the server ignored stream=true and answered with a plain JSON body
        if stream:
            sse = parse_sse(response_text)
            events = list(sse.events)
            for detail in sse.malformed:
                acc.add("malformed_json", None, f"SSE {detail}")
            for idx, sse_err in sse.errors:
                acc.add("provider_error", None, f"SSE event {idx}: {sse_err.describe()}")
            if not sse.done:
                acc.add("truncated_stream", None, f"{len(events)} events, no data: [DONE]")
        else:
            try:
                body = loads_json(response_text)
            except ValueError as exc:
                acc.add("malformed_json", None, str(exc)[:200])
                body = None
    elif stream and isinstance(body, list):
        events = body
        for idx, ev in enumerate(events):
            ev_err = find_error(ev)
            if ev_err is not None:
                acc.add("provider_error", None, f"SSE event {idx}: {ev_err.describe()}")
    elif stream and isinstance(body, dict):
        chs0 = body.get("choices")
        is_chunk = str(body.get("object", "")).endswith("chunk") or (
            isinstance(chs0, list) and any(isinstance(c, dict) and "delta" in c for c in chs0)
        )
        if is_chunk:
            events = [body]  # one decoded stream chunk
        else:
            stream = False  # a decoded plain body passed for a streamed request

    text: str | None = None
    raw: list[RawToken] | None = None
    finish = None
    usage = None
    reasoning_found: tuple[str, str] | None = None
    if events is not None:
        text, raw, finish, usage, n_content, reasoning_found = _assemble_stream(api, events, choice, acc, asked)
        if n_content == 0 and "provider_error" not in acc.anomalies:
            acc.add("malformed_response", None, f"stream has no content events for choice {choice} ({len(events)} events)")
        elif not text and not raw and finish is None and not {"provider_error", "truncated_stream"} & set(acc.anomalies):
            acc.add("empty_stream", None, f"choice {choice}: {n_content} events without content or finish_reason")
    elif isinstance(body, dict):
        err = find_error(body)
        if err is not None:
            acc.add("provider_error", None, err.describe())
        chs = body.get("choices")
        usage = body.get("usage")
        ch = None
        if isinstance(chs, list):
            ch = next((c for c in chs if isinstance(c, dict) and c.get("index", 0) == choice), None)
            if ch is None and len(chs) > choice and isinstance(chs[choice], dict):
                ch = chs[choice]
        if ch is None:
            if err is None:
                acc.add("malformed_response", None, "no choices")
        else:
            finish = ch.get("finish_reason")
            if api == "chat":
                m = ch.get("message")
                msg = m if isinstance(m, dict) else {}
                text = msg.get("content") if isinstance(msg.get("content"), str) else None
                reasoning_found = reasoning_field(msg)
            else:
                text = ch.get("text") if isinstance(ch.get("text"), str) else None
            raw = logprobs_entries(ch.get("logprobs"), acc)
            if not text and not raw and finish is None:
                acc.add("empty_answer", None, f"choice {choice}: no content and no finish_reason")
    elif body is not None:
        acc.add("malformed_response", None, f"body is a {type(body).__name__}, not an object")
    usage, usage_missing = _clean_usage(usage, acc)

    # -- echo: split prompt tokens off (legacy completions) --
    prompt_raw: list[RawToken] = []
    if api == "completions" and request.get("echo") and asked:
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            if raw and text is not None:
                raw = _drop_zero_width_lead(raw, text)
            split = _echo_split(raw, text, prompt) if text is not None and text.startswith(prompt) and raw else None
            if split:
                prompt_raw, raw = raw[:split], raw[split:]  # type: ignore[index]
                text = text[len(prompt):]  # type: ignore[index]
            else:
                acc.add("echo_ignored", None, "echo=true but no prompt tokens came back")
                if text is not None and text.startswith(prompt):
                    text = text[len(prompt):]

    if not raw and asked and (text or (reasoning_found is not None and reasoning_found[1])):
        acc.add("missing_logprobs", None, "logprobs asked, none returned")
        raw = None  # no per-token data: n_tokens falls back to usage

    if reasoning_found is not None and text is None:
        text = ""  # a reasoning model cut off inside its reasoning: content null, the answer is empty
    text_known = text is not None
    if text is None:
        text = ""
    layout = reasoning_layout(raw or [], reasoning_found, text if text_known else None, acc)
    toks = build_tokens(raw or [], layout.target, acc, k_req, max_top_logprobs, greedy, stream, 0)
    label_spans(toks, layout)
    ptoks = build_tokens(prompt_raw, None, AnomalyLog(), 0, None, False, False, 0, prompt=True) if prompt_raw else []

    if not text_known and toks:
        text = b"".join(t.bytes or b"" for t in toks).decode("utf-8", errors="replace")

    if raw is not None:
        n_tokens: int | None = len(toks)
    else:
        ct = usage.get("completion_tokens") if isinstance(usage, dict) else None
        n_tokens = ct if isinstance(ct, int) and not isinstance(ct, bool) else None
    return NormalizedResponse(
        text=text,
        n_tokens=n_tokens,
        tokens=toks,
        anomalies=list(acc.anomalies),
        finish_reason=finish if isinstance(finish, str) else None,
        usage=usage,
        prompt_tokens=ptoks,
        anomaly_details=acc.details,
        usage_missing=usage_missing,
        reasoning=layout.reasoning,
        reasoning_source=layout.source,
        reasoning_coverage=layout.coverage if toks else None,
    )


def _offsets_usable(raw: list[RawToken]) -> bool:
    """``text_offset`` values can be trusted: all present, monotonic, starting at 0 (echo), and
    each step equal to the previous token's length in characters (a token spelled as partial
    bytes may advance by 0 or 1 character)."""
    offs = [t.offset for t in raw]
    if not offs or any(o is None for o in offs) or offs[0] != 0:
        return False
    for t, a, b in zip(raw, offs, offs[1:], strict=False):
        step = b - a  # type: ignore[operator]
        if step < 0:
            return False
        lengths = {len(t.token)}
        for rec in (byte_spelling(t.token), gpt2_unicode_to_bytes(t.token)):
            if rec is not None:
                lengths.add(len(rec.decode("utf-8", errors="ignore")))
                if rec.decode("utf-8", errors="ignore").encode() != rec:
                    lengths.update((0, 1))  # a partial character
        if step not in lengths:
            return False
    return True


def _drop_zero_width_lead(raw: list[RawToken], text: str) -> list[RawToken]:
    """``raw`` without leading special tokens that spell no text of an echoed answer.

    Engines that prepend a BOS token to a completions prompt (gemma's ``<bos>``, Llama's ``<s>``)
    echo it as the first prompt token with logprob null and ``text_offset`` 0, while the answer's
    ``text`` starts with the prompt itself (vLLM, the simulator). Such a token occupies no
    characters: its string is not where ``text`` starts, and the next token's offset is still 0
    (or, without offsets, the next token's string is where ``text`` starts).
    Counted as text it would shift every echoed token by its length (a false split or an echo
    reported as ignored); it carries no evidence (no logprob), so it is dropped here."""
    i = 0
    while (i + 1 < len(raw) and raw[i].lp is None and raw[i].token and not text.startswith(raw[i].token)
           and ((raw[i].offset == 0 and raw[i + 1].offset == 0)
                or (raw[i].offset is None and raw[i + 1].token != "" and text.startswith(raw[i + 1].token)))):
        i += 1
    return raw[i:] if i else raw


def _echo_split(raw: list[RawToken], text: str, prompt: str) -> int | None:
    """Number of leading tokens that spell ``prompt`` in an echoed answer ``text``, or ``None``.

    First the text-guided byte assignment over the whole echoed text (exact when it is
    unambiguous), then ``text_offset`` when usable (:func:`_offsets_usable`), then a plain
    count of the tokens' given bytes."""
    target = len(prompt.encode("utf-8"))
    tb = text.encode("utf-8", errors="surrogatepass")
    assigned = assign_bytes([candidates(t.token, t.given, "\ufffd" in text) for t in raw], tb)
    if assigned is not None and all(b is not None for b in assigned[0]):
        pos = 0
        for i, b in enumerate(assigned[0]):
            if pos == target:
                return i
            pos += len(b)  # type: ignore[arg-type]
        if pos == target:
            return len(raw)
    if _offsets_usable(raw):
        return sum(1 for t in raw if t.offset is not None and t.offset < len(prompt))  # all set when usable
    pos = 0
    for i, t in enumerate(raw):
        if pos == target:
            return i
        pos += len(t.given if t.given is not None else t.token.encode("utf-8", errors="surrogatepass"))
    return len(raw) if pos == target else None
