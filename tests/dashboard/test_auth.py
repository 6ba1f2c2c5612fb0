"""Off loopback, a login (issue 38, item 8): token, trusted proxy header, OIDC; loopback stays open."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dashboard.auth import ENV_HEADER, ENV_MODE, ENV_TOKEN


def _page_text(at) -> str:
    return "\n".join(str(e.value) for kind in ("markdown", "title", "error", "info", "header")
                     for e in getattr(at, kind))


def test_token_mode_shows_nothing_without_the_token_and_everything_with_it(app_test, seeded, monkeypatch):
    url, summary = seeded
    monkeypatch.setenv(ENV_MODE, "token")
    monkeypatch.setenv(ENV_TOKEN, "s3cret-token")
    at = app_test(url, page="providers")
    assert not at.exception
    text = _page_text(at)
    assert "access token" in text and "| Provider |" not in text
    assert not any(name.replace("-", "\\-") in text for name in summary["latest_verdicts"])  # no data leaks
    wrong = app_test(url, page="providers", token="nope")
    assert "| Provider |" not in _page_text(wrong)
    ok = app_test(url, page="providers", token="s3cret-token")
    assert not ok.exception and "| Provider |" in _page_text(ok)
    assert "token" not in ok.query_params  # not left in the address bar
    # the login form
    at.text_input(key="auth_token").input("s3cret-token")
    at.button[0].click().run()
    assert "| Provider |" in _page_text(at)


@pytest.mark.parametrize("env", [{ENV_MODE: "token"}, {ENV_MODE: "bogus"}, {ENV_MODE: "header"}])
def test_a_misconfigured_login_lets_nobody_in(app_test, seeded, monkeypatch, env):
    url, _ = seeded
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    monkeypatch.delenv(ENV_HEADER, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    at = app_test(url, page="providers", token="")
    assert "| Provider |" not in _page_text(at) and at.error


def test_header_mode_refuses_a_request_without_the_proxy_header(app_test, seeded, monkeypatch):
    url, _ = seeded
    monkeypatch.setenv(ENV_MODE, "header")
    monkeypatch.setenv(ENV_HEADER, "X-Forwarded-User")
    at = app_test(url, page="providers")
    assert "| Provider |" not in _page_text(at) and "X-Forwarded-User" in at.error[0].value


def test_loopback_stays_open(app_test, seeded, monkeypatch):
    url, _ = seeded
    monkeypatch.setenv(ENV_MODE, "none")
    assert "| Provider |" in _page_text(app_test(url, page="providers"))


def test_cli_off_loopback_sets_a_token_and_prints_the_login_url(monkeypatch, tmp_path):
    """`auditor dashboard --host 0.0.0.0` passes a generated token to Streamlit by environment and prints
    the one-time URL; loopback passes mode none; --auth-header and an [auth] secrets table pick their modes."""
    from auditor.cli import app
    from auditor.cli import dashboard as cli_dashboard

    seen: list[dict[str, str]] = []
    monkeypatch.setattr(cli_dashboard, "run_child", lambda cmd, env: seen.append(env) or 0)
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    db = f"sqlite:///{tmp_path / 'a.db'}"
    r = CliRunner().invoke(app, ["dashboard", "--db", db, "--host", "0.0.0.0", "--port", "8765"])
    assert r.exit_code == 0, r.output
    env = seen[-1]
    assert env[ENV_MODE] == "token" and len(env[ENV_TOKEN]) >= 24
    assert f"?token={env[ENV_TOKEN]}" in r.output
    assert all(env[ENV_TOKEN] not in a for a in cli_dashboard.streamlit_command(host="0.0.0.0"))  # not in `ps`
    CliRunner().invoke(app, ["dashboard", "--db", db])
    assert seen[-1][ENV_MODE] == "none"
    CliRunner().invoke(app, ["dashboard", "--db", db, "--host", "10.0.0.5", "--auth-header", "X-Forwarded-User"])
    assert seen[-1][ENV_MODE] == "header" and seen[-1][ENV_HEADER] == "X-Forwarded-User"
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "secrets.toml").write_text('[auth]\nredirect_uri = "http://x/oauth2callback"\n')
    CliRunner().invoke(app, ["dashboard", "--db", db, "--host", "10.0.0.5"])
    assert seen[-1][ENV_MODE] == "oidc"
