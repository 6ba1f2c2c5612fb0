"""Parameter-compliance pre-flight: cheap requests that check the provider honours the request.

Vendor verifiers check a provider's decoding parameters before any accuracy test (issue 13); an
audit that skips this can blame the model for what the sampler did, or the weights for what the
chat template did. :func:`run_preflight` sends a few small requests (nine, about 450 completion
tokens) and :func:`evaluate_preflight` turns the answers into named checks:

===================  =====================================================================  ==========
check                what passes                                                            kind
===================  =====================================================================  ==========
``t0-determinism``   two identical temperature-0 requests return the same tokens           parameter
``seed``             two temperature-1 requests with the same ``seed`` return the same      parameter
                     tokens
``max-tokens``       ``max_tokens=4`` returns at most 4 tokens                              parameter
``stop``             a ``stop`` string taken from the greedy answer ends the answer before  parameter
                     it and never appears in it
``greedy-top1``      at temperature 0 every emitted token is the provider's own reported    decoding
                     top-1 (beyond a 0.01-nat tie band)                                     (tested)
``top-p``            at temperature 1 with ``top_p=1`` (no ``top_k``) the sampled tokens    decoding
                     fall in the provider's own low-probability region as often as its      (tested)
                     reported probabilities say (no server-side top-k / top-p / min-p)
``prompt-tokens``    ``usage.prompt_tokens`` equals the reference tokenizer's count for     template
                     the same rendered prompt (else another chat template or an injected
                     system prompt)
===================  =====================================================================  ==========

The two *decoding* checks are statistical tests with p-values; they join the audit's Holm family
as ``preflight-greedy-top1`` and ``preflight-top-p`` DetectorResults (``auditor.verdict.decide`` rule 6
and ``secondary_causes``). The *parameter* checks are reported as named evidence (a GPU provider
may be legitimately nondeterministic; OpenAI documents ``seed`` as best effort) and never change
the verdict. A *template* mismatch makes the verdict set the reference comparisons aside
(``decide_verdict(template_mismatch=...)``): a template difference is never turned into
QUANTIZATION or SUBSTITUTION.

``top-p`` test: at each sampled position the provider reports its top-N alternatives. Let p_max
be the largest reported probability, p_N the smallest, and c = max(p_N, 0.1 p_max). The region R
is every token except the listed ones with probability >= c (so every unlisted token, whose
probability is <= p_N <= c, is in R); under an honest sampler the emitted token falls in R with
probability tau = 1 - sum of the listed probabilities >= c, computable from the provider's own
numbers. A top-k <= N removes R's unlisted part, a min-p >= 0.1 removes all of R, a top-p < 1
removes its least likely tokens first. The count of emissions in R is compared with the
Poisson-binomial law of the tau's (one-sided, exact by convolution): too few = truncation. The
same test runs on the unlisted part alone (rank > N, any top-k <= N empties it), and the check's
p-value is the Bonferroni minimum of the two. (The positions of one answer are not independent,
but each tau is the conditional probability given the prefix, so the count minus the sum of the
tau's is a martingale and the Poisson-binomial law is its usual approximation.)
Sources: OpenAI API reference (``seed``, ``stop``, ``max_tokens``, ``top_p``, ``logprobs``);
llama.cpp sampler chain defaults (``top_k=40``, ``top_p=0.95``, ``min_p=0.05``,
``repeat_penalty=1.1`` in llama-cpp-python's server, docs/real-engines.md).

``greedy-top1`` test: exact binomial test of the count of contradictions (own top-1 logprob minus
the emitted token's logprob > GREEDY_TIE_BAND nats) against the honest rate GREEDY_R0 (reported
logprobs and the greedy pick come from the same forward pass, so honest engines have none).

Stored with the run in ``audit_runs.summary["preflight"]`` (:meth:`PreflightReport.to_dict`:
checks, and each request with the provider's answer, bodies capped at STORED_BODY_CHARS).
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from auditor.detectors import PREFLIGHT_CHECKS
from auditor.detectors.base import DetectorResult, not_run
from auditor.util import finite
from probes.config import ProviderConfig
from probes.conventions import RANKED, LogprobConvention, certified_top, learn_convention, requested_top_logprobs
from probes.normalize import normalize_response
from probes.reasoning import think_tag_positions
from probes.records import NormalizedResponse

__all__ = [
    "GREEDY_R0",
    "GREEDY_TIE_BAND",
    "PreflightCheck",
    "PreflightContext",
    "PreflightReport",
    "evaluate_preflight",
    "plan_preflight",
    "poisson_binomial_cdf",
    "preflight_stage",
    "provider_failures",
    "run_preflight",
]

#: Nats by which the emitted token may trail the own top-1 at T=0 (ties, rounding of reported logprobs).
GREEDY_TIE_BAND = 0.01
#: Honest rate of greedy contradictions (the null of the binomial test).
GREEDY_R0 = 1e-3
#: Region threshold relative to the top probability (min-p style), see the module docstring.
REGION_REL = 0.1
#: Characters of an answer body kept when it is not JSON (a decoded JSON body is kept whole up to
#: MAX_STORED_JSON_CHARS; a larger one is dropped and the exchange marked ``truncated_body``).
STORED_BODY_CHARS = 20_000
MAX_STORED_JSON_CHARS = 2_000_000
#: Completion tokens of the greedy and sampled pre-flight requests.
PREFLIGHT_MAX_TOKENS = 64
#: Seed of the sampled pre-flight requests.
PREFLIGHT_SEED = 1234

_STORY = [{"role": "user", "content": "Write a short story about a cat who finds a key in the garden."}]
_LIST = [{"role": "user", "content": "Name ten animals that live on a farm and say one thing about each."}]
_OPEN = [{"role": "user", "content": "Describe your favourite season and why you like it."}]


@dataclass
class PreflightCheck:
    """One named check.

    Attributes:
        name: ``t0-determinism`` | ``seed`` | ``max-tokens`` | ``stop`` | ``greedy-top1`` |
            ``top-p`` | ``prompt-tokens``.
        kind: ``parameter`` (reported), ``decoding`` (a tested cause) or ``template``.
        passed: True / False, or None when it could not run (``summary`` says why).
        summary: one sentence a buyer understands.
        p_value: the test's p-value (decoding checks), else None.
        statistic: the counted events (contradictions, region emissions), else None.
        n: positions or requests it rests on.
        evidence: JSON-able numbers and examples behind it.
    """

    name: str
    kind: str
    passed: bool | None
    summary: str
    p_value: float | None = None
    statistic: float | None = None
    n: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class PreflightReport:
    """All checks of one pre-flight plus the requests and answers (stored with the run).

    ``convention`` is the provider's logprob convention learned from the answers
    (:meth:`probes.conventions.LogprobConvention.to_dict`; empty when no list came back).
    """

    checks: list[PreflightCheck]
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    convention: dict[str, Any] = field(default_factory=dict)

    def check(self, name: str) -> PreflightCheck | None:
        """The check called ``name``, or None."""
        return next((c for c in self.checks if c.name == name), None)

    @property
    def failed(self) -> list[PreflightCheck]:
        """Checks that ran and failed."""
        return [c for c in self.checks if c.passed is False]

    def template_mismatch(self) -> dict[str, Any] | None:
        """``{provider_prompt_tokens, reference_prompt_tokens}`` when the prompt-token check failed."""
        c = self.check("prompt-tokens")
        if c is None or c.passed is not False:
            return None
        return {k: c.evidence.get(k) for k in ("provider_prompt_tokens", "reference_prompt_tokens", "api")}

    def detector_results(self, alpha_note: str = "") -> list[DetectorResult]:
        """The decoding checks that join the verdict's Holm family, as DetectorResults: one per entry of
        the registry's :data:`auditor.detectors.PREFLIGHT_CHECKS` (``preflight-greedy-top1``,
        ``preflight-top-p``), each named ``preflight-<check name>``."""
        out = []
        for dname in PREFLIGHT_CHECKS:
            c = self.check(dname.removeprefix("preflight-"))
            if c is None or c.p_value is None:
                out.append(not_run(dname, c.summary if c is not None else "pre-flight not run"))
                continue
            ev = c.evidence
            # the effect is the check's rate or observed/expected ratio; a ratio with nothing expected is
            # stored as None (JSON), and stays undefined (NaN) here
            eff = finite(ev.get("rate", ev.get("ratio")))
            eff = float("nan") if eff is None else eff
            out.append(DetectorResult(
                dname, float(c.statistic or 0.0), float(c.p_value), eff, (eff, eff), int(c.n),
                list(ev.get("examples", []))[:5], details={k: v for k, v in ev.items() if k != "examples"},
            ))
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able record (``from_dict`` inverts it)."""
        return {"checks": [asdict(c) for c in self.checks], "exchanges": self.exchanges,
                "failed": [c.name for c in self.failed], "convention": self.convention}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PreflightReport:
        """Inverse of :meth:`to_dict` (unknown keys ignored)."""
        names = set(PreflightCheck.__dataclass_fields__)
        return cls([PreflightCheck(**{k: v for k, v in c.items() if k in names}) for c in d.get("checks", [])],
                   list(d.get("exchanges", [])), dict(d.get("convention") or {}))


