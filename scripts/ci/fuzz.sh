#!/usr/bin/env bash
# CI stage: bounded libFuzzer runs of every target in fuzz/ (clang, ASan+UBSan, the library
# instrumented for coverage), each starting from its committed seed corpus fuzz/corpus/<target>
# copied to a scratch directory (new inputs are not committed automatically). A crash, a
# sanitizer report, a leak, an input slower than 10 s or a run above 2 GiB RSS fails the stage;
# the reproducer is left under build-fuzz/artifacts/ (add it to the corpus and to a regression
# test once fixed). Prints executions per target.
# Environment: FUZZ_TIME (seconds per target, default 60), JOBS (build, default nproc),
# FUZZ_TARGETS (default: every fuzz_* target that was built).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
FUZZ_TIME=${FUZZ_TIME:-60}
JOBS=${JOBS:-$(nproc)}
BUILD=$ROOT/build-fuzz
source "$ROOT/scripts/ci/ccache.sh"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DTANDEM_FUZZ=ON -DTANDEM_CUDA=OFF \
  -DTANDEM_BUILD_BENCH=OFF -DTANDEM_BUILD_TESTS=OFF -DTANDEM_SANITIZE=address,undefined,fuzzer-no-link \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null
targets=${FUZZ_TARGETS:-$(cmake --build "$BUILD" --target help | grep -oE '^fuzz_[a-z_]+' | sort -u)}
cmake --build "$BUILD" -j"$JOBS" --target $targets

mkdir -p "$BUILD/artifacts"
summary=""
for t in $targets; do
  work=$BUILD/corpus-work/$t
  rm -rf "$work" && mkdir -p "$work"
  cp "$ROOT/fuzz/corpus/${t#fuzz_}/"* "$work/" 2>/dev/null || true
  dict=()
  [ -f "$ROOT/fuzz/${t#fuzz_}.dict" ] && dict=(-dict="$ROOT/fuzz/${t#fuzz_}.dict")
  rm -f "$BUILD/artifacts/$t-"*  # only this run's reproducers are reported
  log=$BUILD/$t.log
  echo "fuzz.sh: $t for ${FUZZ_TIME}s"
  if ! ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=0" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
      "$BUILD/fuzz/$t" "$work" "${dict[@]}" -max_total_time="$FUZZ_TIME" -rss_limit_mb=2048 -timeout=10 \
      -max_len=8192 -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$t-" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz.sh: $t FAILED; reproducer(s): $(ls "$BUILD/artifacts/$t-"* 2>/dev/null | tr '\n' ' ')" >&2
    exit 1
  fi
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || echo '?')
  summary+="  $t: $runs executions in ${FUZZ_TIME}s, coverage $cov edges, corpus $(ls "$work" | wc -l) inputs"$'\n'
done
echo "fuzz.sh: all targets passed"
printf '%s' "$summary"
