"""Who may read the dashboard (issue 38, item 8): open on loopback, a login everywhere else.

``auditor dashboard`` chooses the mode and passes it to the Streamlit process in its environment
(never on the command line, so neither the token nor the mode shows in ``ps``):

- ``none`` — loopback only (127.0.0.1, ::1): whoever can reach the address already has the machine.
- ``oidc`` — Streamlit's own OpenID Connect login (``st.login`` / ``st.user``, Streamlit ≥ 1.42), used
  when ``.streamlit/secrets.toml`` has an ``[auth]`` section (an identity provider is configured).
- ``header`` — a trusted reverse proxy authenticates and sets a header (e.g. ``X-Forwarded-User``); a
  request without it is refused. Only safe when the proxy is the only way in.
- ``token`` — a shared secret: ``$SPEC_AUDITOR_DASHBOARD_TOKEN``, or one generated and printed by
  ``auditor dashboard``. Opened as ``/?token=...`` once or typed into the login form; compared in
  constant time; remembered for the browser session.

Every rerun of the script passes :func:`require_login` before any page reads the database.
"""

from __future__ import annotations

import hmac
import os

import streamlit as st

#: Environment variables set by ``auditor dashboard`` for the Streamlit process.
ENV_MODE = "SPEC_AUDITOR_DASHBOARD_AUTH"
ENV_TOKEN = "SPEC_AUDITOR_DASHBOARD_TOKEN"
ENV_HEADER = "SPEC_AUDITOR_DASHBOARD_AUTH_HEADER"
MODES = ("none", "token", "header", "oidc")
_SESSION_KEY = "_auditor_authenticated"


def auth_mode() -> str:
    """The mode the CLI chose (:data:`MODES`); ``none`` when unset (``streamlit run`` by hand on loopback).

    An unknown value or a token mode without a token refuses everyone (``"deny"``) rather than opening."""
    mode = os.environ.get(ENV_MODE, "none").strip().lower() or "none"
    if mode not in MODES or (mode == "token" and not os.environ.get(ENV_TOKEN)) or (
            mode == "header" and not os.environ.get(ENV_HEADER)):
        return "deny"
    return mode


def _token_ok(given: object) -> bool:
    want = os.environ.get(ENV_TOKEN, "")
    return bool(want) and isinstance(given, str) and hmac.compare_digest(given.encode(), want.encode())


def require_login() -> bool:
    """Let this rerun through (True) or draw the login and return False (the caller stops).

    Raises nothing; a misconfiguration (``deny``) shows an error and lets nobody in.
    """
    mode = auth_mode()
    if mode == "none":
        return True
    if mode == "deny":
        st.error("The dashboard's access control is misconfigured; nobody is let in. Restart it with "
                 "`auditor dashboard` (it sets the login up).")
        return False
    if mode == "header":
        name = os.environ.get(ENV_HEADER, "")
        user = st.context.headers.get(name) if st.context.headers is not None else None
        if user:
            return True
        st.error(f"Not authenticated: this dashboard is served behind a login proxy that sets the {name} header, "
                 "and this request did not come through it.")
        return False
    if mode == "oidc":
        if st.user.is_logged_in:
            return True
        st.title("spec-auditor")
        st.markdown("Log in to read the audit results.")
        st.button("Log in", on_click=st.login, key="auth_login")
        return False
    # token
    if st.session_state.get(_SESSION_KEY):
        return True
    given = st.query_params.get("token")
    if given is not None:
        st.query_params.pop("token")  # not left in the address bar or the history
        if _token_ok(given):
            st.session_state[_SESSION_KEY] = True
            return True
    st.title("spec-auditor")
    st.markdown("This dashboard is served beyond this machine: enter the access token printed by "
                "`auditor dashboard` (or set in `SPEC_AUDITOR_DASHBOARD_TOKEN`).")
    with st.form("auth_form"):
        typed = st.text_input("Access token", type="password", key="auth_token")
        sent = st.form_submit_button("Open")
    if sent:
        if _token_ok(typed):
            st.session_state[_SESSION_KEY] = True
            st.rerun()
        st.error("Wrong token.")
    return False
