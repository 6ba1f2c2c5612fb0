"""`auditor calibrate --merge`: parts of a calibration (profile subsets run apart) join into one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auditor.calibration import merge_outputs, write_record_files

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _committed() -> tuple[list[dict], dict]:
    recs = json.loads((DOCS / "calibration.json").read_text(encoding="utf-8"))
    meta = json.loads((DOCS / "calibration.meta.json").read_text(encoding="utf-8"))
    return recs, meta


def _one_run(meta: dict) -> dict:
    """The meta of one run (the committed file is a merge: its ``parts`` say which runs it joins)."""
    return {k: v for k, v in meta.items() if k != "parts"}


def test_parts_merge_back_into_the_whole(tmp_path: Path) -> None:
    recs, meta = _committed()
    meta = _one_run(meta)
    profiles = list(dict.fromkeys(r["profile"] for r in recs))
    half = set(profiles[: len(profiles) // 2])
    a = [r for r in recs if r["profile"] in half]
    b = [r for r in recs if r["profile"] not in half]
    write_record_files(a, {**meta, "profiles": [p for p in profiles if p in half]}, tmp_path / "a")
    write_record_files(b, {**meta, "profiles": [p for p in profiles if p not in half]}, tmp_path / "b")
    merged, mmeta = merge_outputs([tmp_path / "a", tmp_path / "b"])
    key = lambda r: (r["profile"], r.get("mix"), r["budget_tokens"], r.get("design", "fixed"))
    assert sorted(map(key, merged)) == sorted(map(key, recs))
    assert mmeta["profiles"] == profiles
    assert [p["dir"] for p in mmeta["parts"]] == [str(tmp_path / "a"), str(tmp_path / "b")]
    paths = write_record_files(merged, mmeta, tmp_path / "out")
    assert all(p.is_file() for p in paths.values())


def test_remerging_a_merge_keeps_its_parts(tmp_path: Path) -> None:
    """Cells re-run and merged into docs/ (``--merge docs,NEW --out docs``): the merged meta lists the runs docs/
    joined, then the new one — not one part called "docs" that hides where the cells came from."""
    recs, meta = _committed()
    meta = _one_run(meta)
    write_record_files(recs[:2], meta, tmp_path / "a")
    write_record_files(recs[2:4], meta, tmp_path / "b")
    first, first_meta = merge_outputs([tmp_path / "a", tmp_path / "b"])
    write_record_files(first, first_meta, tmp_path / "docs")
    write_record_files(recs[4:5], meta, tmp_path / "c")
    merged, mmeta = merge_outputs([tmp_path / "docs", tmp_path / "c"])
    assert [p["dir"] for p in mmeta["parts"]] == [str(tmp_path / x) for x in ("a", "b", "c")]
    assert len(merged) == 5


def test_a_later_part_replaces_the_same_cell(tmp_path: Path) -> None:
    recs, meta = _committed()
    one = [r for r in recs if r.get("design", "fixed") == "fixed"][:1]
    changed = [{**one[0], "audits": 7}]
    write_record_files(one, meta, tmp_path / "a")
    write_record_files(changed, meta, tmp_path / "b")
    merged, _ = merge_outputs([tmp_path / "a", tmp_path / "b"])
    assert [r["audits"] for r in merged] == [7]


def test_merge_refuses_mismatched_runs_and_missing_files(tmp_path: Path) -> None:
    recs, meta = _committed()
    write_record_files(recs[:1], meta, tmp_path / "a")
    write_record_files(recs[:1], {**meta, "seed": 99}, tmp_path / "b")
    with pytest.raises(ValueError, match="seed"):
        merge_outputs([tmp_path / "a", tmp_path / "b"])
    with pytest.raises(ValueError, match=r"lacks calibration\.json"):
        merge_outputs([tmp_path / "a", tmp_path / "nothing"])


def test_cli_empty_out_means_no_output_not_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    """`--out ""` must not turn into Path("") == "." (the pool-building runs once wrote
    calibration.* into the checkout's root that way)."""
    from typer.testing import CliRunner

    from auditor.cli import app

    recs, meta = _committed()
    write_record_files(recs, meta, tmp_path / "a")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["calibrate", "--merge", str(tmp_path / "a"), "--out", ""])
    assert res.exit_code != 0 and "--merge needs --out" in res.output, res.output
    assert not list(tmp_path.glob("calibration.*"))
    res = CliRunner().invoke(app, ["calibrate", "--merge", str(tmp_path / "a"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "o" / "calibration.json").is_file()
