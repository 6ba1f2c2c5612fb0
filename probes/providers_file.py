"""The providers file: where it is found, how it is read and validated, and how discoveries are written back.

File format (TOML, read with :mod:`tomllib`): one table per provider under ``providers``,
keyed by the provider's name (kebab-case), validated as :class:`probes.config.ProviderConfig`;
``[references.NAME]`` tables (:class:`probes.config.ReferenceConfig`) and ``[cards.NAME]`` tables
(:mod:`probes.model_card`) beside them. :data:`EXAMPLE_PROVIDERS_TOML` (below; ``auditor providers
list --example`` prints it) is the annotated example: every key, what it holds, and which are optional.

The ``[providers.NAME]`` form was chosen over ``[[providers]]`` arrays because names must be
unique and a table key makes a duplicate a TOML syntax error instead of a silent override.

Where the file is found (first hit wins): the explicit ``path`` (CLI ``--config PATH``), else
``./providers.toml``, else ``<platformdirs user config dir>/spec-auditor/providers.toml``.

Errors: every problem (missing file, TOML syntax, a pydantic validation failure) raises
:class:`probes.config.ConfigError` whose message names the file, the dotted field path and the fix.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from probes.config import (
    Capabilities,
    ConfigError,
    EnforcedParams,
    Pricing,
    ProviderConfig,
    RateLimits,
    ReferenceConfig,
    ResponseLimits,
    RetryPolicy,
)
from probes.model_card import BUNDLED_CARDS, CardError, parse_cards

__all__ = [
    "APP_NAME",
    "EXAMPLE_PROVIDERS_TOML",
    "PROVIDERS_FILE",
    "find_config_path",
    "get_provider",
    "get_reference",
    "load_providers",
    "load_references",
    "parse_providers",
    "parse_references",
    "user_config_path",
    "write_capabilities",
]

#: Application name used for the platformdirs user config directory.
APP_NAME = "spec-auditor"
#: File name looked up in the working directory and the user config directory.
PROVIDERS_FILE = "providers.toml"


def user_config_path() -> Path:
    """``<user config dir>/spec-auditor/providers.toml`` (platformdirs; may not exist)."""
    import platformdirs

    return Path(platformdirs.user_config_dir(APP_NAME)) / PROVIDERS_FILE


def find_config_path(path: str | os.PathLike[str] | None = None) -> Path | None:
    """Locate the providers file: ``path`` if given, else ``./providers.toml``, else the user dir.

    Returns ``None`` when no file exists and no ``path`` was given.
    Raises :class:`ConfigError` when an explicit ``path`` does not exist.
    """
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise ConfigError(f"{p}: no such providers file. Fix: check the --config path, or create it (see `auditor providers list --example`).")
        return p
    for cand in (Path.cwd() / PROVIDERS_FILE, user_config_path()):
        if cand.is_file():
            return cand
    return None


def _fix_hint(err: ErrorDetails) -> str:
    typ = err.get("type", "")
    ctx = err.get("ctx") or {}
    if typ == "missing":
        return "add this field"
    if typ == "extra_forbidden":
        import difflib

        names = {f for m in (ProviderConfig, Capabilities, EnforcedParams, RateLimits, Pricing, RetryPolicy, ResponseLimits, ReferenceConfig) for f in m.model_fields}
        loc = err.get("loc") or ("",)
        close = difflib.get_close_matches(str(loc[-1]), sorted(names), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"remove it or fix its spelling (unknown field{hint})"
    if typ == "literal_error":
        return f"use one of {ctx.get('expected', 'the allowed values')}"
    if typ in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return "use a value in the allowed range"
    if typ.endswith(("_type", "_parsing")):
        return f"give a value of the right type ({typ.replace('_parsing', '').replace('_type', '')})"
    if typ == "value_error":
        return "see the message"
    return "correct the value"


#: Union-member tags pydantic puts in an error's location (``card: str | ModelCard``): not fields the user wrote.
_UNION_TAGS = ("str", "ModelCard")


def _format_validation_error(file: str, prefix: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        parts = err.get("loc", ())
        if "str" in parts and isinstance(err.get("input"), Mapping):
            continue  # a table where a name or a table is allowed: the name branch's complaint is noise
        loc = ".".join(str(x) for x in (prefix, *parts) if x != "" and x not in _UNION_TAGS)
        msg = err.get("msg", "invalid")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        got = err.get("input")
        got_s = "" if err.get("type") == "missing" or isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"{file}: {loc}: {msg}{got_s}. Fix: {_fix_hint(err)}.")
    return "\n".join(lines)


_Table = TypeVar("_Table", bound=BaseModel)


def _validate_tables(
    tables: dict[str, Any],
    source: str,
    section: str,
    model: type[_Table],
    fields_hint: str,
    problem: Callable[[str, dict[str, Any]], str | None],
) -> dict[str, _Table]:
    """Validate every ``[SECTION.NAME]`` table as ``model`` (with ``name`` = the table key).

    Args:
        tables: ``{NAME: table}`` as parsed from TOML.
        source: the file, for messages.
        section: ``"providers"`` or ``"references"``.
        model: the pydantic model of one table.
        fields_hint: what a table holds, for the "expected a table" fix.
        problem: ``(name, table) -> message tail`` (after ``"SOURCE: SECTION.NAME"``) for a table
            refused before validation, else None.

    Returns ``{name: model}`` in file order. Raises :class:`ConfigError` listing every problem.
    """
    out: dict[str, _Table] = {}
    problems: list[str] = []
    for name, body in tables.items():
        where = f"{source}: {section}.{name}"
        if not isinstance(body, dict):
            problems.append(f"{where}: expected a table. Fix: write [{section}.{name}] with {fields_hint} below.")
            continue
        refused = problem(name, body)
        if refused is not None:
            problems.append(where + refused)
            continue
        try:
            out[name] = model.model_validate({**body, "name": name})
        except ValidationError as exc:
            problems.append(_format_validation_error(source, f"{section}.{name}", exc))
    if problems:
        raise ConfigError("\n".join(problems))
    return out


def _provider_problem(name: str, body: dict[str, Any]) -> str | None:
    if "name" in body and body["name"] != name:
        return f".name: '{body['name']}' differs from the table key. Fix: drop the name field (the key is the name)."
    if "api_key" in body:
        return (".api_key: API keys must not be stored in files. Fix: remove it, "
                "export the key in an env var and set api_key_env = \"THAT_VAR\".")
    return None


def _reference_problem(name: str, body: dict[str, Any]) -> str | None:
    if name == "none":
        return ": 'none' is reserved (no reference). Fix: pick another name."
    if "api_key" in body:
        return ".api_key: keys must not be stored in files. Fix: remove it and set api_key_env = \"THAT_VAR\"."
    return None


def parse_providers(data: dict[str, Any], source: str = "<providers>") -> dict[str, ProviderConfig]:
    """Validate an already-parsed TOML document (``{"providers": {NAME: {...}}}``).

    Returns ``{name: ProviderConfig}`` in file order. Raises :class:`ConfigError`.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a TOML table at the top level.")
    unknown = set(data) - {"providers", "references", "cards"}
    if unknown:
        raise ConfigError(
            f"{source}: unknown top-level key(s) {sorted(unknown)}. Fix: put each provider in a "
            "[providers.NAME] table, each reference engine in a [references.NAME] table and each model "
            "card in a [cards.NAME] table."
        )
    provs = data.get("providers", {})
    if isinstance(provs, list):
        raise ConfigError(
            f"{source}: providers is an array ([[providers]]); this file format uses one table per "
            "provider. Fix: write [providers.NAME] instead of [[providers]] with name = \"NAME\"."
        )
    if not isinstance(provs, dict):
        raise ConfigError(f"{source}: 'providers' must be a table of [providers.NAME] tables.")
    out = _validate_tables(provs, source, "providers", ProviderConfig, "its fields", _provider_problem)
    parse_references(data, source)  # a bad [references.NAME] table fails at load too
    return _resolve_cards(out, data, source)


