"""Atom feed of verdict changes: content, validity, file output and the loopback server."""

from __future__ import annotations

import datetime as dt
import threading
import xml.etree.ElementTree as ET

import httpx

from auditor.store.models import AuditRun
from auditor.watch.feed import ATOM_NS, build_feed, feed_from_store, make_feed_server, write_feed

from .conftest import T0

A = f"{{{ATOM_NS}}}"


def _seed(store):
    with store.session() as s:
        for k, (p, v) in enumerate(
            [("a", "PASS"), ("b", "PASS"), ("a", "QUANTIZATION"), ("b", None), ("b", "PASS"), ("a", "PASS")]
        ):
            s.add(
                AuditRun(
                    id=f"run{k}",
                    provider_name=p,
                    status="completed" if v else "failed",
                    verdict=v,
                    verdict_reason="KL 18x the noise floor \x00\x07<b>" if k == 2 else None,
                    started_at=T0 + dt.timedelta(hours=k),
                    model="m<&>",
                )
            )


def test_feed_lists_each_change_newest_first(store):
    _seed(store)
    root = ET.fromstring(feed_from_store(store))
    assert root.tag == f"{A}feed" and root.find(f"{A}id").text
    entries = root.findall(f"{A}entry")
    assert [e.find(f"{A}title").text for e in entries] == ["a: QUANTIZATION -> PASS", "a: PASS -> QUANTIZATION"]
    assert [e.find(f"{A}id").text for e in entries] == [
        "urn:spec-auditor:verdict-change:run5",
        "urn:spec-auditor:verdict-change:run2",
    ]
    assert root.find(f"{A}updated").text == "2026-05-01T05:00:00Z"
    summary = entries[1].find(f"{A}summary").text
    assert "Model: m<&>" in summary and "<b>" in summary and "\x00" not in summary  # escaped, cleaned
    only_b = ET.fromstring(feed_from_store(store, provider_name="b"))
    assert only_b.findall(f"{A}entry") == []  # b: PASS, (failed), PASS -> no change


def test_empty_feed_is_valid():
    root = ET.fromstring(build_feed([], updated=T0))
    assert root.findall(f"{A}entry") == [] and root.find(f"{A}updated").text == "2026-05-01T00:00:00Z"


def test_write_feed_file(store, tmp_path):
    _seed(store)
    path = write_feed(store, tmp_path / "out" / "feed.atom")
    assert len(ET.parse(path).getroot().findall(f"{A}entry")) == 2
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".feed-")]


def test_feed_server_on_loopback(store):
    _seed(store)
    server = make_feed_server(store, "127.0.0.1", 0)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        port = server.server_address[1]
        r = httpx.get(f"http://127.0.0.1:{port}/feed.atom", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/atom+xml")
        root = ET.fromstring(r.content)
        assert len(root.findall(f"{A}entry")) == 2
        link = root.find(f"{A}link")
        assert link.get("rel") == "self" and link.get("href").endswith(f":{port}/feed.atom")
        assert httpx.get(f"http://127.0.0.1:{port}/other", timeout=10).status_code == 404
    finally:
        server.shutdown()
        server.server_close()
