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
