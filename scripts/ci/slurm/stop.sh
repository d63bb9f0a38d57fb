#!/usr/bin/env bash
# Stops what start.sh DIR started: slurmd, slurmctld and munged by the pid files under DIR, then
# any process still working in DIR (a slurmstepd finishing a step, a task): found by its cwd or
# an open file under DIR. SIGTERM, then SIGKILL after 5 s. Safe when nothing (or only part) was
# started; never touches a process outside DIR.
# Usage: stop.sh DIR
set -u
DIR=${1:?usage: stop.sh DIR}
DIR=$(cd "$DIR" 2>/dev/null && pwd -P) || exit 0

in_dir() {  # pids (other than ours) whose cwd or an open fd lies under DIR
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = $$ ] && continue
    hit=0
    case "$(readlink "$p/cwd" 2>/dev/null)" in "$DIR"|"$DIR"/*) hit=1 ;; esac
    if [ $hit = 0 ]; then
      for fd in "$p"/fd/*; do
        case "$(readlink "$fd" 2>/dev/null)" in "$DIR"/*) hit=1; break ;; esac
      done
    fi
    [ $hit = 1 ] && echo "$pid"
  done
}

pids=()
for f in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"; do
  [ -s "$f" ] || continue
  p=$(cat "$f")
  [ -n "$p" ] && kill -0 "$p" 2>/dev/null && pids+=("$p")
done
for p in $(in_dir); do pids+=("$p"); done
[ ${#pids[@]} = 0 ] && exit 0
kill -TERM "${pids[@]}" 2>/dev/null
for _ in $(seq 1 50); do
  alive=()
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
  [ ${#alive[@]} = 0 ] && break
  sleep 0.1
done
for p in "${pids[@]}" $(in_dir); do kill -KILL "$p" 2>/dev/null; done
exit 0
