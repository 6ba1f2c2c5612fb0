"""Detection benchmark (issue 7): false-accusation rate and power per simulator profile × token budget.

A thin wrapper around ``auditor calibrate`` (code: ``auditor/calibration/``): collects one pool of
provider outputs per simulator profile (cached under the user cache dir, so re-runs are cheap),
resamples many audits per budget, and writes docs/calibration.json, docs/calibration.md and
docs/calibration.png; the cells are also stored in the audit database (``calibration_results``,
the dashboard's Calibration page).

Usage:
    python benchmarks/detection.py                       # the full benchmark (all profiles)
    python benchmarks/detection.py --audits 50 --profiles honest-fp32,int4 --out /tmp/cal
Any ``auditor calibrate`` option is accepted (``python -m auditor calibrate --help``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    """Run ``auditor calibrate`` with ``argv`` and report the wall time."""
    from typer.main import get_command

    from auditor.cli import app

    args = list(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    try:
        get_command(app).main(["calibrate", *args], standalone_mode=False)
        code = 0
    except SystemExit as exc:  # typer.Exit
        code = int(exc.code or 0)
    except Exception as exc:
        code = int(getattr(exc, "exit_code", 1) or 1)
        print(f"error: {exc}", file=sys.stderr)
    print(f"detection benchmark finished in {time.perf_counter() - t0:.0f} s (exit {code})", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
