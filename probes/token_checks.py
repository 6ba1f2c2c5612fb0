"""Raw per-token entries → :class:`probes.records.TokenRecord`: each token's authoritative bytes
(recovered through the answer text, :mod:`probes.byte_recovery`) and its checked logprobs, with the
per-token anomaly flags (kinds and thresholds: :mod:`probes.anomalies`; the rules: :mod:`probes.normalize`).

Never raises; every float in a record is finite or None.
"""

from __future__ import annotations

import math

from probes.anomalies import MASKED_THRESHOLD, MASS_TOL, POSITIVE_TOL, AnomalyLog, as_float, classify_logprob
from probes.byte_recovery import (
    FFFD as _FFFD,
)
from probes.byte_recovery import (
    SPELLED as _SPELLED,
)
from probes.byte_recovery import (
    alt_bytes,
    assign_bytes,
    candidates,
    lossy_text_consistent,
)
from probes.logprob_entries import RawToken
from probes.records import TokenRecord

__all__ = ["build_tokens"]


def _tok_key(tok: str, b: bytes | None) -> bytes:
    return b if b is not None else tok.encode("utf-8", errors="surrogatepass")


def build_tokens(
    raw: list[RawToken],
    text: str | None,
    acc: AnomalyLog,
    k_req: int,
    cap: int | None,
    greedy: bool,
    stream: bool,
    start_index: int,
    prompt: bool = False,
) -> list[TokenRecord]:
    """One :class:`TokenRecord` per entry of ``raw`` (indices from ``start_index``), anomalies logged in ``acc``.

    Args:
        text: the text the bytes are recovered against (None: no text guides them).
        k_req: alternatives asked per token; ``cap``: the provider's cap, if known.
        greedy: temperature 0 was asked; ``stream``: the entries came from a stream.
        prompt: echoed prompt tokens (the first has no logprob; no top-k checks).
    """
    if not raw:
        return []
    n = len(raw)
    per_tok: list[dict[str, None]] = [dict() for _ in range(n)]

    def flag(i: int, kind: str, detail: str = "") -> None:
        per_tok[i].setdefault(kind, None)
        acc.add(kind, start_index + i, detail)

    # ---- bytes ----
    text_bytes = text.encode("utf-8", errors="surrogatepass") if text is not None else None
    has_fffd = text is not None and "\ufffd" in text
    cands = [candidates(t.token, t.given, has_fffd or text is None) for t in raw]
    assigned = assign_bytes(cands, text_bytes) if text_bytes is not None else None
    token_bytes: list[bytes | None]
    recovery_kind: str | None = None
    spelled = False  # the server spells partial characters as byte escapes (a convention, no anomaly)
    if assigned is not None:
        token_bytes, kinds = assigned
        for i, kd in enumerate(kinds):
            if kd == _SPELLED:
                spelled = True
            elif kd is not None:
                flag(i, kd, f"token {raw[i].token!r}")
                if kd in ("surrogate_token_strings", "spm_token_strings"):
                    recovery_kind = recovery_kind or kd
        if any(b is None for b in token_bytes):
            acc.add("bytes_text_mismatch", None, "token bytes ambiguous or unrecoverable")
    elif has_fffd and all(t.given is not None and _FFFD not in t.given for t in raw) and lossy_text_consistent(
        b"".join(t.given for t in raw if t.given is not None), text or ""
    ):
        # the runtime's text lost split characters to U+FFFD in its own grouping; every token's
        # bytes field is valid and agrees with the text everywhere else: keep the bytes
        token_bytes = [t.given for t in raw]
        acc.add("replacement_char_text", None, "text carries U+FFFD where the tokens' bytes hold valid characters")
    else:
        token_bytes = []
        for i, t in enumerate(raw):
            tb = t.given if t.given is not None else t.token.encode("utf-8", errors="surrogatepass")
            if _FFFD in tb and not has_fffd and text is not None:
                flag(i, "replacement_char_bytes", f"token {t.token!r}")
                token_bytes.append(None)
            else:
                token_bytes.append(tb)
        if text_bytes is not None:
            known = b"".join(b for b in token_bytes if b is not None)
            detail = "" if known == text_bytes else f"tokens give {known[:60]!r}, text is {text_bytes[:60]!r}"
            acc.add("bytes_text_mismatch", None, detail or "unrecoverable token bytes")

    # ---- logprobs ----
    records: list[TokenRecord] = []
    zero_with_mass: list[bool] = []
    for i, t in enumerate(raw):
        lp, kind, rawf = classify_logprob(t.lp)
        if prompt and i == 0 and t.lp is None:
            kind = None  # the first echoed prompt token has no logprob by definition
        elif kind == "padded_inf":
            kind = "nonfinite_logprob"
        if kind is not None:
            flag(i, kind, f"chosen logprob {t.lp!r}")
        alts: list[tuple[str, bytes | None, float | None]] = []
        padded = 0
        for atok, abytes, alp in t.top:
            v, akind, _ = classify_logprob(alp)
            if akind == "padded_inf":
                padded += 1
            elif akind in ("sentinel_logprob", "masked_logit", "positive_logprob"):
                flag(i, akind, f"alternative {atok!r} logprob {alp!r}")
            ab = alt_bytes(atok, abytes, recovery_kind, spelled)
            keep = not (_FFFD in ab and text is not None and "\ufffd" not in text)
            alts.append((atok, ab if keep else None, v))
        if padded:
            flag(i, "top_logprobs_padded", f"{padded} alternative(s) at -inf")
        if t.excess:
            flag(i, "top_logprobs_excess", f"{len(t.top) + t.excess} alternatives listed, {k_req} asked: {t.excess} dropped")
        finite = [a for a in alts if a[2] is not None]
        if not prompt and k_req > 0:
            # listed with a finite number (a positive or sentinel value is listed but unusable;
            # masked logits count as -inf)
            n_listed = sum(1 for _, _, v in t.top if (f := as_float(v)) is not None and math.isfinite(f) and f > MASKED_THRESHOLD)
            want = k_req if cap is None else min(k_req, cap)
            if n_listed < want:
                flag(i, "top_logprobs_short", f"{n_listed} finite of {k_req} asked")
        # chosen vs alternatives
        ckey = _tok_key(t.token, token_bytes[i])
        ckey_raw = t.token
        in_top = [a for a in alts if a[0] == ckey_raw or (a[1] is not None and a[1] == ckey)]
        others = [a for a in finite if not (a[0] == ckey_raw or (a[1] is not None and a[1] == ckey))]
        mass = sum(math.exp(v) for _, _, v in finite if v is not None)  # `finite` holds no None
        if finite and mass > 1.0 + MASS_TOL:
            flag(i, "mass_exceeds_one", f"listed mass {mass:.4f}")
        other_mass = sum(math.exp(v) for _, _, v in others if v is not None)
        zwm = rawf == 0.0 and other_mass > MASS_TOL
        zero_with_mass.append(zwm)
        if not prompt and alts and not in_top:
            min_alt = min((v for _, _, v in finite if v is not None), default=None)
            belongs = greedy or (lp is not None and min_alt is not None and lp > min_alt + POSITIVE_TOL)
            if belongs:
                flag(i, "chosen_not_in_top", f"chosen {t.token!r} not among {len(alts)} alternatives")
        if not prompt and greedy and finite:
            top1 = max(finite, key=lambda a: a[2])  # type: ignore[arg-type, return-value]
            is_top1 = top1[0] == ckey_raw or (top1[1] is not None and top1[1] == ckey)
            chosen_v = in_top[0][2] if in_top and in_top[0][2] is not None else lp
            tie = chosen_v is not None and abs(chosen_v - top1[2]) <= POSITIVE_TOL  # type: ignore[operator]
            if not is_top1 and not tie:
                flag(i, "greedy_not_argmax", f"chosen {t.token!r}, top-1 {top1[0]!r} at {top1[2]}")
        if zwm:
            lp = None
        records.append(
            TokenRecord(index=start_index + i, token=t.token, bytes=token_bytes[i], logprob=lp, top_logprobs=alts, anomalies=[], raw_logprob=rawf)
        )
    # ---- runs and streams ----
    i = 0
    while i < n:
        if zero_with_mass[i]:
            j = i
            while j < n and zero_with_mass[j]:
                j += 1
            if j - i >= 2:
                for m in range(i, j):
                    flag(m, "zero_logprob_run", f"{j - i} consecutive 0.0 logprobs from token {i}")
            i = j
        else:
            i += 1
    if stream and not prompt:
        seen: list[tuple[tuple[tuple[str, float | None], ...], bytes]] = []
        for i, t in enumerate(raw):
            if not t.top:
                continue
            sig = tuple((a, as_float(v)) for a, _, v in t.top)
            ck = _tok_key(t.token, token_bytes[i])
            if any(s == sig and c != ck for s, c in seen):
                flag(i, "duplicate_stream_top_logprobs", f"token {t.token!r} repeats an earlier token's alternatives")
            seen.append((sig, ck))
    for i, r in enumerate(records):
        r.anomalies = list(per_tok[i])
    return records
