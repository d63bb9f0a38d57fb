#!/usr/bin/env bash
# Starts a one-node Slurm cluster on loopback under DIR (created; everything it writes stays there):
# munged with a freshly generated key on its own socket, slurmctld and slurmd on free ports,
# configured from slurm.conf.in. Waits (bounded, 60 s) until sinfo shows the node idle.
# Prints "export SLURM_CONF=DIR/slurm.conf" on success. Exit codes: 0 ready; 77 cannot run here
# (not root, daemons missing); 1 a daemon failed to start (its log is printed). Always pair with
# stop.sh DIR, which kills what this started (pid files under DIR).
# Usage: start.sh DIR
set -u
DIR=${1:?usage: start.sh DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" != 0 ]; then echo "start.sh: needs root (slurmd runs jobs as any user)"; exit 77; fi
for b in munged mungekey slurmctld slurmd sinfo srun; do
  command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] || { echo "start.sh: $b not installed (run scripts/setup.sh)"; exit 77; }
done
export PATH=$PATH:/usr/sbin
mkdir -p "$DIR"/munge "$DIR"/state "$DIR"/spool
chmod 700 "$DIR"/munge
: > "$DIR"/plugstack.conf

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HOST=$(hostname -s)
CPUS=$(nproc)
CTLD_PORT=$(free_port)
SLURMD_PORT=$(free_port)
while [ "$SLURMD_PORT" = "$CTLD_PORT" ]; do SLURMD_PORT=$(free_port); done
sed -e "s|@DIR@|$DIR|g" -e "s|@HOST@|$HOST|g" -e "s|@CPUS@|$CPUS|g" \
    -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" "$HERE/slurm.conf.in" > "$DIR/slurm.conf"
export SLURM_CONF=$DIR/slurm.conf

fail() { echo "start.sh: $1"; for f in "$DIR"/*.log "$DIR"/munge/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit "${2:-1}"; }

mungekey --create --keyfile="$DIR/munge/munge.key" --force >/dev/null 2>&1 ||
  dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$DIR/munge/munge.key"
munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
  --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munge.seed" \
  >"$DIR/munge/munged.out" 2>&1 || fail "munged did not start: $(cat "$DIR/munge/munged.out")" 77

slurmctld -c -f "$SLURM_CONF" >"$DIR/slurmctld.out" 2>&1 || fail "slurmctld did not start" 77
slurmd -f "$SLURM_CONF" -N "$HOST" >"$DIR/slurmd.out" 2>&1 || fail "slurmd did not start" 77

for _ in $(seq 1 120); do
  state=$(sinfo -h -N -o '%T' 2>/dev/null | head -1)
  if [ "$state" = idle ]; then echo "export SLURM_CONF=$SLURM_CONF"; exit 0; fi
  sleep 0.5
done
fail "node $HOST not idle after 60 s (sinfo says '${state:-nothing}')" 1
