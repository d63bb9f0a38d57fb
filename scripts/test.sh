#!/usr/bin/env bash
# Set up (packages, data, build), then run the whole test suite with ctest.
# Tests labelled gpu skip with a message where no GPU is visible.
# Extra arguments go to ctest (e.g. -L unit, -R GradCheck).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --for test
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" "$@"