# ------------------------------------------------------------------------------------------ plan
def plan_preflight(config: ProviderConfig, max_tokens: int = PREFLIGHT_MAX_TOKENS) -> list[tuple[str, dict[str, Any]]]:
    """The pre-flight requests ``(key, body)`` for ``config`` (non-streaming). Pure.

    ``max_tokens``: completion tokens of the greedy and sampled requests (>= 8).

    Keys: ``greedy-a``/``greedy-b`` (same T=0 request twice), ``greedy-c`` (another T=0 prompt),
    ``seed-a``/``seed-b`` (T=1, top_p=1, same seed), ``sample-c``/``sample-d`` (T=1, other seeds),
    ``max-tokens`` (T=0, max_tokens=4). The ``stop`` request depends on ``greedy-a``'s answer
    (:func:`stop_request`).
    """
    caps = config.capabilities
    k = min(20, caps.max_top_logprobs) if caps.logprobs else 0

    if max_tokens < 8:
        raise ValueError(f"max_tokens={max_tokens}: the pre-flight needs at least 8 tokens per request")
    default_max = max_tokens

    def body(messages: list[dict[str, Any]], *, temperature: float, max_tokens: int = default_max,
             seed: int | None = None, top_p: float | None = None) -> dict[str, Any]:
        b: dict[str, Any] = {"model": config.model, "max_tokens": max_tokens, "temperature": temperature}
        if config.api == "chat":
            b["messages"] = messages
            if k:
                b["logprobs"] = True
                b["top_logprobs"] = k
        else:
            b["prompt"] = messages[0]["content"]
            if k:
                b["logprobs"] = k
        if top_p is not None:
            b["top_p"] = top_p
        if seed is not None:
            b["seed"] = seed
        config.enforced.apply(b)  # the provider's fixed values, no rejected field (issue 35 item 4)
        b.update(config.extra_body)
        return b

    return [
        ("greedy-a", body(_STORY, temperature=0.0)),
        ("greedy-b", body(_STORY, temperature=0.0)),
        ("greedy-c", body(_LIST, temperature=0.0)),
        ("seed-a", body(_OPEN, temperature=1.0, top_p=1.0, seed=PREFLIGHT_SEED)),
        ("seed-b", body(_OPEN, temperature=1.0, top_p=1.0, seed=PREFLIGHT_SEED)),
        ("sample-c", body(_STORY, temperature=1.0, top_p=1.0, seed=PREFLIGHT_SEED + 1)),
        ("sample-d", body(_LIST, temperature=1.0, top_p=1.0, seed=PREFLIGHT_SEED + 2)),
        ("max-tokens", body(_LIST, temperature=0.0, max_tokens=4)),
    ]


