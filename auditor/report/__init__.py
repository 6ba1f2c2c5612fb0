"""Audit reports: an ``AuditReport`` rendered as text, JSON, Markdown or JUnit XML.

- ``common`` — the ``AuditReport`` record and the helpers every renderer shares;
- ``render`` — the format dispatcher ``render``, the text and JSON renderers, ``load_report``;
- ``markdown`` — Markdown; ``junit`` — JUnit XML.

Each renderer imports ``common``, never its caller ``render``.
"""
