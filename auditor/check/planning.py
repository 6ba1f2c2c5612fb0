"""Planning stage of ``auditor check``: which provider, which suite, and which of its requests fit the budget.

- :func:`provider_config`: the provider's ``ProviderConfig`` (given, or read from the providers
  file), API key resolved;
- :func:`load_suite_spec`: a packaged suite by name or a suite JSON file;
- :func:`allowed_tests`: the suite without the requests the provider does not allow (greedy ones when it
  enforces a temperature above 0: ``[providers.NAME.enforced]``, issue 35 item 4);
- :func:`plan_budget`: the suite cut to ``budget_tokens`` planned completion tokens
  (Σ max_tokens × samples) keeping its mix of modes and workloads.

All of them raise :class:`auditor.check.errors.AuditError` naming the parameter at fault.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from auditor.check.errors import AuditError
from probes.suites import Probe, Suite, SuiteError, load_suite

if TYPE_CHECKING:  # pragma: no cover
    from probes.config import ProviderConfig

__all__ = ["allowed_tests", "impossible_tests", "load_suite_spec", "plan_budget", "provider_config"]


def provider_config(provider_name: str, config_path: str | None = None,
                    given: ProviderConfig | None = None) -> ProviderConfig:
    """The provider's config (``given``, or ``[providers.NAME]`` read from ``config_path``), key resolved.

    Raises:
        AuditError: unknown provider, invalid providers file or unset API key variable
            (``parameter`` = ``config_path``; the message names the fix).
    """
    from probes.config import ConfigError
    from probes.providers_file import get_provider

    try:
        cfg = given if given is not None else get_provider(provider_name, config_path)
        cfg.resolve_api_key()
    except ConfigError as exc:
        raise AuditError(str(exc), parameter="config_path", provider=provider_name) from None
    return cfg


def load_suite_spec(spec: str | Suite | None) -> Suite:
    """A packaged suite by name (default ``default``) or a suite JSON file; a ``Suite`` object (a plan made
    already, e.g. a look of ``--budget-tokens auto``) is returned as it is.

    Raises:
        AuditError: unknown suite or invalid file (``parameter`` = ``suite``; the message names
            it and the fix).
    """

    if isinstance(spec, Suite):
        return spec
    spec = spec or "default"
    p = Path(spec).expanduser()
    try:
        if spec.endswith(".json") or p.is_file():
            if not p.is_file():
                raise SuiteError(f"{p}: no such suite file. Fix: check the --suite path or use a packaged suite name.")
            try:
                return Suite.model_validate(json.loads(p.read_text(encoding="utf-8")))
            except (ValueError, TypeError) as exc:
                raise SuiteError(f"{p}: invalid suite file: {exc}") from None
        return load_suite(spec)
    except SuiteError as exc:
        raise AuditError(str(exc), parameter="suite") from None


def plan_budget(suite: Suite, budget_tokens: int | None) -> Suite:
    """The suite cut down to at most ``budget_tokens`` planned completion tokens.

    Requests (probe × sample) are taken greedily, always from the mode (greedy / logprob /
    sampling) that has used the smallest share of its own planned tokens so far, and within a mode
    round-robin over workloads with samples spread across prompts (sample 0 of every prompt before
    sample 1), so a small budget keeps the suite's mix. A request that does not fit is skipped
    (smaller ones may still fit). Samples of a probe stay contiguous (``#0..#c-1``), so run keys
    are those of the full suite.

    Args:
        suite: a ``probes.suites.Suite``.
        budget_tokens: cap on Σ max_tokens over planned requests (tokens); None = whole suite.

    Returns:
        A Suite with the same name and version (the digest differs when cut).

    Raises:
        AuditError: the budget is not positive or smaller than the smallest request
            (``parameter`` = ``budget_tokens``; the message gives the minimum).
    """
    if budget_tokens is None or budget_tokens >= suite.max_completion_tokens():
        return suite
    if budget_tokens <= 0:
        raise AuditError(f"budget_tokens={budget_tokens}: must be a positive number of tokens",
                         parameter="budget_tokens")
    queues: dict[str, list[tuple[Probe, int]]] = {}
    mode_total: Counter[str] = Counter()
    for mode in ("greedy", "logprob", "sampling"):
        probes = [p for p in suite.probes if p.mode == mode]
        by_w: dict[str, list[Probe]] = {}
        for p in probes:
            by_w.setdefault(p.workload, []).append(p)
        rr: list[Probe] = []
        while any(by_w.values()):
            for w in list(by_w):
                if by_w[w]:
                    rr.append(by_w[w].pop(0))
        items = [(p, s) for s in range(max((p.n_samples for p in rr), default=0)) for p in rr if s < p.n_samples]
        if items:
            queues[mode] = items
            mode_total[mode] = sum(p.max_tokens for p, _ in items)
    used: Counter[str] = Counter()
    taken: Counter[str] = Counter()
    total = 0
    blocked: set[str] = set()  # probes whose next sample did not fit (samples stay contiguous)
    while True:
        took = False
        for mode in sorted(queues, key=lambda m: (used[m] / mode_total[m], m)):
            q = queues[mode]
            for j, (p, s) in enumerate(q):
                if p.id in blocked or taken[p.id] != s:
                    continue
                if total + p.max_tokens <= budget_tokens:
                    total += p.max_tokens
                    used[mode] += p.max_tokens
                    taken[p.id] += 1
                    q.pop(j)
                    took = True
                    break
                blocked.add(p.id)
            if took:
                break
        if not took:
            break
    if total == 0:
        smallest = min(p.max_tokens for p in suite.probes)
        raise AuditError(
            f"budget_tokens={budget_tokens} is smaller than the smallest request of suite {suite.name} "
            f"({smallest} tokens). Fix: budget_tokens={smallest} or more.",
            parameter="budget_tokens",
        )
    kept = [p.model_copy(update={"n_samples": taken[p.id]}) for p in suite.probes if taken[p.id] > 0]
    return suite.model_copy(update={"probes": kept})


def impossible_tests(config: ProviderConfig) -> dict[str, str]:
    """The questions an audit of ``config`` cannot ask, each with the reason in plain words
    (``{}`` when the provider honours every parameter). Keys: ``greedy`` (temperature-0 tests: greedy
    match, near-ties, the pre-flight's greedy checks), ``full-distribution`` (sampling of the whole
    distribution: the pre-flight's server-side truncation check), ``seed`` (reproducible samples)."""
    e = config.enforced
    where = f"providers.{config.name}.enforced"
    out: dict[str, str] = {}
    if not e.greedy_possible():
        t = e.temperature
        out["greedy"] = (f"the provider enforces temperature = {t:g} ({where}), so no answer is sampled at "
                         "temperature 0: greedy-match and the greedy near-tie tests were impossible"
                         if t is not None else f"the provider rejects or overrides temperature ({where})")
    if (e.top_p is not None and e.top_p < 1.0) or e.top_k is not None:
        law = ", ".join(f"{p} = {v:g}" for p, v in e.fixed().items() if p != "temperature")
        out["full-distribution"] = (f"the provider enforces {law} ({where}): whether it truncates the distribution "
                                    "could not be tested; the sampling tests compare its tokens with that declared law")
    if "seed" in e.rejected:
        out["seed"] = f"the provider rejects seed with HTTP 400 ({where}): samples are not reproducible"
    return out


def allowed_tests(suite: Suite, config: ProviderConfig) -> Suite:
    """``suite`` without the requests ``config``'s provider does not allow: its greedy-mode probes when
    it enforces a temperature above 0 (they would be samples at that temperature under another name;
    the logprob- and sampling-mode probes stay, sent at the enforced law). Unchanged otherwise.

    Raises:
        AuditError: a sampling parameter the provider overrides or rejects has no declared value (the law
            of its samples is unknown), or nothing of the suite is left (``parameter`` = ``config_path``).
    """
    e = config.enforced
    if unknown := e.unknown():
        raise AuditError(
            f"provider {config.name!r} overrides or rejects {', '.join(unknown)} and the value it applies is not "
            f"declared, so no test can compare its tokens with a known law. Fix: declare it in "
            f"[providers.{config.name}.enforced] (e.g. temperature = 1.0, from the provider's documentation).",
            parameter="config_path", provider=config.name)
    if e.greedy_possible():
        return suite
    kept = [p for p in suite.probes if p.mode != "greedy"]
    if not kept:
        raise AuditError(
            f"suite {suite.name}: every request is greedy (temperature 0), and provider {config.name!r} enforces "
            f"temperature = {e.temperature:g}. Fix: use a suite with logprob or sampling requests (default, "
            "verification).", parameter="suite", provider=config.name)
    return suite.model_copy(update={"probes": kept})
