#!/usr/bin/env bash
# One prepared GPU check for issue 12 (under 8 minutes on one H200). Run from the repository root:
#
#   bash benchmarks/gpu_check.sh                     # on the accelerator machine (results in $OUT)
#   OUT=/tmp/gc bash benchmarks/gpu_check.sh --device cpu --quick   # CPU dry run of the same steps
#
# Uses the machine's preinstalled torch/transformers (installs nothing; no registry needed).
# Models: .gpu_models/<name>/ under the repository (benchmarks/prepare_gpu_models.sh copies them).
# A model dir without model.safetensors (config + tokenizer only, small enough to carry) gets
# random weights of the real architecture, seeded, written to $WORK: scoring throughput and memory
# do not depend on the weight values (the report marks such rows "weights": "random").
#
# Steps (each bounded by `timeout`, each reported even when an earlier one failed):
#   0. environment: torch/transformers/CUDA, and which Python deps are missing
#   1. scoring tokens/s (benchmarks/scoring.py: score vs plain forward, peak RSS/CUDA memory) for
#      smollm2-135m-instruct and gemma-3-270m, float32 and bfloat16, on --device
#   2. device_map="auto" (accelerate) scoring for gemma-3-270m bfloat16
#   3. CUDA vs CPU teacher-forced logprobs on the same ids (max |diff|, nats) for fp32 and bf16
#   4. one audit (benchmarks/gpu_audit.py) against `python3 -m auditor serve` on loopback with the
#      reference on --device — only when the auditor's dependencies are importable
# Results: $OUT/summary.txt (human), $OUT/*.json (machine), $OUT/*.log (each step's output).
set -u
DEVICE=cuda
QUICK=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    *) echo "usage: $0 [--device cuda|cpu] [--quick]" >&2; exit 3 ;;
  esac
done
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
OUT="${OUT:-$REPO/.gpu_check_out}"
WORK="${WORK:-/tmp/spec-auditor-gpu-check}"
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export SPEC_AUDITOR_HOME="$WORK/home"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=python3
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
T_START=$(date +%s)
say() { echo "$*" | tee -a "$SUMMARY"; }
DEADLINE_S=${DEADLINE_S:-460}   # whole-script budget (seconds); each step's timeout is cut to what is left
[[ $QUICK == 1 ]] && DEADLINE_S=${DEADLINE_S_QUICK:-3600}
cap() { local left=$(( DEADLINE_S - ($(date +%s) - T_START) )); (( left < $1 )) && echo $(( left > 0 ? left : 1 )) || echo "$1"; }
if [[ $QUICK == 1 ]]; then
  BENCH_ARGS=(--seqs 6 --prompt-len 16 --cont-len 8 --repeats 1); T_BENCH=240; T_AUDIT=900
else
  BENCH_ARGS=(--seqs 256 --prompt-len 120 --cont-len 64 --repeats 5 --token-budget 16384); T_BENCH=60; T_AUDIT=300
fi

say "== gpu_check $(date -u +%FT%TZ) device=$DEVICE quick=$QUICK repo=$REPO"
# ---- 0. environment
timeout 60 $PY - > "$OUT/env.json" 2> "$OUT/env.log" <<'PYEOF'
import importlib, json, sys
out = {"python": sys.version.split()[0]}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda_available"] = torch.cuda.is_available()
    out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        out["gpu0_mem_gib"] = [round(free / 2**30, 1), round(total / 2**30, 1)]
except Exception as e:  # noqa: BLE001
    out["torch_error"] = repr(e)
missing, present = [], {}
for mod in ("transformers", "safetensors", "numpy", "accelerate", "psutil", "pydantic", "httpx", "tenacity",
            "typer", "rich", "fastapi", "uvicorn", "sqlalchemy", "alembic", "scipy", "platformdirs", "tomli_w"):
    try:
        m = importlib.import_module(mod)
        present[mod] = getattr(m, "__version__", "?")
    except Exception:  # noqa: BLE001
        missing.append(mod)
out["present"] = present
out["missing"] = missing
print(json.dumps(out, indent=2))
PYEOF
say "env: $(tr -d '\n ' < "$OUT/env.json" | head -c 900)"
MISSING=$($PY -c "import json;print(' '.join(json.load(open('$OUT/env.json')).get('missing',[])))" 2>/dev/null || echo "?")
say "missing python deps: ${MISSING:-none}"

