#!/usr/bin/env sh
# tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [ARGS...]: MMRazor's Slurm training
# command for Tandem: one srun of GPUS tandem-train tasks (--launcher slurm, which reads Slurm's
# own variables: no tandem-run), checkpoints and logs in WORK_DIR.
# Environment, as MMRazor's script: GPUS (8: tasks in all), GPUS_PER_NODE (8: tasks per node),
# CPUS_PER_TASK (5), SRUN_ARGS (extra srun options), PY_ARGS (extra trainer options, after ARGS);
# PORT, when set, is the store's port (MASTER_PORT; --cfg-options dist_params.port=N works too).
# --gres=gpu:GPUS_PER_NODE is asked for only when the partition has GPU resources (sinfo %G) and
# CUDA_VISIBLE_DEVICES is not -1: on a CPU cluster GPUS counts processes.
# Binaries: $TANDEM_BIN if set, else the repository's build/apps, else tandem-train on PATH.
# POSIX sh (runs under dash); the exit status is srun's (--kill-on-bad-exit=1: one failed task ends the job).
set -eu

if [ $# -lt 4 ]; then
  echo "usage: $0 PARTITION JOB_NAME CONFIG WORK_DIR [ARGS...]" >&2
  exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-}
PY_ARGS=${PY_ARGS:-}
if [ -n "${PORT:-}" ]; then export MASTER_PORT=$PORT; fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${TANDEM_BIN:-}" ]; then
  TRAINER=$TANDEM_BIN/tandem-train
elif [ -x "$ROOT/build/apps/tandem-train" ]; then
  TRAINER=$ROOT/build/apps/tandem-train
elif [ -x "$ROOT/bin/tandem-train" ]; then
  TRAINER=$ROOT/bin/tandem-train
else
  TRAINER=tandem-train
fi

GRES=
if [ "${CUDA_VISIBLE_DEVICES:-}" != "-1" ] && sinfo -h -p "$PARTITION" -o %G 2>/dev/null | grep -q gpu; then
  GRES=--gres=gpu:$GPUS_PER_NODE
fi

# SRUN_ARGS and PY_ARGS are split on spaces, as in MMRazor's script.
# shellcheck disable=SC2086
exec srun -p "$PARTITION" \
  --job-name="$JOB_NAME" \
  $GRES \
  --ntasks="$GPUS" \
  --ntasks-per-node="$GPUS_PER_NODE" \
  --cpus-per-task="$CPUS_PER_TASK" \
  --kill-on-bad-exit=1 \
  $SRUN_ARGS \
  "$TRAINER" "$CONFIG" --work-dir="$WORK_DIR" --launcher=slurm "$@" $PY_ARGS
