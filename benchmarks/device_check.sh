#!/usr/bin/env bash
# One GPU check, under 5 minutes: the Pallas kernel tests compiled for the real device (no interpret mode),
# then the kernel benchmark, then a short summary. Run on the lent GPU machine from the repository root:
#   bash benchmarks/device_check.sh
# Needs jax with CUDA (pip install -U "jax[cuda12]") plus this package's test extra.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
python -c "import jax; print('devices:', jax.devices())" | tee "$out/device_check.log"
# On a GPU host the kernels' default is compiled (interpret only when the JAX platform is CPU), so the "gpu"
# variants run as real Triton kernels; the "tpu" variants still run under the TPU interpreter.
timeout 200 python -m pytest -q tests/kernels/test_pallas_tree.py \
  tests/kernels/test_pallas_decode.py -x 2>&1 | tail -15 | tee -a "$out/device_check.log"
timeout 90 python benchmarks/kernels.py --models smollm2-135m-instruct --repeats 2 \
  --out "$out/kernels_gpu.json" 2>&1 | tail -5 | tee -a "$out/device_check.log"
echo "summary:" | tee -a "$out/device_check.log"
grep -E "passed|failed|packed" "$out/device_check.log" | tee -a "$out/device_check.log"
# Sharded execution on the real device(s): tiny Llama/Gemma 3 through the sharded runner (explicit in/out
# shardings) vs the single-device runner, and the sharded dense top-k; one mesh over every visible GPU.
ndev=$(python -c "import jax; print(len(jax.devices()))")
timeout 120 python -m specrag_jax.parallel.checks tiny dense --spec "model=$ndev" 2>&1 | tail -1 \
  | tee "$out/parallel_check.json" | cut -c1-600 | tee -a "$out/device_check.log"
# Table 1 slice (issue 25): up to 3 questions of every benchmark file the machine has ($SPECRAG_SUITE, else
# eval_data/ beside or inside the repository: the Self-RAG eval files and MuSiQue), else the dev set (or the
# repository's two-question fixture) converted into Self-RAG and MuSiQue files. The default model pair; if it cannot
# load (no built adapter, no verifier package), the drafter without its adapter, then SmolLM2 for both. SUITE_TIMEOUT
# (seconds per try, default 200) gives a CPU run time.
suite="${SPECRAG_SUITE:-}"
for d in eval_data ../eval_data shared/eval_data ../shared/eval_data; do
  [ -z "$suite" ] && [ -d "$d" ] && suite="$d"
done
work=$(mktemp -d)
if [ -z "$suite" ]; then
  src=tests/pipeline/data/mini_eval.jsonl every=1
  for f in ../shared/data/retrievalqa_dev.jsonl shared/data/retrievalqa_dev.jsonl; do
    [ "$every" = 1 ] && [ -f "$f" ] && src="$f" every=34  # the dev set is sorted by source: rows 1, 35, 69
  done
  suite="$work/data"
  mkdir -p "$suite"
  for fmt in selfrag musique; do
    python benchmarks/convert_formats.py --data "$src" --to "$fmt" --out "$suite/dev_$fmt.jsonl" --limit 3 \
      --every "$every"
  done
fi
echo "suite: $suite ($(ls "$suite" | tr '\n' ' '))" | tee -a "$out/device_check.log"
# --max-seq-len 4096: MuSiQue's 15 passages of up to 160 tokens (each model is capped at its own context)
for pair in "" "--drafter-adapter none" "--drafter-adapter none --verifier smollm2-135m-instruct"; do
  # shellcheck disable=SC2086
  timeout "${SUITE_TIMEOUT:-200}" python -m specrag_jax.cli eval --suite "$suite" --limit 3 --max-seq-len 4096 \
    --methods standard,speculative,drafter_only --out "$work/suite" --quiet $pair > "$out/suite_table.md" \
    2> "$work/suite.err"
  rc=$?
  if [ "$rc" = 0 ]; then
    cp "$work/suite/table.json" "$out/suite_table.json"
    break
  fi
  echo "suite with '${pair:-the default pair}' failed (exit $rc): $(tail -1 "$work/suite.err")" \
    | tee -a "$out/device_check.log"
  [ "$rc" = 124 ] && break  # it loaded and ran out of time: another pair would not be faster
done
grep -E "^\| (standard|speculative|drafter_only) \|" "$out/suite_table.md" | head -3 | tee -a "$out/device_check.log"
