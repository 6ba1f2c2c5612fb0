"""Provider config: TOML loading, search order, errors that name file/field/fix, secrets."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from probes import config as cfgmod
from probes import providers_file
from probes.config import Capabilities, ConfigError, ProviderConfig
from probes.providers_file import get_provider, load_providers, write_capabilities

GOOD = """
[providers.sim]
base_url = "http://127.0.0.1:8000/v1/"
model = "smollm2"
api_key_env = "SIM_KEY"
headers = { "X-Api-Key-Id" = "abc", "X-Team" = "audits" }

[providers.sim.rate_limits]
requests_per_s = 20
concurrency = 4

[providers.sim.pricing]
usd_per_1m_input = 0.5
usd_per_1m_output = 1.5

[providers.legacy]
base_url = "https://api.example.com/v1"
model = "m"
api = "completions"
capabilities = { echo = true, max_top_logprobs = 5 }
"""


def _write(tmp_path: Path, text: str, name: str = "providers.toml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_load_defaults_and_fields(tmp_path: Path) -> None:
    provs = load_providers(_write(tmp_path, GOOD))
    assert list(provs) == ["sim", "legacy"]
    sim = provs["sim"]
    assert sim.base_url == "http://127.0.0.1:8000/v1"  # trailing slash dropped
    assert sim.endpoint_url() == "http://127.0.0.1:8000/v1/chat/completions"
    assert provs["legacy"].endpoint_url() == "https://api.example.com/v1/completions"
    assert sim.reference == "smollm2-135m-instruct"
    assert sim.rate_limits.concurrency == 4 and sim.rate_limits.requests_per_s == 20
    assert sim.pricing.cost_usd(2_000_000, 1_000_000) == pytest.approx(0.5 * 2 + 1.5)
    assert provs["legacy"].capabilities.echo is True
    assert provs["legacy"].capabilities.max_top_logprobs == 5


def test_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    monkeypatch.setattr(providers_file, "user_config_path", lambda: user_dir / "providers.toml")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert load_providers() == {}
    _write(user_dir, GOOD.replace("[providers.legacy]", "[providers.userdir]"))
    assert "userdir" in load_providers()
    _write(work, GOOD)  # ./providers.toml wins over the user dir
    assert "legacy" in load_providers() and "userdir" not in load_providers()
    other = _write(tmp_path, '[providers.explicit]\nbase_url = "http://x/v1"\nmodel = "m"\n', "other.toml")
    assert "explicit" in load_providers(other)  # --config wins over both
    with pytest.raises(ConfigError, match="no such providers file"):
        load_providers(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("text", "field", "fix"),
    [
        ('[providers.a]\nmodel = "m"\n', "providers.a.base_url", "add this field"),
        ('[providers.a]\nbase_url = "http://x/v1"\nmodel = "m"\napi = "responses"\n', "providers.a.api", "use one of"),
        ('[providers.a]\nbase_url = "http://x/v1"\nmodel = "m"\ntimeout = 5\n', "providers.a.timeout", "spelling"),
        ('[providers.a]\nbase_url = "x/v1"\nmodel = "m"\n', "providers.a.base_url", "http://"),
        ('[providers.a]\nbase_url = "http://x/v1/chat/completions"\nmodel = "m"\n', "providers.a.base_url", "without"),
        ('[providers.a]\nbase_url = "http://x/v1"\nmodel = "m"\n[providers.a.rate_limits]\nconcurrency = 0\n', "providers.a.rate_limits.concurrency", "range"),
        ('[providers.a]\nbase_url = "http://x/v1"\nmodel = "m"\napi_key_env = "sk-abc123-secret"\n', "providers.a.api_key_env", "NAME of an environment variable"),
        ('[providers.a]\nbase_url = "http://x/v1"\nmodel = "m"\nheaders = { Authorization = "Bearer x" }\n', "providers.a.headers", "api_key_env"),
        ('[providers.a]\nbase_url = "http://x/v1"\nmodel = "m"\napi_key = "sk-123"\n', "providers.a.api_key", "api_key_env"),
        ('[[providers]]\nname = "a"\n', "providers", "[providers.NAME]"),
        ('[providers.a\nbase_url = 1\n', "TOML syntax", "Fix"),
        ('[provider.a]\nmodel = "m"\n', "top-level", "[providers.NAME]"),
    ],
)
def test_errors_name_file_field_and_fix(tmp_path: Path, text: str, field: str, fix: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_providers(path)
    msg = str(ei.value)
    assert str(path) in msg
    assert field in msg
    assert fix in msg
    assert "Fix" in msg


def test_secret_never_in_config_or_dump(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    prov = load_providers(_write(tmp_path, GOOD))["sim"]
    monkeypatch.delenv("SIM_KEY", raising=False)
    with pytest.raises(ConfigError, match="export SIM_KEY"):
        prov.resolve_api_key()
    monkeypatch.setenv("SIM_KEY", "sk-very-secret-123")
    assert prov.resolve_api_key() == "sk-very-secret-123"
    dump = prov.safe_dump()
    assert "sk-very-secret-123" not in repr(dump)
    assert dump["headers"]["X-Api-Key-Id"] == "[REDACTED]" and dump["headers"]["X-Team"] == "audits"
    assert dump["api_key_env"] == "SIM_KEY"
    assert ProviderConfig(name="n", base_url="http://x/v1", model="m").resolve_api_key() is None


def test_get_provider_and_unknown(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    assert get_provider("sim", path).model == "smollm2"
    with pytest.raises(ConfigError, match="known: sim, legacy"):
        get_provider("nope", path)


def test_write_capabilities_roundtrip(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    caps = Capabilities(max_top_logprobs=20, n=True, seed=True, echo=False, streaming=True, logprobs=True)
    write_capabilities("sim", caps, path)
    again = load_providers(path)
    assert again["sim"].capabilities == caps
    assert again["sim"].rate_limits.concurrency == 4  # other fields kept
    assert tomllib.loads(path.read_text())["providers"]["legacy"]["api"] == "completions"


def test_echo_needs_completions() -> None:
    with pytest.raises(ValueError, match="echo"):
        ProviderConfig(name="a", base_url="http://x/v1", model="m", capabilities=Capabilities(echo=True))


def _parse_config_module():  # at collection time: see the note in tests/test_layering.py (gh-106905)
    import ast
    import inspect

    return ast.parse(inspect.getsource(cfgmod))


_CONFIG_TREE = _parse_config_module()


def test_every_field_documented() -> None:
    import ast

    tree = _CONFIG_TREE
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in {"ProviderConfig", "Capabilities", "RateLimits", "Pricing", "RetryPolicy"}:
            body = node.body
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.AnnAssign):
                    nxt = body[i + 1] if i + 1 < len(body) else None
                    assert isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant), f"{node.name}.{stmt.target.id} lacks a docstring"