def stop_string(text: str) -> str | None:
    """A stop string from a greedy answer: the first word of >= 4 letters after a third of it."""
    start = len(text) // 3
    for i in range(start, len(text)):
        if text[i] == " " and i + 5 <= len(text):
            word = text[i:].split()[0] if text[i:].split() else ""
            if len(word) >= 4 and word.isalpha():
                return " " + word
    return None


def stop_request(greedy_body: dict[str, Any], text: str) -> dict[str, Any] | None:
    """The ``stop`` request: the greedy request again with ``stop`` = :func:`stop_string` of its answer."""
    s = stop_string(text)
    if s is None:
        return None
    return {**greedy_body, "stop": [s]}


# ------------------------------------------------------------------------------------------ run
async def _send_all(config: ProviderConfig, transport: Any, api_key: str | None, max_tokens: int) -> list[dict[str, Any]]:
    from probes.client import ProbeClient

    out: list[dict[str, Any]] = []
    async with ProbeClient(config, transport=transport, api_key=api_key, max_attempts=2) as client:
        jobs = plan_preflight(config, max_tokens)
        for key, body in jobs:
            out.append(_exchange(key, body, await client.send(body, key=key, stream=False)))
        ga = next((e for e in out if e["key"] == "greedy-a"), None)
        sb = stop_request(jobs[0][1], ga.get("text") or "") if ga and ga.get("ok") else None
        if sb is not None:
            out.append(_exchange("stop", sb, await client.send(sb, key="stop", stream=False)))
    return out


