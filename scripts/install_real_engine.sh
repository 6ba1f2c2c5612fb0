#!/usr/bin/env bash
# Install the real inference engine of the test bench (issue 13): llama.cpp's OpenAI-compatible
# server through llama-cpp-python[server]==0.3.36, built from its sdist for a portable x86-64 CPU
# (AVX2/FMA/F16C; no AVX-512/AMX: a native build dies with "Illegal instruction" on machines
# whose CPU differs from the build host's). The build takes about 6 minutes on 2 cores, so the
# wheel is cached outside the repository and reused:
#   $SPEC_AUDITOR_WHEELS (default ~/.cache/spec-auditor-wheels)/llama_cpp_python-0.3.36-*.whl
# Only the engine and the three server dependencies the project does not already install
# (diskcache, sse-starlette, starlette-context) are added, with --no-deps, so the project's own
# pinned numpy/fastapi/pydantic are left as they are.
# Usage: scripts/install_real_engine.sh        (idempotent; `make test-real` calls it)
set -euo pipefail
PY=${PY:-python3}
VERSION=0.3.36
WHEELS=${SPEC_AUDITOR_WHEELS:-$HOME/.cache/spec-auditor-wheels}
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF"

if "$PY" -c "import llama_cpp, llama_cpp.server, sys; sys.exit(0 if llama_cpp.__version__ == '$VERSION' else 1)" 2>/dev/null; then
    echo "llama-cpp-python $VERSION already installed"
    exit 0
fi
mkdir -p "$WHEELS"
whl=$(ls "$WHEELS"/llama_cpp_python-$VERSION-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$whl" ]; then
    echo "building llama-cpp-python $VERSION from its sdist (about 6 minutes on 2 cores) into $WHEELS"
    "$PY" -m pip wheel --no-binary llama-cpp-python -w "$WHEELS" "llama-cpp-python[server]==$VERSION"
    whl=$(ls "$WHEELS"/llama_cpp_python-$VERSION-*.whl | head -n1)
fi
"$PY" -m pip install -q --no-deps "$whl"
# server extras not already installed by the project (looked up in the cache first)
for req in diskcache sse-starlette starlette-context; do
    mod=${req//-/_}
    if ! "$PY" -c "import $mod" 2>/dev/null; then
        "$PY" -m pip install -q --no-deps --find-links "$WHEELS" "$req"
    fi
done
"$PY" -c "import llama_cpp, llama_cpp.server; print('llama-cpp-python', llama_cpp.__version__, 'installed')"
