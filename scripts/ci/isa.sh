#!/usr/bin/env bash
# CI stage: the unit tests (kernels, nn, core, optim, ...) built for x86-64-v3 (AVX2 + FMA, no
# AVX-512), the instruction set of most x86 machines without AVX-512. The kernels have hand-written
# AVX2 paths (the fused batch_norm+relu+max_pool) that neither the native build of an AVX-512
# machine nor the portable sanitizer build compiles; this runs them. TANDEM_EXPECT_SIMD=avx2 makes
# tests/kernels/simd_test.cpp fail unless the kernels were compiled at the AVX2 level
# (kernels/cpu/simd.h). The unit tests include backend_ops (tests/kernels/backend_ops_test.cpp:
# every case of every op of kernels/ops.h in float32 against float64), so the op table's cases run
# at this level too; the stage fails if they are missing. Own build dir (build-avx2), optimised as
# the main build, CPU only, no benchmarks. Skipped on a CPU without AVX2 and FMA.
# ISA_BUILD_DIR names a build dir configured for x86-64-v3 elsewhere to build the tests in instead:
# CI passes the GPU bundle's (scripts/gpu/bundle.sh: -march=x86-64-v3, TANDEM_NATIVE=OFF, tests on), so the
# engine is compiled once for both; that build has the CUDA backend (its tests are not among these) and no
# oneDNN (the engine's own GEMM and conv kernels run instead, at this level). Its cache is checked first.
# Environment: JOBS (default nproc), ISA_BUILD_DIR (default: configure <repo>/build-avx2).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
JOBS=${JOBS:-$(nproc)}
if ! grep -qw avx2 /proc/cpuinfo || ! grep -qw fma /proc/cpuinfo; then
  echo "isa.sh: this CPU has no AVX2/FMA; the x86-64-v3 build cannot run here, skipped"
  exit 0
fi
if [[ -n "${ISA_BUILD_DIR:-}" ]]; then
  source "$ROOT/scripts/ci/reuse_build.sh"
  BUILD=$(reuse_build isa.sh ISA_BUILD_DIR "$ISA_BUILD_DIR" 'CMAKE_CXX_FLAGS:STRING=-march=x86-64-v3' \
    'TANDEM_NATIVE:BOOL=OFF' 'TANDEM_BUILD_TESTS:BOOL=ON')
  echo "isa.sh: building the unit tests in $BUILD (configured for x86-64-v3 elsewhere)"
else
  BUILD=$ROOT/build-avx2
  source "$ROOT/scripts/ci/ccache.sh"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DTANDEM_CUDA=OFF -DTANDEM_BUILD_BENCH=OFF -DTANDEM_NATIVE=OFF \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="-march=x86-64-v3" "${launcher[@]}" >/dev/null
fi
targets=$(cmake --build "$BUILD" --target help |
  grep -oE 'tandem_(core|kernels|nn|optim|data|train)_tests' | sort -u)
cmake --build "$BUILD" -j"$JOBS" --target $targets
if ! ctest --test-dir "$BUILD" -N -L unit -R '^EveryTableOp/BackendOps\.' | grep -q 'Total Tests: [1-9]'; then
  echo "isa.sh: the backend_ops tests are not among the unit tests of $BUILD" >&2
  exit 1
fi
TANDEM_EXPECT_SIMD=avx2 ctest --test-dir "$BUILD" -L unit --output-on-failure -j"$JOBS"