def _exchange(key: str, body: dict[str, Any], res: Any) -> dict[str, Any]:
    text = res.response_text or ""
    keep_json = res.json is not None and len(text) <= MAX_STORED_JSON_CHARS
    return {"key": key, "request": body, "ok": bool(res.success), "error": res.error,
            "error_kind": res.error_kind, "http_status": res.http_status, "text": res.text,
            "finish_reason": res.finish_reason, "usage": res.usage,
            "response_text": None if keep_json else text[:STORED_BODY_CHARS],
            "truncated_body": not keep_json and len(text) > STORED_BODY_CHARS,
            "json": res.json if keep_json else None}


def run_preflight(config: ProviderConfig, tokenizer: Any = None, *, transport: Any = None,
                  api_key: str | None = None, max_tokens: int = PREFLIGHT_MAX_TOKENS) -> PreflightReport:
    """Send the pre-flight requests to ``config``'s provider and evaluate them.

    Args:
        config: the provider. tokenizer: the reference tokenizer (prompt-token check; None skips it).
        transport: an ``httpx.AsyncBaseTransport`` (tests). api_key: overrides the config's env var.
        max_tokens: completion tokens per greedy/sampled request (see :func:`plan_preflight`).

    Never raises on provider errors: a request that fails leaves its checks not run, with the
    error named. Must not be called from a running event loop (it runs its own).
    """
    exchanges = asyncio.run(_send_all(config, transport, api_key, max_tokens))
    return evaluate_preflight(config.api, exchanges, tokenizer, getattr(config, "reasoning_opener", None))


# ------------------------------------------------------------------------------------------ evaluate
def _norm(api: str, ex: dict[str, Any] | None) -> NormalizedResponse | None:
    if ex is None or not ex.get("ok") or ex.get("truncated_body"):
        return None
    return normalize_response(api, ex["request"], response=ex.get("json"),
                              response_text=None if ex.get("json") is not None else ex.get("response_text"))


def _ids(n: NormalizedResponse) -> list[str]:
    return [t.token for t in n.tokens] if n.tokens else [n.text]


def poisson_binomial_cdf(k: int, probs: Sequence[float]) -> float:
    """P(X <= k) for X = sum of independent Bernoulli(p_i) (exact, O(n^2) convolution)."""
    dist = np.zeros(len(probs) + 1)
    dist[0] = 1.0
    for i, p in enumerate(probs):
        p = min(1.0, max(0.0, float(p)))
        dist[1 : i + 2] = dist[1 : i + 2] * (1 - p) + dist[0 : i + 1] * p
        dist[0] *= 1 - p
    return float(min(1.0, dist[: max(0, k) + 1].sum())) if k >= 0 else 0.0


#: Per-token anomalies (``probes.normalize``) that make a logprob unusable (it is then None).
_UNUSABLE_LOGPROB = {"nonfinite_logprob": "NaN or infinite", "positive_logprob": "positive",
                     "sentinel_logprob": "placeholder", "masked_logit": "masked-logit"}


def _unusable(norms: Sequence[NormalizedResponse]) -> str | None:
    """Why a decoding check could not run although its requests were answered (issue 37 item 6): tokens came
    back, but their logprobs were unusable — "could not run: logprobs unusable (...)"; None when no token
    carried such an anomaly (then nothing was answered with logprobs, or the request failed)."""
    toks = [t for r in norms for t in r.tokens]
    kinds = sorted({_UNUSABLE_LOGPROB[a] for t in toks for a in t.anomalies if a in _UNUSABLE_LOGPROB})
    if not kinds:
        return None
    bad = sum(1 for t in toks if t.logprob is None)
    return (f"could not run: logprobs unusable — {len(norms)} requests answered, but {bad} of their {len(toks)} "
            f"tokens came back with {' / '.join(kinds)} logprobs")


