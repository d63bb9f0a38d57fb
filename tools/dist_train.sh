#!/usr/bin/env sh
# tools/dist_train.sh CONFIG GPUS [ARGS...]: MMRazor's/MMDetection's distributed training command
# for Tandem. Starts GPUS workers of tandem-train (any model of the models library; MNIST configs
# train as under tandem-mnist) on this node through tandem-run (Tandem's
# torchrun), each with `CONFIG --launcher pytorch ARGS...`. With no GPU, or CUDA_VISIBLE_DEVICES=-1,
# GPUS is the number of CPU processes.
# Environment, as MMRazor's script: NNODES (1), NODE_RANK (0), PORT (29500), MASTER_ADDR
# (127.0.0.1). `--cfg-options dist_params.port=N` among ARGS sets the port instead of PORT (the
# trainer uses it too), so two jobs on one machine are told apart by either.
# Binaries: $TANDEM_BIN if set, else the repository's build/apps, else tandem-run/tandem-train on PATH.
# Checkpoints and logs go to work_dirs/<config name>/ unless ARGS say --work-dir.
# POSIX sh (runs under dash): the exit status is tandem-run's (a failing rank's code).
set -eu

if [ $# -lt 2 ]; then
  echo "usage: $0 CONFIG GPUS [ARGS...]" >&2
  exit 2
fi
CONFIG=$1
GPUS=$2
shift 2
if [ ! -f "$CONFIG" ]; then
  echo "dist_train.sh: error: config '$CONFIG' not found (configs/ holds the bundled ones)" >&2
  exit 2
fi
case $GPUS in
  ''|*[!0-9]*|0) echo "dist_train.sh: error: GPUS must be a number of processes >= 1, got '$GPUS'" >&2; exit 2 ;;
esac
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}

for arg in "$@"; do
  case $arg in
    dist_params.port=*) PORT=${arg#dist_params.port=} ;;
  esac
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${TANDEM_BIN:-}" ]; then
  BIN=$TANDEM_BIN/
elif [ -x "$ROOT/build/apps/tandem-train" ]; then
  BIN=$ROOT/build/apps/
elif [ -x "$ROOT/bin/tandem-train" ]; then
  BIN=$ROOT/bin/
else
  BIN=
fi

# tandem-run names PORT, not its own --master-port, when the port is taken.
export TANDEM_LAUNCH_SCRIPT=tools/dist_train.sh
exec "${BIN}tandem-run" \
  --nnodes="$NNODES" \
  --node_rank="$NODE_RANK" \
  --master_addr="$MASTER_ADDR" \
  --nproc_per_node="$GPUS" \
  --master_port="$PORT" \
  "${BIN}tandem-train" "$CONFIG" --launcher pytorch "$@"