# ---- models: .gpu_models/<name> (weights, or config+tokenizer → random weights in $WORK)
declare -A MODEL_DIR
for name in smollm2-135m-instruct gemma-3-270m; do
  src="$REPO/.gpu_models/$name"
  [[ -d "$src" ]] || src="$HOME/.cache/spec-auditor/models/$name"
  if [[ ! -f "$src/config.json" ]]; then say "model $name: not found (.gpu_models/$name); skipped"; continue; fi
  if [[ -f "$src/model.safetensors" ]]; then MODEL_DIR[$name]="$src"; say "model $name: real weights ($src)"; continue; fi
  dst="$WORK/models/$name"
  short="${name%%-*}"   # smollm2 | gemma
  if timeout $(cap 150) $PY - "$src" "$dst" "$REPO/.gpu_models" "$short" > "$OUT/materialize_$name.log" 2>&1 <<'PYEOF'
import hashlib, json, shutil, sys, pathlib, torch
from transformers import AutoConfig, AutoModelForCausalLM
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
gdir, short = pathlib.Path(sys.argv[3]), sys.argv[4]
parts = sorted(gdir.glob(f"{short}.gguf.part*"))
if parts and not (dst / "model.safetensors").is_file():  # real weights from carried GGUF chunks
    try:
        import gguf  # noqa: F401  (transformers' GGUF reader needs it)
        g = dst.parent / f"{short}.gguf"
        g.parent.mkdir(parents=True, exist_ok=True)
        with open(g, "wb") as fh:
            for p in parts:
                fh.write(p.read_bytes())
        want = (gdir / f"{short}.gguf.sha256").read_text().split()[0] if (gdir / f"{short}.gguf.sha256").is_file() else None
        got = hashlib.sha256(g.read_bytes()).hexdigest()
        if want and got != want:
            raise ValueError(f"sha256 {got} != {want}")
        from reference.models import convert_gguf
        convert_gguf(g, dst, src.name, f"carried:{short}.gguf")
        for f in src.iterdir():  # keep the converted tokenizer/chat template of the bundled dir
            if f.name in ("chat_template.jinja",) and not (dst / f.name).exists():
                shutil.copy(f, dst / f.name)
        print("real weights from GGUF chunks", dst)
    except Exception as e:  # noqa: BLE001 - fall back to random weights, reported
        print("GGUF chunks unusable:", repr(e))
if not (dst / "model.safetensors").is_file():
    cfg = AutoConfig.from_pretrained(src)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    m.save_pretrained(dst)
    for f in src.iterdir():
        if f.name not in ("model.safetensors", "config.json", "manifest.json"):
            shutil.copy(f, dst / f.name)
    mf = json.loads((src / "manifest.json").read_text()) if (src / "manifest.json").is_file() else {}
    mf.update({"weights": "random(seed 0) of the real architecture", "revision": "random-seed0"})
    (dst / "manifest.json").write_text(json.dumps(mf, indent=2))
print(dst)
PYEOF
  then MODEL_DIR[$name]="$dst"; say "model $name: $(grep -q 'real weights from GGUF' "$OUT/materialize_$name.log" && echo 'real weights from carried GGUF chunks' || echo 'random weights of the real architecture') ($dst)"
  else say "model $name: could not materialize (see materialize_$name.log)"; fi
done

# ---- 1. scoring throughput, fp32 and bf16
for name in smollm2-135m-instruct gemma-3-270m; do
  [[ -n "${MODEL_DIR[$name]:-}" ]] || continue
  for dt in float32 bfloat16; do
    log="$OUT/score_${name}_${dt}.log"
    if timeout $(cap $T_BENCH) $PY benchmarks/scoring.py --model "${MODEL_DIR[$name]}" --device "$DEVICE" --dtype $dt \
        "${BENCH_ARGS[@]}" --json "$OUT/score_${name}_${dt}.json" > "$log" 2>&1; then
      say "score $name $dt: $(head -1 "$log")"
    else
      say "score $name $dt: FAILED rc=$? (tail: $(tail -2 "$log" | tr '\n' ' ' | head -c 400))"
    fi
  done
done

