# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Both create .venv (CPU builds of paddlepaddle 3.3.1 and torch 2.13.0) on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint test-gpu bench-dispatch clean test-paddle26 test-paddleformers

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "paddlepaddle==3.3.1" "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test,bench,hf]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/decode_loop.py

lint: $(STAMP)
	$(PY) -m ruff check graphjit tests examples tools
	$(PY) -m mypy graphjit --ignore-missing-imports

test: $(STAMP) lint
	$(PY) -m pytest -q -m "not gpu" tests

# The CPU suite again under paddlepaddle 2.6.2, the Paddle of the GPU proofs (no torch there: its
# tests skip). CI runs it after `make test`.
VENV26 := .venv26
STAMP26 := $(VENV26)/.installed

$(STAMP26): pyproject.toml
	$(PYTHON) -m venv $(VENV26)
	$(VENV26)/bin/python -m pip install -q --upgrade pip
	$(VENV26)/bin/python -m pip install -q "paddlepaddle==2.6.2"
	$(VENV26)/bin/python -m pip install -q -e ".[test,bench]"
	touch $(STAMP26)

test-paddle26: $(STAMP26)
	$(VENV26)/bin/python -m pytest -q -m "not gpu" tests -p no:cacheprovider

# PaddleFormers' Llama decode through @graphed (tests/test_paddleformers_decode.py and its example) in a
# venv of its own: paddleformers pins numpy and transformers below what .venv's torch tests use. CI runs it.
VENVPF := .venvpf
STAMPPF := $(VENVPF)/.installed

$(STAMPPF): pyproject.toml
	$(PYTHON) -m venv $(VENVPF)
	$(VENVPF)/bin/python -m pip install -q --upgrade pip
	$(VENVPF)/bin/python -m pip install -q "paddlepaddle==3.3.1" paddleformers
	$(VENVPF)/bin/python -m pip install -q -e ".[test]"
	touch $(STAMPPF)

test-paddleformers: $(STAMPPF)
	$(VENVPF)/bin/python -m pytest -q -m "not gpu" tests/test_paddleformers_decode.py \
		"tests/test_examples.py::test_example_runs[paddleformers_decode]" -p no:cacheprovider

# On the GPU machine: runs from the source tree, installs nothing (python3 there has torch;
# Paddle through the kit: `. /tmp/pdc/env.sh && make test-gpu-paddle`). Each GPU test file runs in a
# process of its own, a few at a time (tools/gpu_tests.py).
test-gpu:
	python3 tools/gpu_tests.py -m "gpu and not paddle" -j 4

test-gpu-paddle:
	$$PY311 tools/gpu_tests.py -m "gpu and paddle" -j 3 --python $$PY311

bench-dispatch: $(STAMP)
	$(PY) -m graphjit bench dispatch

clean:
	rm -rf $(VENV) $(VENV26) $(VENVPF) .pytest_cache .ruff_cache
