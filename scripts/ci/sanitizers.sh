#!/usr/bin/env bash
# CI stage: the unit and dist suites under AddressSanitizer + UndefinedBehaviorSanitizer,
# then the threaded parts (store server, process group, reducer/DDP, data loader) under
# ThreadSanitizer. Own build dirs (build-asan, build-tsan), clang (it compiles these builds faster than
# gcc: docs/reliability.md), CPU only, no benchmarks, -O1.
# The ASan build is portable (TANDEM_NATIVE=OFF: x86-64 baseline, no AVX-512), so the kernels'
# generic paths, which machines without AVX-512 run, are tested too; the main suite and TSan
# test the build machine's native paths.
# The ASan build is clang's and is also the fuzzing build: the engine is instrumented for libFuzzer's
# coverage as well (fuzzer-no-link) and the fuzz/ targets are built there, so that scripts/ci/fuzz.sh
# (FUZZ_BUILD_DIR=build-asan, set by .ci/run) runs them without compiling the engine once more.
# ASan+UBSan instrument the engine, the apps and the sanitizer runtime's interceptors, not the tests' own
# sources (TANDEM_SANITIZE_TEST_CODE=OFF: their instrumented compile was half of the stage); TSan
# instruments everything, since it must see the tests' synchronisation too.
# Any sanitizer report fails the test that triggered it (-fno-sanitize-recover=all, and
# halt_on_error below), which fails this script.
# Budget: measured on the 2-core dev machine (see docs/reliability.md); keep it under
# ~35 min. Environment: JOBS (default nproc), SAN_STAGES ("asan tsan" by default),
# CTEST_TIMEOUT (per test, default 900 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
JOBS=${JOBS:-$(nproc)}
STAGES=${SAN_STAGES:-asan tsan}
CTEST_TIMEOUT=${CTEST_TIMEOUT:-900}
source "$ROOT/scripts/ci/ccache.sh"

configure() {  # configure <dir> <sanitizers> <native: ON/OFF> <instrument the tests' own code: ON/OFF> [cmake args]
  cmake -S "$ROOT" -B "$ROOT/$1" -G Ninja -DTANDEM_CUDA=OFF -DTANDEM_BUILD_BENCH=OFF \
    -DTANDEM_SANITIZE="$2" -DTANDEM_NATIVE="$3" -DTANDEM_SANITIZE_TEST_CODE="$4" "${@:5}" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1" "${launcher[@]}" >/dev/null
}

# The tests ThreadSanitizer runs: everything with threads of ours in it.
TSAN_TESTS='^(ThreadPool|TCPStore|StoreSecurity|Store/StoreKinds|GlooGroup|ShmGroup|Ranks/GlooRanks|MakeProcessGroup|Ddp|DdpEquivalence|Reducer|CommHook|SyncBatchNorm|DataLoader)[./]'

for stage in $STAGES; do
  t0=$SECONDS
  case $stage in
    asan)
      configure build-asan address,undefined,fuzzer-no-link OFF OFF -DCMAKE_CXX_COMPILER=clang++ -DTANDEM_FUZZ=ON
      # The executables behind the unit and dist labels (only the folders that have tests), and the fuzz targets.
      targets=$(cmake --build build-asan --target help |
        grep -oE 'tandem_(core|kernels|nn|optim|data|train|dist)_tests|^fuzz_[a-z_]+' | sort -u)
      cmake --build build-asan -j"$JOBS" --target $targets tandem-run tandem-mnist
      # Leak checking on; the child processes of the dist tests inherit these.
      ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1" \
      UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
        ctest --test-dir build-asan -L 'unit|dist' --output-on-failure -j"$JOBS" --timeout "$CTEST_TIMEOUT"
      ;;
    tsan)
      configure build-tsan thread ON ON -DCMAKE_CXX_COMPILER=clang++
      cmake --build build-tsan -j"$JOBS" --target tandem_core_tests tandem_data_tests tandem_dist_tests tandem-run
      # Gloo comes from Debian without TSan instrumentation: see scripts/ci/tsan.supp.
      TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/scripts/ci/tsan.supp" \
        ctest --test-dir build-tsan -R "$TSAN_TESTS" --output-on-failure -j"$JOBS" --timeout "$CTEST_TIMEOUT"
      ;;
    *) echo "sanitizers.sh: unknown stage '$stage' (expected asan or tsan)" >&2; exit 2 ;;
  esac
  echo "sanitizers.sh: $stage passed in $((SECONDS - t0)) s"
done
