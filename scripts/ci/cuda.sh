#!/usr/bin/env bash
# CI stage for machines WITHOUT a GPU: the CUDA backend compiles cleanly and links against what is
# installed. Nothing here runs CUDA code (that is scripts/gpu/check.sh, on a GPU machine).
#   1. Every engine .cu file (core/cuda, kernels/cuda) compiled for sm_$CUDA_CHECK_ARCH (default 90)
#      with nvcc's warnings as errors (-Werror all-warnings) and the host compiler's -Wall -Wextra
#      -Werror; the CUDA side's C++ files (core/cuda, kernels/cuda, dist/group/cuda) with -Werror too
#      (scripts/ci/cuda_werror.cmake). Only those objects are built first, all of them even when one
#      fails (ninja -k 0), so one run reports every file that does not compile.
#   2. The shared engine library (libtandem.so, linked with --no-undefined) built from the same objects,
#      then scripts/ci/cuda_symbols.py: every CUDA runtime, cuDNN and NCCL symbol it imports is defined in
#      the library it actually loads, and every cuBLAS entry point kernels/cuda/cublas_loader.cpp forwards
#      (dlopen, not linked) is defined in the installed libcublas.so.<TANDEM_CUBLAS_SOVERSION>. Prints a
#      table; fails naming each missing symbol.
#   3. The GPU bundle, scripts/gpu/bundle.sh, built into gpu-bundle/, and tests/gpu_bundle/bundle_test.py: its
#      size, its libraries resolved with the system's other library folders hidden, a CPU training run from it
#      and check.sh --bundle stopping at "no NVIDIA GPU visible" (needs root).
# One build dir for all three, the bundle's (BUNDLE_BUILD_DIR, default build-bundle; reused), configured by
# bundle.sh --configure-only: Release, sm_$CUDA_CHECK_ARCH, host code for x86-64-v3, shared libtandem, the
# CUDA side's warnings as errors. Skipped (exit 0) only when nvcc is not installed, and then a failure under
# CUDA_CHECK_REQUIRE_NVCC=1 (CI sets it); with nvcc but without cuDNN, cuBLAS or NCCL the configure step
# fails (ON).
# Budget: ~8 min on 2 cores from an empty build dir (measured: see docs/gpu.md).
# Environment: JOBS (default nproc), BUNDLE_BUILD_DIR (default <repo>/build-bundle),
#              CUDA_CHECK_ARCH (default 90), CUDA_HOME (default /usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
JOBS=${JOBS:-$(nproc)}
BUILD=${BUNDLE_BUILD_DIR:-$ROOT/build-bundle}
ARCH=${CUDA_CHECK_ARCH:-90}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
T0=$SECONDS
phase() { echo; echo "=== cuda.sh: $* (at $((SECONDS - T0)) s)"; }
fail() { echo "cuda.sh: FAILED: $*" >&2; exit 1; }

NVCC=""
if [[ -x "$CUDA_HOME/bin/nvcc" ]]; then NVCC=$CUDA_HOME/bin/nvcc
elif command -v nvcc >/dev/null; then NVCC=$(command -v nvcc); fi
if [[ -z "$NVCC" ]]; then
  if [[ "${CUDA_CHECK_REQUIRE_NVCC:-0}" == 1 ]]; then
    fail "nvcc not found ($CUDA_HOME/bin/nvcc, PATH) and CUDA_CHECK_REQUIRE_NVCC=1: install the CUDA toolkit"
  fi
  echo "cuda.sh: nvcc not found ($CUDA_HOME/bin/nvcc, PATH): the CUDA backend cannot be compiled here, skipped"
  exit 0
fi
echo "cuda.sh: $("$NVCC" --version | grep -o 'release [0-9.]*, V[0-9.]*' || echo "$NVCC"), sm_$ARCH, $JOBS jobs"

export BUNDLE_BUILD_DIR=$BUILD BUNDLE_ARCH=$ARCH CUDA_HOME JOBS  # for both calls of bundle.sh below
phase "configure $BUILD (scripts/gpu/bundle.sh --configure-only)"
bash "$ROOT/scripts/gpu/bundle.sh" --configure-only || fail "configure (see above)"

# The objects of the CUDA side, from ninja's own list; each source file must have one.
mapfile -t objects < <(ninja -C "$BUILD" -t targets all |
  grep -oE '^CMakeFiles/tandem_(core|kernels|dist_group)\.dir/((core|kernels)/cuda/[^:]+\.cu|(core|kernels|dist/group)/cuda/[^:]+\.cpp)\.o' |
  sort -u)
missing_obj=()
for src in core/cuda/*.cu kernels/cuda/*.cu core/cuda/*.cpp kernels/cuda/*.cpp dist/group/cuda/*.cpp; do
  [[ -e "$src" && "$src" != */no_cuda.cpp ]] || continue
  layer=${src%/cuda/*}
  printf '%s\n' "${objects[@]}" | grep -qxF "CMakeFiles/tandem_${layer//\//_}.dir/$src.o" || missing_obj+=("$src")
done
[[ ${#missing_obj[@]} -eq 0 ]] || fail "no object target for: ${missing_obj[*]} (reconfigure? glob?)"
ncu=$(printf '%s\n' "${objects[@]}" | grep -c '\.cu\.o$' || true)
phase "compile ${#objects[@]} objects ($ncu .cu for sm_$ARCH with -Werror all-warnings, $(( ${#objects[@]} - ncu )) .cpp with -Werror)"
log=$BUILD/cuda-check-compile.log
if ! ninja -C "$BUILD" -j "$JOBS" -k 0 "${objects[@]}" 2>&1 | tee "$log"; then
  echo >&2
  echo "cuda.sh: these CUDA-side files do not compile cleanly:" >&2
  grep -oE '^FAILED: [^ ]+' "$log" | sed -E 's|^FAILED: CMakeFiles/tandem_[a-z_]+\.dir/|  |; s|\.o$||' >&2 || true
  echo "cuda.sh: warnings and errors with file:line:" >&2
  grep -E '(\([0-9]+\): (error|warning)|:[0-9]+:[0-9]+: (error|warning))' "$log" | sort -u | head -50 >&2 || true
  fail "compile (log: $log)"
fi
echo "cuda.sh: all ${#objects[@]} CUDA-side objects compiled without warnings"

phase "link the shared engine library (target tandem, shared in this build)"
ninja -C "$BUILD" -j "$JOBS" tandem || fail "building the shared libtandem"
lib=$(find "$BUILD/lib" -maxdepth 1 -name 'libtandem.so.*' -type f | sort | tail -1)
[[ -n "$lib" ]] || fail "no $BUILD/lib/libtandem.so.* after building target tandem"

phase "CUDA-library symbols of $(basename "$lib")"
python3 "$ROOT/scripts/ci/cuda_symbols.py" --lib "$lib" --compile-commands "$BUILD/compile_commands.json" \
  --loader "$ROOT/kernels/cuda/cublas_loader.cpp" --cuda-root "$CUDA_HOME" || fail "symbol check (see above)"

phase "the GPU bundle (scripts/gpu/bundle.sh) and its checks without a GPU (tests/gpu_bundle)"
bash "$ROOT/scripts/gpu/bundle.sh" || fail "building the GPU bundle"
python3 "$ROOT/tests/gpu_bundle/bundle_test.py" --bundle "$ROOT/gpu-bundle" || fail "the bundle's checks (see above)"

echo
echo "cuda.sh: OK in $((SECONDS - T0)) s"