def _greedy_check(norms: Sequence[NormalizedResponse]) -> PreflightCheck:
    n = k = 0
    examples: list[dict[str, Any]] = []
    spans: dict[str, dict[str, float]] = {}  # a reasoning model's answer, per span (issue 35): positions, flips
    for resp in norms:
        tags = think_tag_positions(resp.tokens)  # possibly forced by a thinking budget: no sample
        for i, t in enumerate(resp.tokens):
            alts = [lp for (_s, _b, lp) in t.top_logprobs if lp is not None]
            if t.logprob is None or not alts or i in tags:
                continue
            n += 1
            gap = max(alts) - t.logprob
            if t.span in ("reasoning", "answer"):
                sp = spans.setdefault(t.span, {"positions": 0, "flips": 0, "expected": 0.0})
                sp["positions"] += 1
                sp["flips"] += int(gap > GREEDY_TIE_BAND)
                sp["expected"] += GREEDY_R0
            if gap > GREEDY_TIE_BAND:
                k += 1
                if len(examples) < 5:
                    top = max(((a[0], a[2]) for a in t.top_logprobs if a[2] is not None), key=lambda a: a[1])
                    examples.append({"position": t.index, "emitted": t.token, "emitted_logprob": t.logprob,
                                     "own_top1": top[0], "own_top1_logprob": top[1], "gap": gap})
    if n == 0:
        return PreflightCheck("greedy-top1", "decoding", None,
                              _unusable(norms) or "no temperature-0 token with logprobs came back")
    p = float(stats.binom.sf(k - 1, n, GREEDY_R0)) if k else 1.0
    ok = p > 1e-3
    summary = (f"at temperature 0 every emitted token was the provider's own top-1 ({n} positions)" if k == 0 else
               f"at temperature 0 the provider emitted a token other than its own top-1 at {k} of {n} positions "
               "(its greedy path applies something the request did not ask for, e.g. a repetition penalty)")
    return PreflightCheck("greedy-top1", "decoding", ok if k else True, summary, p, float(k), n,
                          {"rate": k / n, "band_nats": GREEDY_TIE_BAND, "r0": GREEDY_R0, "examples": examples,
                           **({"spans": spans} if "reasoning" in spans else {})})


def _region_counts(norms: Sequence[NormalizedResponse], convention: LogprobConvention = RANKED,
                   ) -> tuple[list[tuple[float, float]], list[tuple[int, int]], list[dict[str, Any]]]:
    """Per sampled position: (tau_unlisted, tau_low) and whether the emitted token fell in each region.

    The listed set is the position's certified top-m under ``convention``
    (:func:`probes.conventions.certified_top`): with vLLM's sampled-first lists the sampled token is
    always listed, so only the best entries, fixed whatever was drawn, may define the regions."""
    taus: list[tuple[float, float]] = []
    hits: list[tuple[int, int]] = []
    examples: list[dict[str, Any]] = []
    for resp in norms:
        tags = think_tag_positions(resp.tokens)
        for i, t in enumerate(resp.tokens):
            alts = [(s, lp) for (s, _b, lp) in certified_top(t.top_logprobs, convention)]
            if t.logprob is None or len(alts) < 2 or i in tags:
                continue
            ps = [math.exp(lp) for _s, lp in alts]
            p_emit = math.exp(t.logprob)
            listed = {s for s, _lp in alts}
            c = max(min(ps), REGION_REL * max(max(ps), p_emit))
            kept = {s for (s, _lp), p in zip(alts, ps, strict=True) if p >= c}
            tau_u = min(1.0, max(0.0, 1.0 - sum(ps)))
            tau_l = min(1.0, max(0.0, 1.0 - sum(p for p in ps if p >= c)))
            in_u = t.token not in listed
            in_l = t.token not in kept or p_emit < c
            taus.append((tau_u, tau_l))
            hits.append((int(in_u), int(in_l)))
            if in_l and len(examples) < 5:
                examples.append({"position": t.index, "emitted": t.token, "emitted_logprob": t.logprob,
                                 "region_mass": tau_l, "unlisted": in_u})
    return taus, hits, examples


