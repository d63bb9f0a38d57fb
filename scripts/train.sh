#!/usr/bin/env bash
# The main job: set up what training needs (packages, data, the engine and its apps), then train
# the MNIST net.
# With no arguments: one epoch on Debian's Fashion-MNIST (Adadelta lr 1.0 annealed
# to 0 by a cosine schedule over the epoch: configs/mnist_adadelta_cosine_1ep.json;
# logs, metrics and checkpoints in work_dirs/mnist_adadelta_cosine_1ep/). Any
# arguments go to tandem-mnist instead (see `build/apps/tandem-mnist --help` and
# docs/training.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --for train
[ $# -eq 0 ] && set -- --config configs/mnist_adadelta_cosine_1ep.json
exec "${BUILD_DIR:-build}/apps/tandem-mnist" "$@"
