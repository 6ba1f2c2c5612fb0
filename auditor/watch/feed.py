"""Atom feed (RFC 4287) of verdict changes, written to a file or served on loopback.

Entries come from the run history itself (:func:`auditor.store.dashboard_queries.verdict_changes`),
not only from the ``alerts`` table, so changes found by a manual ``auditor check`` appear too.
One entry per change, newest first; the entry id is stable per run
(``urn:spec-auditor:verdict-change:<RUN_ID>``), so feed readers never show a change twice.

XML is built with :mod:`xml.etree.ElementTree` (text is escaped by the serializer); characters
that XML 1.0 forbids are removed from provider-controlled strings first.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import tempfile
import threading
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from auditor.store.db import Store

__all__ = ["ATOM_NS", "FEED_ID", "build_feed", "feed_from_store", "make_feed_server", "write_feed"]

ATOM_NS = "http://www.w3.org/2005/Atom"
FEED_ID = "urn:spec-auditor:verdict-changes"
_XML_BAD = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: Any) -> str:
    return _XML_BAD.sub("", "" if text is None else str(text))


def _iso(value: dt.datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def build_feed(
    changes: Sequence[dict[str, Any]],
    *,
    title: str = "spec-auditor: verdict changes",
    self_url: str | None = None,
    updated: dt.datetime | None = None,
) -> str:
    """Serialise verdict changes as an Atom 1.0 document (UTF-8 text with XML declaration).

    Args:
        changes: dicts with ``provider_name``, ``model``, ``run_id``, ``previous_verdict``,
            ``verdict``, ``verdict_reason`` and ``started_at`` (aware UTC), newest first — the
            output of ``verdict_changes``.
        title: the feed title.
        self_url: the feed's own URL (``<link rel="self">``) when served.
        updated: feed ``<updated>``; default the newest change, or now for an empty feed.
    """
    ET.register_namespace("", ATOM_NS)
    q = lambda tag: f"{{{ATOM_NS}}}{tag}"
    feed = ET.Element(q("feed"))
    ET.SubElement(feed, q("id")).text = FEED_ID
    ET.SubElement(feed, q("title")).text = _clean(title)
    newest = max((c["started_at"] for c in changes), default=None)
    ET.SubElement(feed, q("updated")).text = _iso(updated or newest or dt.datetime.now(dt.UTC))
    author = ET.SubElement(feed, q("author"))
    ET.SubElement(author, q("name")).text = "spec-auditor"
    ET.SubElement(feed, q("generator")).text = "spec-auditor"
    if self_url:
        ET.SubElement(feed, q("link"), rel="self", href=_clean(self_url), type="application/atom+xml")
    for c in changes:
        entry = ET.SubElement(feed, q("entry"))
        ET.SubElement(entry, q("id")).text = f"urn:spec-auditor:verdict-change:{_clean(c['run_id'])}"
        ET.SubElement(entry, q("title")).text = _clean(
            f"{c['provider_name']}: {c['previous_verdict']} -> {c['verdict']}"
        )
        stamp = _iso(c["started_at"])
        ET.SubElement(entry, q("updated")).text = stamp
        ET.SubElement(entry, q("published")).text = stamp
        ET.SubElement(entry, q("category"), term=_clean(c["verdict"]))
        lines = [
            f"Provider: {c['provider_name']}",
            f"Model: {c.get('model') or '-'}",
            f"Run: {c['run_id']}",
            f"Verdict: {c['previous_verdict']} -> {c['verdict']}",
        ]
        if c.get("verdict_reason"):
            lines.append(f"Reason: {c['verdict_reason']}")
        ET.SubElement(entry, q("summary"), type="text").text = _clean("\n".join(lines))
    ET.indent(feed)
    body = ET.tostring(feed, encoding="unicode")
    return '<?xml version="1.0" encoding="utf-8"?>\n' + body + "\n"


def feed_from_store(
    store: Store, *, provider_name: str | None = None, limit: int = 100, self_url: str | None = None
) -> str:
    """The Atom feed of the newest ``limit`` verdict changes in ``store`` (optionally one provider)."""
    from auditor.store.dashboard_queries import has_schema, verdict_changes

    with store.session() as s:
        changes = verdict_changes(s, provider_name=provider_name, limit=limit) if has_schema(s) else []
    return build_feed(changes, self_url=self_url)


def write_feed(store: Store, path: str | os.PathLike[str], **kwargs: Any) -> Path:
    """Write the feed to ``path`` atomically (temp file + rename); returns the path.

    Keyword arguments go to :func:`feed_from_store`.
    """
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    text = feed_from_store(store, **kwargs)
    fd, tmp = tempfile.mkstemp(prefix=".feed-", suffix=".xml", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def make_feed_server(
    store: Store, host: str = "127.0.0.1", port: int = 8502, *, provider_name: str | None = None, limit: int = 100
) -> ThreadingHTTPServer:
    """An HTTP server answering ``GET /`` and ``GET /feed.atom`` with a freshly built feed.

    The caller runs ``serve_forever()`` (or in a thread) and ``shutdown()``/``server_close()``.
    ``port=0`` picks a free port (read it from ``server.server_address``). Other paths: 404.
    """
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        server_version = "spec-auditor-feed"

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in ("/", "/feed.atom", "/feed.xml"):
                self.send_error(404, "not found; the feed is at /feed.atom")
                return
            addr = self.server.server_address
            assert isinstance(addr, tuple)  # an AF_INET HTTP server: (host, port)
            h, p = addr[:2]
            with lock:
                text = feed_from_store(
                    store, provider_name=provider_name, limit=limit, self_url=f"http://{h}:{p}/feed.atom"
                )
            data = text.encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", "application/atom+xml; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return ThreadingHTTPServer((host, port), Handler)
