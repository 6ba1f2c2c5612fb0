"""One ``auditor check`` against a simulator with the reference model on CUDA (used by gpu_check.sh).

The simulator (``python3 -m auditor serve``, CPU) must already listen on ``--base-url``; this writes a
providers file, then runs the audit pipeline (``auditor.check.pipeline.run_check``) with the reference
loaded on ``--device`` in float32 and bfloat16 (``auditor check`` itself has no device option yet),
and prints one JSON line: verdict, exit code, wall seconds, reference devices.

Usage: python benchmarks/gpu_audit.py --model DIR --base-url http://127.0.0.1:PORT/v1 --served-name NAME
                                      --out DIR [--device cuda] [--suite smoke]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--served-name", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--suite", default="smoke")
    ap.add_argument("--api", default="chat", choices=["chat", "completions"])
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "providers.toml").write_text(
        f'[providers.gpu-sim]\nbase_url = "{a.base_url}"\nmodel = "{a.served_name}"\napi = "{a.api}"\n'
        f'reference = "{a.model}"\ntimeout_s = 120\n'
    )
    from auditor.check.pipeline import run_check
    from reference.models import load_model

    t = time.perf_counter()
    lms = {dt: load_model(a.model, dtype=dt, device=a.device) for dt in ("float32", "bfloat16")}
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    seen: dict[str, float] = {}

    def progress(stage: str, done: int, total: int) -> None:  # one line per stage start and end, timestamped
        if stage not in seen or done == total:
            seen.setdefault(stage, time.perf_counter())
            print(f"[{time.perf_counter() - t:7.1f}s] {stage}: {done}/{total}", file=sys.stderr, flush=True)

    rep = run_check("gpu-sim", progress=progress, config_path=str(out / "providers.toml"), db_url=f"sqlite:///{out / 'audit.db'}",
                    suite=a.suite, reference_models=lms, floors_cache_dir=str(out / "floors"))
    res = {
        "verdict": getattr(rep, "verdict", None),
        "exit_code": getattr(rep, "exit_code", None),
        "check_wall_s": round(time.perf_counter() - t, 2),
        "reference_load_s": round(load_s, 2),
        "reference_devices": {dt: str(lm.device) for dt, lm in lms.items()},
        "suite": a.suite,
    }
    print(json.dumps(res))
    (out / "audit_result.json").write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
