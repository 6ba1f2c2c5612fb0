"""The speed-profile section of the dashboard's Speed vs fidelity page (pure frame/chart builders)."""

from __future__ import annotations

import datetime as dt


def run_row(provider: str, cells: list[dict]) -> dict:
    return {"provider_name": provider, "run_id": f"{provider}-run", "started_at": dt.datetime(2026, 11, 30, tzinfo=dt.UTC),
            "summary": {"kind": "speed-profile", "cells": cells}}


def cell(workload: str, conc: int, tps: float, m: float | None, detected: bool | None) -> dict:
    return {"workload": workload, "concurrency": conc, "ttft_median_s": 0.1, "tpot_median_s": 1 / tps,
            "tokens_per_s_median": tps, "throughput_tokens_per_s": tps * conc, "tpot_ratio_vs_chat": 1.0,
            "speculation": {"detected": detected, "mean_accepted_tokens_per_step": m,
                            "ci95": [m - 0.2, m + 0.2] if m else None}}


def test_frame_and_chart():
    from dashboard.views.speed import speed_cells_frame, speed_profile_chart

    runs = [run_row("fast", [cell("repetition", 1, 90.0, 3.2, True), cell("chat", 1, 40.0, 1.1, None)]),
            run_row("plain", [cell("chat", 1, 30.0, 1.0, False), cell("chat", 4, 25.0, None, None)]),
            {"provider_name": "broken", "run_id": "x", "started_at": None, "summary": {"cells": "oops"}}]
    df = speed_cells_frame(runs)
    assert len(df) == 4 and set(df["provider"]) == {"fast", "plain"}
    rep = df[df["workload"] == "repetition"].iloc[0]
    assert rep["speculates"] == "yes" and rep["tokens_per_step"] == 3.2 and abs(rep["tpot_ms"] - 1000 / 90) < 1e-9
    assert list(df["speculates"]) == ["yes", "cannot tell", "no", "cannot tell"]
    spec = speed_profile_chart(df).to_dict()
    assert len(spec["hconcat"]) == 2