def _top_p_check(norms: Sequence[NormalizedResponse], convention: LogprobConvention = RANKED) -> PreflightCheck:
    """Two regions (module docstring): unlisted tokens (rank > N: any top-k <= N) and the low region
    (p < max(p_N, 0.1 p_max): min-p, top-p); p = Bonferroni min of the two one-sided tests. The
    listed set follows the provider's ``convention`` (recorded in the evidence)."""
    taus, hits, examples = _region_counts(norms, convention)
    if not taus:
        return PreflightCheck("top-p", "decoding", None, _unusable(norms)
                              or "no temperature-1 token with top_logprobs came back (needs top_logprobs >= 2)")
    obs_u, obs_l = (sum(h[i] for h in hits) for i in (0, 1))
    exp_u, exp_l = (float(sum(t[i] for t in taus)) for i in (0, 1))
    p_u = poisson_binomial_cdf(obs_u, [t[0] for t in taus])
    p_l = poisson_binomial_cdf(obs_l, [t[1] for t in taus])
    p = min(1.0, 2 * min(p_u, p_l))
    ok = p > 1e-3
    summary = (f"at temperature 1 with top_p=1 the sampled tokens reached the provider's own low-probability "
               f"region {obs_l} times ({exp_l:.1f} expected) and its unlisted tokens {obs_u} times ({exp_u:.1f} "
               "expected)" + ("" if ok else
               ": the server truncates sampling (its own top-k / top-p / min-p) although the request asked for none"))
    if exp_u == 0.0:  # a known provider bug: the listed alternatives sum to 1 or more
        summary += ("; the listed alternatives carry all the probability mass at every sampled position, so no "
                    "unlisted token could be expected")
    # the region that decides (the smaller p; on a tie the one with something expected: a ratio needs it)
    obs, exp = (obs_u, exp_u) if (p_u, exp_u == 0.0) <= (p_l, exp_l == 0.0) else (obs_l, exp_l)
    return PreflightCheck("top-p", "decoding", ok, summary, p, float(obs), len(taus),
                          {"observed": obs, "expected": exp, "ratio": obs / exp if exp > 0 else None,
                           "observed_low": obs_l, "expected_low": exp_l, "p_low": p_l,
                           "observed_unlisted": obs_u, "expected_unlisted": exp_u, "p_unlisted": p_u,
                           "region_rel": REGION_REL, "logprob_convention": convention.name,
                           "certified_m": convention.certified_m, "examples": examples})


def _sent(exchange: dict[str, Any] | None, param: str, default: float | None) -> float | None:
    """The value of ``param`` in a stored pre-flight request (``default`` when it was not sent because the
    request does not ask it; None when the provider rejects it: a request asking it was sent without it)."""
    if exchange is None:
        return default
    req = exchange.get("request") or {}
    if param in req:
        v = req[param]
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else default
    return None if param == "temperature" or (param == "seed" and default is None) else default


def _same_check(name: str, a: NormalizedResponse | None, b: NormalizedResponse | None, what: str) -> PreflightCheck:
    if a is None or b is None:
        return PreflightCheck(name, "parameter", None, f"{what}: a request failed, not checked")
    same = _ids(a) == _ids(b)
    diverge = next((i for i, (x, y) in enumerate(zip(_ids(a), _ids(b), strict=False)) if x != y), None)
    return PreflightCheck(name, "parameter", same, f"{what}: " + ("identical answers" if same else
                          f"the answers differ (first at token {diverge if diverge is not None else 'end'})"),
                          n=2, evidence={"first_difference": diverge, "texts": [a.text[:200], b.text[:200]]})


