#!/usr/bin/env bash
# CI stage: bounded libFuzzer runs of every target in fuzz/ (clang, ASan+UBSan, the library
# instrumented for coverage), each starting from its committed seed corpus fuzz/corpus/<target>
# copied to a scratch directory (new inputs are not committed automatically). A crash, a
# sanitizer report, a leak, an input slower than 10 s or a run above 2 GiB RSS fails the stage;
# the reproducer is left under <build dir>/artifacts/ (add it to the corpus and to a regression
# test once fixed). Prints executions per target.
# Environment: FUZZ_TIME (seconds per target, default 60), JOBS (build, default nproc),
# FUZZ_TARGETS (default: every fuzz_* target that was built), FUZZ_BUILD_DIR (a build dir configured
# elsewhere with TANDEM_FUZZ=ON and fuzzer-no-link among its sanitizers: the sanitizer stage's build-asan,
# which .ci/run passes; without it, build-fuzz is configured here). Built at -O1 -g1 (as the sanitizer
# stage); the targets run JOBS at a time, each on one core.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
FUZZ_TIME=${FUZZ_TIME:-60}
JOBS=${JOBS:-$(nproc)}
if [[ -n "${FUZZ_BUILD_DIR:-}" ]]; then
  source "$ROOT/scripts/ci/reuse_build.sh"
  BUILD=$(reuse_build fuzz.sh FUZZ_BUILD_DIR "$FUZZ_BUILD_DIR" 'TANDEM_FUZZ:BOOL=ON' \
    'TANDEM_SANITIZE:STRING=address,undefined,fuzzer-no-link')
  echo "fuzz.sh: the fuzz targets of $BUILD (configured for fuzzing elsewhere)"
else
  BUILD=$ROOT/build-fuzz
  source "$ROOT/scripts/ci/ccache.sh"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DTANDEM_FUZZ=ON -DTANDEM_CUDA=OFF \
    -DTANDEM_BUILD_BENCH=OFF -DTANDEM_BUILD_TESTS=OFF -DTANDEM_SANITIZE=address,undefined,fuzzer-no-link \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1" "${launcher[@]}" >/dev/null
fi
targets=${FUZZ_TARGETS:-$(cmake --build "$BUILD" --target help | grep -oE '^fuzz_[a-z_]+' | sort -u)}
cmake --build "$BUILD" -j"$JOBS" --target $targets

mkdir -p "$BUILD/artifacts"
# fuzz_one TARGET: one bounded run; its summary line goes to $BUILD/TARGET.summary, exit status 1 on a finding.
fuzz_one() {
  local t=$1 work=$BUILD/corpus-work/$1 log=$BUILD/$1.log dict=()
  rm -rf "$work" && mkdir -p "$work"
  cp "$ROOT/fuzz/corpus/${t#fuzz_}/"* "$work/" 2>/dev/null || true
  [ -f "$ROOT/fuzz/${t#fuzz_}.dict" ] && dict=(-dict="$ROOT/fuzz/${t#fuzz_}.dict")
  rm -f "$BUILD/artifacts/$t-"*  # only this run's reproducers are reported
  if ! ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=0" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
      "$BUILD/fuzz/$t" "$work" "${dict[@]}" -max_total_time="$FUZZ_TIME" -rss_limit_mb=2048 -timeout=10 \
      -max_len=8192 -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$t-" >"$log" 2>&1; then
    return 1
  fi
  local runs cov
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || echo '?')
  echo "  $t: $runs executions in ${FUZZ_TIME}s, coverage $cov edges, corpus $(ls "$work" | wc -l) inputs" \
    >"$BUILD/$t.summary"
}
# Each libFuzzer run is one process on one core: JOBS of them at a time.
declare -A pid_of
for t in $targets; do
  while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n || true; done
  echo "fuzz.sh: $t for ${FUZZ_TIME}s"
  rm -f "$BUILD/$t.summary"
  fuzz_one "$t" &
  pid_of[$t]=$!
done
failed=()
for t in $targets; do wait "${pid_of[$t]}" || failed+=("$t"); done
for t in "${failed[@]}"; do
  tail -n 60 "$BUILD/$t.log"
  echo "fuzz.sh: $t FAILED; reproducer(s): $(ls "$BUILD/artifacts/$t-"* 2>/dev/null | tr '\n' ' ')" >&2
done
((${#failed[@]} == 0)) || exit 1
echo "fuzz.sh: all targets passed"
for t in $targets; do cat "$BUILD/$t.summary"; done