def _resolve_cards(provs: dict[str, ProviderConfig], data: dict[str, Any], source: str) -> dict[str, ProviderConfig]:
    """Each provider's ``card`` name replaced by its :class:`ModelCard` (``[cards.NAME]`` first, then bundled).

    Raises :class:`ConfigError` for a bad ``[cards.NAME]`` table or an unknown card name (naming the field)."""
    try:
        cards = parse_cards(data, source)
    except CardError as exc:
        raise ConfigError(str(exc)) from None
    known = {**BUNDLED_CARDS, **cards}
    problems = []
    for name, p in provs.items():
        if isinstance(p.card, str):
            if p.card not in known:
                problems.append(f"{source}: providers.{name}.card: no card named {p.card!r} (known: "
                                f"{', '.join(sorted(known))}). Fix: add a [cards.{p.card}] table or use a known name.")
                continue
            provs[name] = p.model_copy(update={"card": known[p.card]})
    if problems:
        raise ConfigError("\n".join(problems))
    return provs


def _read_config(path: str | os.PathLike[str] | None) -> tuple[dict[str, Any], str] | None:
    """The parsed providers file and its path as text; None when no file exists and ``path`` is None.

    Raises :class:`ConfigError` (missing explicit file, TOML syntax, unreadable file).
    """
    p = find_config_path(path)
    if p is None:
        return None
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: TOML syntax error: {exc}. Fix: correct the syntax at that line.") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc}.") from None
    return data, str(p)


def load_providers(path: str | os.PathLike[str] | None = None) -> dict[str, ProviderConfig]:
    """Load every provider from the providers file (see the module docstring for the search order).

    Returns ``{}`` when no file exists and ``path`` is ``None``.
    Raises :class:`ConfigError` (missing explicit file, TOML syntax, invalid fields).
    """
    found = _read_config(path)
    return parse_providers(*found) if found is not None else {}


