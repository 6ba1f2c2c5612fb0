"""Escaping and formatting helpers: provider text can never become markup."""

from __future__ import annotations

import html
import random
import re

import pytest
from markdown_it import MarkdownIt

from dashboard.render import (
    escape_md,
    fmt_dt,
    fmt_ms,
    fmt_p,
    fmt_pct,
    fmt_usd,
    md_code,
    md_table,
    verdict_badge,
    visible_token,
)

MD = MarkdownIt("commonmark").enable("table")
HOSTILE = [
    "<img src=x onerror=alert(1)>",
    "<script>alert('x')</script>",
    "[click](javascript:alert(1))",
    "**bold** _it_ `code` ~~s~~",
    ":red[colour] :smile: $x^2$",
    "a | b | c",
    "&lt;b&gt; &amp; &#60;",
    "# heading\n- item\n> quote",
    "https://example.com www.example.com",
    "\\*escaped\\*",
]


def _inline_text(rendered: str) -> str:
    assert "<" not in re.sub(r"</?p>", "", rendered).replace("<br />", ""), rendered
    return html.unescape(re.sub(r"</?p>", "", rendered)).strip()


@pytest.mark.parametrize("text", HOSTILE)
def test_escape_md_renders_literally(text):
    rendered = MD.render(escape_md(text))
    expected = " ".join(text.split("\n"))
    assert _inline_text(rendered) == expected


def test_escape_md_random_ascii_roundtrip():
    rng = random.Random(7)
    alphabet = "".join(chr(c) for c in range(32, 127))
    for _ in range(300):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))).strip()
        if not s:
            continue
        got = _inline_text(MD.render(escape_md(s)))
        assert re.sub(r"\s+", " ", got) == re.sub(r"\s+", " ", s)


def test_md_table_cells_do_not_break_out():
    row = [escape_md("a | b"), md_code("x | y `z`", in_table=True)]
    out = MD.render(md_table(["A", "B"], [row]))
    assert out.count("<td") == 2
    assert "a | b" in html.unescape(out) and "x | y `z`" in html.unescape(out)


def test_md_code_is_literal():
    out = MD.renderInline(md_code("<b>**x**</b> `tick`"))
    assert out.startswith("<code>") and html.unescape(out[6:-7]) == "<b>**x**</b> `tick`"


def test_verdict_badge_and_visible_token():
    assert verdict_badge("PASS") == ":green-badge[PASS]"
    assert verdict_badge("RELAXED_VERIFICATION") == ":red-badge[RELAXED\\_VERIFICATION]"
    assert verdict_badge("weird]") == ":blue-badge[weird\\]]"
    assert verdict_badge(None) == "—"
    assert visible_token(" a\n\t") == "␣a↵⇥"
    assert visible_token("") == "∅"


def test_formatters():
    assert fmt_p(3.2e-9) == "3.2e-09" and fmt_p(0.0342) == "0.034" and fmt_p(None) == "—"
    assert fmt_p(float("nan")) == "—"
    assert fmt_pct(0.062) == "6.2%"
    assert fmt_ms(0.085) == "85 ms" and fmt_ms(0.0047) == "4.7 ms"
    assert fmt_usd(12.5) == "$12.50" and fmt_usd(0.0123) == "$0.012" and fmt_usd(6.4e-05) == "$0.000064"
    assert fmt_usd(0) == "$0"
    import datetime as dt

    assert fmt_dt(dt.datetime(2026, 3, 1, 5, 7, tzinfo=dt.UTC)) == "2026-03-01 05:07 UTC"


def test_strongest_evidence_shows_the_providers_probabilities_beside_the_references() -> None:
    """Issue 38 item 5: what diverges is the comparison, so each position shows both sides."""
    from dashboard.views.run_detail import token_evidence_md

    item = {"prompt_id": "p#0", "position": 3, "token_id": 7, "token": "7", "ref_top5": [[8, -0.04], [7, -3.3]],
            "ref_top5_tokens": ["8", "7"], "ref_margin": 3.26, "provider_top5": [[7, -0.2], [8, -1.8], [99, -4.0]],
            "provider_token_logprob": -0.2}
    md = token_evidence_md(item)
    assert md is not None
    rows = [r for r in md.splitlines() if r.startswith("|")]
    assert rows[0].startswith("| Rank | Token | Reference logprob (nats) | Reference prob | Provider logprob (nats) |")
    seven = next(r for r in rows if "provider's token" in r)
    assert "\\-3\\.3" in seven or "-3.3" in seven  # the reference's side
    assert "\\-0\\.2" in seven or "-0.2" in seven  # the provider's own side
    assert any("provider's list only" in r for r in rows)  # id 99: listed by the provider alone
    bare = token_evidence_md({k: v for k, v in item.items() if not k.startswith("provider_")})
    assert bare is not None and "reported no probabilities" in bare and "not listed" in bare


def test_history_axis_of_a_single_run_is_readable_and_fingerprint_points_are_not_clipped() -> None:
    """Issue 38 item 7: one run drew one tick labelled ".055" (milliseconds); the fingerprint plot's
    extreme (repetition) points sat on the axis corner, half clipped."""
    import datetime as dt

    import pandas as pd

    from dashboard.views.history import MIN_SPAN_S, history_chart, time_domain
    from dashboard.views.speed import padded_domain, speed_profile_chart

    t = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)
    one = [{"started_at": t, "mean_kl": 0.01, "verdict": "PASS", "run_id": "r1", "changed_from": None}]
    lo, hi = time_domain(one)
    assert hi - lo >= MIN_SPAN_S * 1000 and lo < t.timestamp() * 1000 < hi
    spec = history_chart(one, "mean_kl").to_dict()
    x = spec["layer"][0]["encoding"]["x"]
    assert x["scale"]["domain"] == [lo, hi] and x["axis"]["format"] == "%b %d %H:%M"
    many = [dict(one[0], started_at=t + dt.timedelta(days=d)) for d in range(3)]
    lo, hi = time_domain(many)
    assert hi - lo == pytest.approx(2 * 86400e3 * 1.1)
    assert time_domain([]) == []

    df = pd.DataFrame({"provider": ["a"] * 3, "workload": ["chat", "code", "repetition"], "concurrency": [1, 1, 1],
                       "tokens_per_s": [10.0, 12.0, 30.0], "tpot_ms": [50.0, 40.0, 15.0],
                       "tokens_per_step": [1.2, 1.5, 3.4], "tpot_ratio_vs_chat": [1.0, 1.25, 3.3],
                       "speculates": [True] * 3})
    lo, hi = padded_domain(df["tokens_per_step"])
    assert lo < 1.2 and hi > 3.4 and hi - 3.4 >= 0.1
    right = speed_profile_chart(df).to_dict()["hconcat"][1]["encoding"]
    assert right["x"]["scale"]["domain"][1] > 3.4 and right["y"]["scale"]["domain"][1] > 3.3
    assert padded_domain([None, float("nan")]) is alt_undefined()


def alt_undefined():
    import altair as alt

    return alt.Undefined
