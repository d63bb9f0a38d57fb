#!/usr/bin/env bash
# Remeasures every headline ratio against PyTorch in one run and writes one table:
#   MNIST trainer (1 and 2 threads, fp32 and bf16 autocast), the ResNet and GPT training steps,
#   DDP on 2 ranks (MNIST scaling; the MLP's compute-only step, DDP step and all-reduce at bucket cap
#   25 MiB), the all-reduce by size (engine in place against Gloo's ring), and Tandem's kernels alone
#   (kernels_bench: the GEMM peak f32 and bf16 at 1 and 2 threads, the core's multiply-add peak, each conv
#   and linear case at 1 thread).
# Everything goes to a fresh folder bench/runs/<date-time>/ (or --out DIR, which must not exist yet):
# each script's JSON, each child's log, and table.md (bench/headline.py), which names the CPU model and
# flags and the PyTorch version. 6-16 minutes on 2 cores (as fast as the machine runs); --quick checks the
# pipeline in about 3.
# Run it on a quiet machine: each script warns when the load average says something else is running.
# Usage: bash bench/run_all.sh [--build DIR] [--out DIR] [--quick] [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=build OUT="" QUICK=0 MAKE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --no-build) MAKE=0; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_all.sh: unknown argument '$1' (expected --build DIR, --out DIR, --quick or --no-build)" >&2; exit 2 ;;
  esac
done
PY=/usr/bin/python3
if ! $PY -c 'import torch' 2>/dev/null; then
  echo "run_all.sh: $PY cannot import torch: run 'bash scripts/setup.sh --for test' (it installs Debian's PyTorch)" >&2
  exit 1
fi
if [ -z "$OUT" ]; then
  OUT=bench/runs/$(date +%Y%m%d-%H%M%S)
elif [ -e "$OUT" ]; then
  echo "run_all.sh: $OUT exists: name a new folder (results are never written over)" >&2
  exit 2
fi
mkdir -p "$OUT/logs"
if [ "$MAKE" = 1 ]; then
  echo "run_all: building the benchmark targets in $BUILD"
  cmake --build "$BUILD" -j"$(nproc)" --target tandem-mnist tandem-run model_steps allreduce_bench ddp_buckets kernels_bench \
    >"$OUT/logs/build.log" 2>&1 || { tail -20 "$OUT/logs/build.log"; exit 1; }
fi

if [ "$QUICK" = 1 ]; then
  REPEATS=1 MNIST=(--limit 1280 --test-limit 200) MODELS=(--iters 3 --warmup 1) DDP=(--limit 1280 --epochs 2)
  BUCKETS=(--quick) SIZES=1M,4M KERNELS=(--benchmark_repetitions=1 --benchmark_min_time=0.05)
else
  REPEATS=3 MNIST=() MODELS=() DDP=() BUCKETS=() SIZES=1M,4M,25M,100M
  KERNELS=(--benchmark_repetitions=3 --benchmark_min_time=0.2)  # headline.py takes the median
fi
step() {  # step NAME COMMAND...: runs one benchmark, its output in logs/NAME.log
  local name=$1 t0=$SECONDS; shift
  echo "run_all: $name"
  if ! "$@" >"$OUT/logs/$name.log" 2>&1; then
    tail -20 "$OUT/logs/$name.log"
    echo "run_all: $name failed (log: $OUT/logs/$name.log)" >&2
    exit 1
  fi
  echo "run_all: $name done in $((SECONDS - t0)) s"
}
TM=$BUILD/apps/tandem-mnist TR=$BUILD/apps/tandem-run
step kernels "$BUILD/bench/kernels_bench" '--benchmark_filter=^BM_(FmaPeak|GemmPeak|Conv2d|Linear)' "${KERNELS[@]}" \
  --benchmark_out="$OUT/kernels.json" --benchmark_out_format=json
step mnist $PY bench/compare_pytorch.py --tandem-bin "$TM" --threads 1,2 --repeats $REPEATS "${MNIST[@]}" \
  --json-out "$OUT/compare_pytorch.json"
step mnist_bf16 $PY bench/compare_pytorch.py --tandem-bin "$TM" --threads 1,2 --repeats $REPEATS --amp bf16 --own-fp32 \
  "${MNIST[@]}" --json-out "$OUT/compare_pytorch_bf16.json"
step models $PY bench/compare_models.py --tandem-bin "$BUILD/bench/model_steps" --threads 1,2 --repeats $REPEATS \
  "${MODELS[@]}" --json-out "$OUT/compare_models.json"
step models_bf16 $PY bench/compare_models.py --tandem-bin "$BUILD/bench/model_steps" --threads 1,2 --repeats $REPEATS \
  --amp bf16 --own-fp32 "${MODELS[@]}" --json-out "$OUT/compare_models_bf16.json"
step ddp $PY bench/compare_ddp.py --tandem-bin "$TM" --tandem-run "$TR" --repeats $REPEATS \
  --only tandem1,tandem2,pytorch1,pytorch2 "${DDP[@]}" --json-out "$OUT/compare_ddp.json"
step ddp_buckets $PY bench/ddp_buckets.py --build "$BUILD" --models mlp --caps 25 "${BUCKETS[@]}" \
  --json-out "$OUT/ddp_buckets.json"
step allreduce "$TR" --standalone --nproc-per-node 2 "$BUILD/bench/allreduce_bench" --sizes=$SIZES \
  '--benchmark_filter=^(engine_buffer|gloo_ring)/' --benchmark_out="$OUT/allreduce.json" --benchmark_out_format=json
$PY bench/headline.py "$OUT"