# ---- 2. device_map="auto"
name=gemma-3-270m; [[ -n "${MODEL_DIR[$name]:-}" ]] || name=smollm2-135m-instruct
if [[ -n "${MODEL_DIR[$name]:-}" && "$DEVICE" != cpu ]]; then
  log="$OUT/score_${name}_device_map_auto.log"
  if timeout $(cap $T_BENCH) $PY benchmarks/scoring.py --model "${MODEL_DIR[$name]}" --device-map auto --dtype bfloat16 \
      "${BENCH_ARGS[@]}" --json "$OUT/score_${name}_device_map_auto.json" > "$log" 2>&1; then
    say "device_map=auto $name bf16: $(head -1 "$log")"
  else
    say "device_map=auto $name bf16: FAILED rc=$? (tail: $(tail -2 "$log" | tr '\n' ' ' | head -c 400))"
  fi
else
  say "device_map=auto: skipped (device=$DEVICE)"
fi

# ---- 3. device vs CPU logprobs on the same ids
name=smollm2-135m-instruct
if [[ -n "${MODEL_DIR[$name]:-}" ]]; then
  timeout $(cap 90) $PY - "${MODEL_DIR[$name]}" "$DEVICE" > "$OUT/device_vs_cpu.json" 2> "$OUT/device_vs_cpu.log" <<'PYEOF'
import json, sys, torch, numpy as np
from reference.models import load_model
from reference.scoring import score_continuations
path, dev = sys.argv[1], sys.argv[2]
g = torch.Generator().manual_seed(1)
V = 49152
prompts = [torch.randint(3, V, (n,), generator=g).tolist() for n in (20, 50, 80, 33)]
conts = [torch.randint(3, V, (n,), generator=g).tolist() for n in (40, 20, 64, 10)]
cpu = score_continuations(load_model(path, "float32", "cpu"), prompts, conts, top_k=5)
out = {}
for dt in ("float32", "bfloat16"):
    lm = load_model(path, dt, dev)
    r = score_continuations(lm, prompts, conts, top_k=5)
    d = np.concatenate([np.abs(a.logprobs - b.logprobs) for a, b in zip(r, cpu)])
    out[dt] = {"device": str(lm.device), "max_abs_diff_vs_cpu_fp32_nats": float(d.max()), "mean_abs_diff": float(d.mean())}
    r2 = score_continuations(lm, prompts[::-1], conts[::-1], top_k=5, token_budget=64)[::-1]  # other batch composition
    d2 = np.concatenate([np.abs(a.logprobs - b.logprobs) for a, b in zip(r, r2)])
    out[dt]["max_abs_diff_batch_composition_nats"] = float(d2.max())
print(json.dumps(out))
PYEOF
  say "device vs cpu logprobs: $(cat "$OUT/device_vs_cpu.json" 2>/dev/null | head -c 600) $(tail -1 "$OUT/device_vs_cpu.log" | head -c 300)"
fi

# ---- 4. one audit against a simulator, reference on the device
NEED="pydantic httpx tenacity typer rich fastapi uvicorn sqlalchemy alembic scipy platformdirs"
LACK=""; for m in $NEED; do [[ " $MISSING " == *" $m "* ]] && LACK="$LACK $m"; done
name=smollm2-135m-instruct
if [[ -n "$LACK" ]]; then
  say "audit: skipped, missing:$LACK"
elif [[ -z "${MODEL_DIR[$name]:-}" ]]; then
  say "audit: skipped, no $name model"
else
  PORT=$($PY -c "import socket;s=socket.socket();s.bind(('127.0.0.1',0));print(s.getsockname()[1])")
  $PY -m auditor serve --profile honest-fp32 --host 127.0.0.1 --port "$PORT" --model "${MODEL_DIR[$name]}" \
      --served-model-name "$name" > "$OUT/serve.log" 2>&1 &
  SPID=$!
  for _ in $(seq 1 120); do
    $PY -c "import urllib.request as u;u.urlopen('http://127.0.0.1:$PORT/health',timeout=1)" 2>/dev/null && break
    sleep 1
  done
  if timeout $(cap $T_AUDIT) $PY benchmarks/gpu_audit.py --model "${MODEL_DIR[$name]}" --base-url "http://127.0.0.1:$PORT/v1" \
      --served-name "$name" --out "$OUT/audit" --device "$DEVICE" > "$OUT/audit.log" 2>&1; then
    say "audit (honest-fp32 simulator, reference on $DEVICE): $(tail -1 "$OUT/audit.log")"
  else
    say "audit: FAILED rc=$? (tail: $(tail -3 "$OUT/audit.log" | tr '\n' ' ' | head -c 600))"
  fi
  kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null
  rm -f "$OUT/audit/audit.db"*
fi
say "== done in $(( $(date +%s) - T_START )) s"