def evaluate_preflight(api: str, exchanges: Sequence[dict[str, Any]], tokenizer: Any = None,
                       reasoning_opener: str | None = None) -> PreflightReport:
    """Checks from the stored pre-flight exchanges (pure; see the module docstring).

    Args:
        api: ``chat`` or ``completions``.
        exchanges: dicts with ``key``, ``request``, ``ok``, ``json``/``response_text``, ``usage``,
            ``finish_reason`` (as :func:`run_preflight` stores them).
        tokenizer: reference tokenizer for the prompt-token count (None: check not run).
    """
    ex = {e["key"]: e for e in exchanges}
    nz = {k: _norm(api, e) for k, e in ex.items()}
    # the provider's enforced parameters (issue 35 item 4) are in the requests as sent (EnforcedParams.apply)
    t_greedy = _sent(ex.get("greedy-a"), "temperature", 0.0)
    no_greedy = None if t_greedy == 0.0 else (
        f"impossible: the provider enforces temperature = {t_greedy:g}, so no request is sampled at temperature 0"
        if t_greedy is not None else "impossible: the provider rejects the temperature parameter (HTTP 400)")
    top_p = _sent(ex.get("seed-a"), "top_p", 1.0)
    no_top_p = None if top_p in (None, 1.0) else (  # a rejected top_p leaves the default: the check tests it
        f"not testable: the provider enforces top_p = {top_p:g} (declared), so no request samples the whole "
        "distribution; the sampling tests use that nucleus as the law")
    seeded = _sent(ex.get("seed-a"), "seed", None) is not None or "seed-a" not in ex
    checks = [
        _same_check("t0-determinism", nz.get("greedy-a"), nz.get("greedy-b"), "two identical temperature-0 requests")
        if no_greedy is None else PreflightCheck("t0-determinism", "parameter", None, f"temperature-0 determinism: {no_greedy}"),
        _same_check("seed", nz.get("seed-a"), nz.get("seed-b"), "two temperature-1 requests with the same seed")
        if seeded else PreflightCheck("seed", "parameter", None, "seed: the provider rejects it (HTTP 400); not sent"),
    ]
    mt = nz.get("max-tokens")
    if mt is None:
        checks.append(PreflightCheck("max-tokens", "parameter", None, "max_tokens=4: the request failed"))
    else:
        n_tok = mt.n_tokens if mt.n_tokens is not None else (mt.usage or {}).get("completion_tokens")
        ok = n_tok is not None and n_tok <= 4
        checks.append(PreflightCheck("max-tokens", "parameter", ok if n_tok is not None else None,
                                     f"max_tokens=4 returned {n_tok} tokens (finish_reason {mt.finish_reason})",
                                     n=1, evidence={"tokens": n_tok, "finish_reason": mt.finish_reason}))
    st, ga, sn = ex.get("stop"), nz.get("greedy-a"), nz.get("stop")
    if st is None or ga is None or sn is None:
        checks.append(PreflightCheck("stop", "parameter", None, "stop: no usable greedy answer to take a stop string from"))
    else:
        s = st["request"]["stop"][0]
        got = sn.text
        ok = s not in got
        checks.append(PreflightCheck("stop", "parameter", ok, f"stop={s!r}: " + (
            f"the answer ended before it ({len(got)} of {len(ga.text)} characters)" if ok else
            "the stop string appears in the answer"), n=1,
            evidence={"stop": s, "text": got[:200], "finish_reason": sn.finish_reason}))
    checks.append(_greedy_check([r for r in (nz.get("greedy-a"), nz.get("greedy-c")) if r is not None])
                  if no_greedy is None else PreflightCheck("greedy-top1", "decoding", None, f"greedy = own top-1: {no_greedy}"))
    sampled = [r for k, r in nz.items() if k in ("seed-a", "sample-c", "sample-d") and r is not None]
    sa, sb = nz.get("seed-a"), nz.get("seed-b")
    if sb is not None and sa is not None and _ids(sb) != _ids(sa):  # an ignored seed: an independent draw
        sampled.append(sb)
    conv = learn_convention([r.tokens for r in nz.values() if r is not None],
                            next((k for e in exchanges if (k := requested_top_logprobs(e.get("request")))), None))
    checks.append(_top_p_check(sampled, conv) if no_top_p is None else
                  PreflightCheck("top-p", "decoding", None, f"server-side truncation at top_p = 1: {no_top_p}"))
    checks.append(_prompt_tokens_check(api, ex.get("greedy-a"), nz.get("greedy-a"), tokenizer, reasoning_opener))
    return PreflightReport(checks, list(exchanges), conv.to_dict() if conv.n_positions else {})



def _prompt_tokens_check(api: str, ex: dict[str, Any] | None, n: NormalizedResponse | None, tokenizer: Any,
                         opener: str | None = None) -> PreflightCheck:
    if ex is None or n is None:
        return PreflightCheck("prompt-tokens", "template", None, "prompt tokens: the request failed")
    got = (n.usage or {}).get("prompt_tokens") if not n.usage_missing else None
    if got is None:
        return PreflightCheck("prompt-tokens", "template", None, "the provider reported no usage.prompt_tokens")
    if tokenizer is None:
        return PreflightCheck("prompt-tokens", "template", None, "no reference tokenizer to count with")
    from auditor.check.observations import reference_prompt_ids

    req = ex["request"]
    ref = len(reference_prompt_ids(req, tokenizer, opener))  # the template's reasoning opener included
    ok = int(got) == ref
    return PreflightCheck("prompt-tokens", "template", ok, (
        f"the provider counts {got} prompt tokens, as the reference renders the prompt" if ok else
        f"the provider counts {got} prompt tokens where the reference renders {ref}: a different chat template "
        "or an injected system prompt"), n=1,
        evidence={"provider_prompt_tokens": int(got), "reference_prompt_tokens": ref, "api": api})


