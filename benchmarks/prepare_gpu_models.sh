#!/usr/bin/env bash
# Put the bundled reference models under .gpu_models/ (git-ignored) for benchmarks/gpu_check.sh on an
# accelerator machine that reaches no package registry.
#
#   bash benchmarks/prepare_gpu_models.sh          # config + tokenizer + manifest only (~37 MB: fits a
#                                                  # 64 MiB carry); gpu_check.sh then builds seeded random
#                                                  # weights of the real architecture on the machine
#   bash benchmarks/prepare_gpu_models.sh --full   # also the float32 weights (0.5 GB + 1.1 GB)
#
# Carry it with the run: carry = [".gpu_models"]. Models are pulled (converted) here when missing.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$REPO/.gpu_models"
FULL=0
[[ "${1:-}" == "--full" ]] && FULL=1
CACHE="$(cd "$REPO" && python3 -c 'from reference.models import model_cache_dir; print(model_cache_dir())')"
mkdir -p "$DEST"
for name in smollm2-135m-instruct gemma-3-270m; do
  if [[ ! -f "$CACHE/$name/manifest.json" ]]; then
    (cd "$REPO" && python3 -m auditor models pull "$name") || echo "warning: could not pull $name" >&2
  fi
  if [[ ! -f "$CACHE/$name/manifest.json" ]]; then
    echo "skipped $name (not converted; run: python3 -m auditor models pull $name)" >&2
    continue
  fi
  rm -rf "$DEST/$name"
  mkdir -p "$DEST/$name"
  for f in "$CACHE/$name"/*; do
    [[ "$(basename "$f")" == model.safetensors && $FULL == 0 ]] && continue
    cp "$f" "$DEST/$name/"
  done
  echo "copied $name -> $DEST/$name ($(du -sh "$DEST/$name" | cut -f1)$([[ $FULL == 0 ]] && echo ', no weights'))"
done
du -sh "$DEST"