def parse_references(data: dict[str, Any], source: str = "<providers>") -> dict[str, ReferenceConfig]:
    """Validate the ``[references.NAME]`` tables of an already-parsed providers document.

    Returns ``{name: ReferenceConfig}`` (empty when there are none). Raises :class:`ConfigError`
    naming the file, the dotted field and the fix.
    """
    refs = data.get("references", {}) if isinstance(data, dict) else {}
    if not isinstance(refs, dict):
        raise ConfigError(f"{source}: 'references' must be a table of [references.NAME] tables.")
    return _validate_tables(refs, source, "references", ReferenceConfig, "kind and model", _reference_problem)


def load_references(path: str | os.PathLike[str] | None = None) -> dict[str, ReferenceConfig]:
    """Every ``[references.NAME]`` table of the providers file (same search order); ``{}`` without a file.

    Raises :class:`ConfigError` (missing explicit file, TOML syntax, invalid fields).
    """
    found = _read_config(path)
    return parse_references(*found) if found is not None else {}


def get_reference(name: str, path: str | os.PathLike[str] | None = None) -> ReferenceConfig:
    """Resolve a provider's ``reference`` value to a :class:`ReferenceConfig`.

    ``"none"`` → kind none; a ``[references.NAME]`` table → that table; anything else → a plain
    model name (``kind = "local"``, defaults: device auto, float32). Raises :class:`ConfigError`
    when the file's reference tables are invalid.
    """
    if name == "none":
        return ReferenceConfig(name="none", kind="none")
    refs = load_references(path)
    if name in refs:
        return refs[name]
    return ReferenceConfig(name=name, kind="local", model=name)


def get_provider(name: str, path: str | os.PathLike[str] | None = None) -> ProviderConfig:
    """Return provider ``name`` from the providers file. Raises :class:`ConfigError` if absent."""
    provs = load_providers(path)
    if name in provs:
        return provs[name]
    where = find_config_path(path)
    if where is None:
        raise ConfigError(
            f"no providers file found (looked for --config, ./{PROVIDERS_FILE}, {user_config_path()}). "
            f"Fix: create one with a [providers.{name}] table (see `auditor providers list --example`)."
        )
    known = ", ".join(provs) or "none"
    raise ConfigError(f"{where}: no provider named '{name}' (known: {known}). Fix: add [providers.{name}] or use a known name.")


def write_capabilities(
    name: str, caps: Capabilities, path: str | os.PathLike[str] | None = None, *, concurrency: int | None = None,
    enforced: EnforcedParams | None = None,
) -> Path:
    """Write discovered ``caps`` into ``[providers.NAME.capabilities]`` of the providers file
    (and ``concurrency``, when given, into ``[providers.NAME.rate_limits]``; ``enforced``, when given, into
    ``[providers.NAME.enforced]``: its observed lists, keeping values declared there by hand where the
    probe read none).

    The file is re-serialized with ``tomli_w`` (comments are not preserved). Returns the path.
    Raises :class:`ConfigError` when the file or provider is missing.
    """
    import tomli_w

    p = find_config_path(path)
    if p is None:
        raise ConfigError("no providers file to write to. Fix: pass --config PATH or create ./providers.toml.")
    data = tomllib.loads(p.read_text(encoding="utf-8"))
    provs = data.get("providers", {})
    if name not in provs:
        raise ConfigError(f"{p}: no provider named '{name}'.")
    provs[name]["capabilities"] = caps.model_dump()
    if concurrency is not None:
        provs[name].setdefault("rate_limits", {})["concurrency"] = int(concurrency)
    if enforced is not None:
        old = provs[name].get("enforced") or {}
        new = {k: v for k, v in enforced.model_dump().items() if v not in (None, [])}
        kept = {k: old[k] for k in ("temperature", "top_p", "top_k") if k in old and k not in new}
        if new or kept:
            provs[name]["enforced"] = {**kept, **new}
        else:
            provs[name].pop("enforced", None)
    parse_providers(data, str(p))  # never write an invalid file
    p.write_text(tomli_w.dumps(data), encoding="utf-8")
    return p


EXAMPLE_PROVIDERS_TOML = '''\
# spec-auditor providers file. One [providers.NAME] table per endpoint.
[providers.local-sim]
base_url = "http://127.0.0.1:8000/v1"      # the part before /chat/completions
model = "smollm2-135m-instruct"
api = "chat"                               # or "completions" (legacy /v1/completions)
# api_key_env = "MY_PROVIDER_API_KEY"      # the NAME of an env var holding the key; never the key itself
reference = "smollm2-135m-instruct"        # HF id, local path, or the bundled default
timeout_s = 60
# extra_body = { top_p = 1.0 }             # merged into every request body
# headers = { "X-Team" = "audits" }        # sent with every request (redacted in snapshots when secret-looking)

[providers.local-sim.capabilities]         # `auditor providers probe NAME --write` fills this
max_top_logprobs = 20
n = true
seed = true
# echo = false                             # prompt-token logprobs via echo (api = "completions" only)
streaming = true
logprobs = true

[providers.local-sim.rate_limits]
requests_per_s = 50
concurrency = 8

[providers.local-sim.pricing]              # USD per million tokens (the simulator is free)
usd_per_1m_input = 0.0
usd_per_1m_output = 0.0
'''