# ------------------------------------------------------------------------------------------ pipeline
def provider_failures(store: Any, run_id: str) -> dict[str, Any]:
    """``{"failed", "total", "kinds": {kind: n}}`` over a run's probes (kind = the last attempt's error kind)."""
    from auditor.store import queries as q

    with store.session() as s:
        probes = q.list_probes(s, run_id)
        kinds: Counter[str] = Counter()
        failed = 0
        for p in probes:
            if p.status != "failed":
                continue
            failed += 1
            atts = q.attempts_for_probe(s, p.id)
            err = str(atts[-1].error) if atts and atts[-1].error else "unknown"
            kinds[err.split(":", 1)[0].strip() or "unknown"] += 1
    return {"failed": failed, "total": len(probes), "kinds": dict(kinds)}


@dataclass(frozen=True)
class PreflightContext:
    """What the verdict needs from the pre-flight and the run's failures, computed once by
    :func:`preflight_stage` (plain fields: the pipeline calls nothing on it afterwards).

    Attributes:
        report: the pre-flight, or None when it was not run.
        failures: :func:`provider_failures` of the run.
        detector_results: ``preflight-*`` DetectorResults for the Holm family
            (:meth:`PreflightReport.detector_results`; empty without a pre-flight).
        verdict_kwargs: keyword arguments for ``auditor.verdict.decide.decide_verdict``
            (``provider_failures``, ``template_mismatch``).
    """

    report: PreflightReport | None
    failures: dict[str, Any]
    detector_results: tuple[DetectorResult, ...]
    verdict_kwargs: Mapping[str, Any]

    @classmethod
    def of(cls, report: PreflightReport | None, failures: dict[str, Any]) -> PreflightContext:
        """The context of ``report`` and ``failures``, its derived fields filled in."""
        return cls(report, failures, tuple(report.detector_results()) if report is not None else (),
                   {"provider_failures": failures,
                    "template_mismatch": report.template_mismatch() if report is not None else None})


def preflight_stage(store: Any, run_id: str, config: ProviderConfig, tokenizer: Any = None, *,
                    run_requests: bool = True, transport: Any = None) -> PreflightContext:
    """The pipeline stage: run (or re-read, on resume) the pre-flight of ``run_id`` and count its failures.

    The pre-flight is stored in ``audit_runs.summary["preflight"]``; a run that already has one
    (resumed, or re-analyzed) is not sent again. ``run_requests=False`` — or the environment
    variable ``SPEC_AUDITOR_PREFLIGHT=0`` — skips sending (offline re-analysis). Never raises on
    provider errors.

    Raises:
        KeyError: no run ``run_id`` in the store.
    """
    import os

    from auditor.store import queries as q

    if os.environ.get("SPEC_AUDITOR_PREFLIGHT", "1") == "0":
        run_requests = False

    def run_summary(s: Any) -> dict[str, Any]:
        run = q.get_run(s, run_id)
        if run is None:
            raise KeyError(f"no run with id {run_id!r}")
        return dict(run.summary or {})

    with store.session() as s:
        summary = run_summary(s)
    rep = None
    if "preflight" in summary:
        rep = evaluate_preflight(config.api, summary["preflight"].get("exchanges", []), tokenizer,
                                 getattr(config, "reasoning_opener", None))
    elif run_requests:
        try:
            rep = run_preflight(config, tokenizer, transport=transport)
        except Exception as exc:  # a hostile provider must not end the audit: record and go on
            rep = PreflightReport([PreflightCheck("preflight", "parameter", None, f"pre-flight failed: {exc!r}")])
        with store.session() as s:
            cur = run_summary(s)
            cur["preflight"] = rep.to_dict()
            q.update_run(s, run_id, summary=cur)
    return PreflightContext.of(rep, provider_failures(store, run_id))
