#!/usr/bin/env bash
# The main job: set up (packages, data, build), then train the MNIST net.
# With no arguments: one epoch on Debian's Fashion-MNIST (Adadelta lr 1.0 annealed
# to 0 by a cosine schedule over the epoch). Any arguments go to
# tandem-mnist (see `build/apps/tandem-mnist --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ $# -eq 0 ] && set -- --epochs 1 --lr-schedule cosine
exec "${BUILD_DIR:-build}/apps/tandem-mnist" "$@"
