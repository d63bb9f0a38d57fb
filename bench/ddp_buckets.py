#!/usr/bin/python3
"""DDP bucket-size sweep, tandem against PyTorch DDP, in one run; writes its JSON to a fresh bench/runs/<date-time>/ folder (or --json-out).

Owns: running, per model (mnist, mlp), one after another and never concurrently:
  compute-only   1 process x --threads, no communication: build-bench/bench/ddp_buckets --mode compute
                 and bench/ddp_buckets_torch.py --mode compute
  per bucket cap (--caps, default 0.25,1,5,25,100,none,auto), interleaved tandem then PyTorch
  (auto: tandem only, the reducer's measured cap, ReducerOptions::bucket_cap_mb = 0):
                 tandem-run --nproc-per-node N ddp_buckets --mode ddp --bucket-cap-mb CAP
                 N x ddp_buckets_torch.py --mode ddp --bucket-cap-mb CAP (gloo, torchrun's variables)
Each child reports (rank 0, one JSON line): median step time, forward/backward/optimizer split,
exposed communication (backward's end waiting for the reduction), the number of buckets, and the
all-reduce alone measured right after the steps with nothing else running (allreduce_all_ms: every
gradient in one buffer; bucket_comm_ms: the DDP bucket layout launched back to back).
Derived, per model and framework (the "summary" in the JSON and the table printed at the end):
  hidden share   = 1 - exposed_comm_ms / allreduce_all_ms (1: the communication was all hidden behind
                   backward; 0: all of it was waited for; < 0: waiting took longer than the all-reduce
                   alone, e.g. a rank computing late)
  bound          = max(compute-only step, all-reduce alone), the best a perfectly overlapped step reaches
  best cap       = the cap with the lowest step time; best / bound (target <= 1.25) and
                   tandem / PyTorch at the same cap (target <= 0.5)
Assumes: Linux; Debian's /usr/bin/python3 with torch 1.13 for the PyTorch side (this script itself uses
only the standard library); the tandem targets ddp_buckets and tandem-run built (default:
build-bench/). Guarantees: OMP_NUM_THREADS=MKL_NUM_THREADS=--threads in every child; each child's
1-minute load average before it starts is recorded; a failing or timed-out child stops the script
with its command and output tail.
Modes: --quick (3 timed steps after 2 warm-up: checks the pipeline in about a minute or two per model),
default full (20 timed steps after 3 warm-up).
Example:
  /usr/bin/python3 bench/ddp_buckets.py --build build-bench            # full
  /usr/bin/python3 bench/ddp_buckets.py --build build-bench --quick    # pipeline check
"""
import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from machine import add_output_args, describe, output_path, write_json  # noqa: E402
DEFAULT_CAPS = "0.25,1,5,25,100,none,auto"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="DDP bucket sweep: tandem vs PyTorch DDP (gloo)")
    p.add_argument("--build", default=os.path.join(ROOT, "build-bench"), help="tandem build directory")
    p.add_argument("--python", default="/usr/bin/python3", help="interpreter with torch 1.13")
    p.add_argument("--models", default="mnist,mlp")
    p.add_argument("--caps", default=DEFAULT_CAPS, help="bucket_cap_mb values; none = one bucket, no overlap")
    p.add_argument("--nproc", type=int, default=2, help="ranks")
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20; --quick 3)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (default 3; --quick 2)")
    p.add_argument("--repeats", type=int, default=1, help="runs per configuration (median of the medians)")
    p.add_argument("--mlp-in", type=int, default=1024)
    p.add_argument("--mlp-hidden", type=int, default=2048)
    p.add_argument("--mlp-layers", type=int, default=6)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--gradient-as-bucket-view", action="store_true",
                   help="DDP's gradient_as_bucket_view on both sides (grads are views of the buckets: no copies)")
    p.add_argument("--only", default="tandem,pytorch", help="frameworks to run")
    p.add_argument("--timeout", type=float, default=900, help="seconds per child")
    add_output_args(p, "ddp_buckets.json")
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = 3 if args.quick else 20
    if args.warmup is None:
        args.warmup = 2 if args.quick else 3
    return args


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



def child_env(threads):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def last_json(text):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("[rank 0] "):
            line = line[len("[rank 0] "):]
        if line.startswith("{"):
            return json.loads(line)
    return None


def fail(argv, text, why):
    sys.exit(f"ddp_buckets.py: {why}: {' '.join(argv)}\n--- output tail ---\n{text[-3000:]}")


def run_tandem(args, mode, model, cap):
    exe = os.path.join(args.build, "bench", "ddp_buckets")
    flags = ["--mode", mode, "--model", model, "--steps", str(args.steps), "--warmup", str(args.warmup),
             "--batch", str(args.batch), "--threads", str(args.threads), "--mlp-in", str(args.mlp_in),
             "--mlp-hidden", str(args.mlp_hidden), "--mlp-layers", str(args.mlp_layers)]
    if mode == "compute":
        argv = [exe] + flags + ["--profile"]
    else:
        argv = [os.path.join(args.build, "apps", "tandem-run"), "--nproc-per-node", str(args.nproc),
                "--master-port", str(free_port()), exe] + flags + ["--bucket-cap-mb", cap]
        if args.gradient_as_bucket_view:
            argv.append("--gradient-as-bucket-view")
    try:
        r = subprocess.run(argv, env=child_env(args.threads), capture_output=True, text=True,
                           timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        fail(argv, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""),
             f"timed out after {args.timeout} s")
    text = r.stdout + r.stderr
    if r.returncode != 0:
        fail(argv, text, f"exit status {r.returncode}")
    result = last_json(r.stdout)
    if result is None:
        fail(argv, text, "no JSON line from rank 0")
    return result


def run_pytorch(args, mode, model, cap):
    script = os.path.join(HERE, "ddp_buckets_torch.py")
    flags = ["--mode", mode, "--model", model, "--steps", str(args.steps), "--warmup", str(args.warmup),
             "--batch", str(args.batch), "--threads", str(args.threads), "--mlp-in", str(args.mlp_in),
             "--mlp-hidden", str(args.mlp_hidden), "--mlp-layers", str(args.mlp_layers)]
    argv = [args.python, script] + flags
    nproc = 1
    if mode == "ddp":
        argv += ["--bucket-cap-mb", cap]
        if args.gradient_as_bucket_view:
            argv.append("--gradient-as-bucket-view")
        nproc = args.nproc
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = child_env(args.threads)
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0")
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs, deadline, status = [], time.monotonic() + args.timeout, 0
    for proc in procs:
        try:
            text, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            fail(argv, "", f"timed out after {args.timeout} s")
        outputs.append(text)
        status = status or proc.returncode
    if status != 0:
        for q in procs:
            if q.poll() is None:
                q.kill()
        fail(argv, "\n".join(outputs), f"exit status {status}")
    result = last_json(outputs[0])
    if result is None:
        fail(argv, outputs[0], "no JSON line from rank 0")
    return result


def measure(args, framework, mode, model, cap=None):
    runs = []
    for _ in range(args.repeats):
        load = os.getloadavg()[0]
        fn = run_tandem if framework == "tandem" else run_pytorch
        r = fn(args, mode, model, cap)
        r["load_before"] = load
        runs.append(r)
    best = dict(runs[0])
    for key in ("step_ms", "forward_ms", "backward_ms", "optimizer_ms", "exposed_comm_ms", "allreduce_all_ms",
                "bucket_comm_ms"):
        if key in runs[0]:
            best[key] = statistics.median(r[key] for r in runs)
    if "allreduce_all_ms" in best and best["allreduce_all_ms"] > 0:
        best["hidden_share"] = 1.0 - best["exposed_comm_ms"] / best["allreduce_all_ms"]
    best["repeats"] = [{k: r[k] for k in ("step_ms", "exposed_comm_ms", "load_before") if k in r} for r in runs]
    tag = f"{framework:7s} {model:5s} {mode:7s} cap {cap or '-':>5s}"
    extra = ""
    if mode == "ddp":
        extra = (f" exposed {best['exposed_comm_ms']:8.1f} ms  allreduce {best['allreduce_all_ms']:7.1f} ms"
                 f"  hidden {best['hidden_share']:5.2f}  buckets {best['buckets']}")
    print(f"{tag}: step {best['step_ms']:8.1f} ms{extra}  (load {runs[0]['load_before']:.1f})", flush=True)
    return best


def summarise(results, frameworks):
    """Per model and framework: compute, all-reduce alone, bound, best cap, ratios."""
    summary = {}
    for model, per in results.items():
        s = {}
        for fw in frameworks:
            sweep = per[fw]["sweep"]
            if not sweep:
                continue
            compute = per[fw]["compute"]["step_ms"]
            allreduce = statistics.median(r["allreduce_all_ms"] for r in sweep.values())
            bound = max(compute, allreduce)
            best_cap = min((c for c in sweep if c != "auto"), key=lambda c: sweep[c]["step_ms"])
            best = sweep[best_cap]["step_ms"]
            s[fw] = {"compute_ms": compute, "allreduce_all_ms": allreduce, "bound_ms": bound, "best_cap": best_cap,
                     "best_step_ms": best, "best_over_bound": best / bound,
                     "no_overlap_step_ms": sweep.get("none", {}).get("step_ms")}
            if "auto" in sweep:
                s[fw]["auto_step_ms"] = sweep["auto"]["step_ms"]
                s[fw]["auto_cap"] = sweep["auto"].get("auto_cap")
        if "tandem" in s and "pytorch" in s:
            common = [c for c in per["tandem"]["sweep"] if c in per["pytorch"]["sweep"]]
            s["tandem_over_pytorch"] = {c: per["tandem"]["sweep"][c]["step_ms"] / per["pytorch"]["sweep"][c]["step_ms"]
                                        for c in common}
            bc = s["tandem"]["best_cap"]
            s["targets"] = {
                "best_within_25pct_of_bound": s["tandem"]["best_over_bound"] <= 1.25,
                "best_cap_le_half_pytorch_same_cap": s["tandem_over_pytorch"].get(bc, 9.9) <= 0.5,
            }
        summary[model] = s
    return summary


def markdown(data):
    """The sweep as markdown tables, one per model (also used by bench/plot.py)."""
    lines = []
    for model, per in data["results"].items():
        fws = [f for f in ("tandem", "pytorch") if f in per]
        sm = data["summary"].get(model, {})
        params = next(iter(per.values()))["compute"]["params"]
        lines.append(f"**{model}** ({params / 1e6:.2f}M parameters, {4 * params / 1e6:.1f} MB of gradients, "
                     f"batch {data['settings']['batch']} per rank, {data['settings']['nproc']} ranks x "
                     f"{data['settings']['threads']} thread"
                     f"{', gradient_as_bucket_view' if data['settings'].get('gradient_as_bucket_view') else ''})\n")
        head = "| bucket_cap_mb |"
        rule = "|---|"
        for fw in fws:
            head += f" {fw} step ms | {fw} buckets | {fw} exposed ms | {fw} hidden |"
            rule += "---:|---:|---:|---:|"
        if len(fws) == 2:
            head += " tandem / PyTorch |"
            rule += "---:|"
        lines += [head, rule]
        for cap in data["settings"]["caps"]:
            row = f"| {cap} |"
            for fw in fws:
                r = per[fw]["sweep"].get(cap)
                row += (f" {r['step_ms']:.1f} | {r['buckets']} | {r['exposed_comm_ms']:.1f} | {r['hidden_share']:.2f} |"
                        if r else " | | | |")
            if len(fws) == 2:
                ratio = sm.get("tandem_over_pytorch", {}).get(cap)
                row += f" {ratio:.2f} |" if ratio is not None else " |"
            lines.append(row)
        for fw in fws:
            s = sm.get(fw)
            if s:
                if s.get("auto_cap"):
                    a = s["auto_cap"]
                    lines.append(f"\n{fw} auto: measured latency {a['latency_us']:.0f} us, bandwidth "
                                 f"{a['bandwidth_gbps']:.2f} GB/s -> cap {a['cap_mb']:.2f} MiB, step {s['auto_step_ms']:.1f} ms")
                lines.append(f"\n{fw}: compute-only {s['compute_ms']:.1f} ms, all-reduce alone {s['allreduce_all_ms']:.1f} ms, "
                             f"bound max() {s['bound_ms']:.1f} ms; best cap {s['best_cap']}: {s['best_step_ms']:.1f} ms = "
                             f"{s['best_over_bound']:.2f} x bound")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    json_out = output_path(args.json_out, "ddp_buckets.json", args.overwrite)
    frameworks = [f for f in ("tandem", "pytorch") if f in args.only.split(",")]
    caps = args.caps.split(",")
    for f in ("ddp_buckets",):
        exe = os.path.join(args.build, "bench", f)
        if "tandem" in frameworks and not os.access(exe, os.X_OK):
            sys.exit(f"{exe} is not built: cmake --build {args.build} --target ddp_buckets tandem-run")
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: 1-minute load average {load:.1f}: other work on this machine skews the times", flush=True)
    results = {}
    for model in args.models.split(","):
        per = {fw: {"compute": None, "sweep": {}} for fw in frameworks}
        for fw in frameworks:
            per[fw]["compute"] = measure(args, fw, "compute", model)
        for cap in caps:
            for fw in frameworks:
                if cap == "auto" and fw != "tandem":
                    continue  # PyTorch has no automatic cap
                per[fw]["sweep"][cap] = measure(args, fw, "ddp", model, cap)
        results[model] = per
    data = {
        "what": "DDP bucket sweep: step time, exposed communication, hidden share; tandem vs PyTorch 1.13 DDP (gloo)",
        "machine": dict(describe(args.python), platform=platform.platform()),
        "settings": {"nproc": args.nproc, "threads": args.threads, "batch": args.batch, "steps": args.steps,
                     "warmup": args.warmup, "repeats": args.repeats, "caps": caps, "quick": args.quick,
                     "mlp": [args.mlp_in, args.mlp_hidden, args.mlp_layers],
                     "gradient_as_bucket_view": args.gradient_as_bucket_view,
                     "command": " ".join([sys.executable] + sys.argv)},
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": results,
    }
    data["summary"] = summarise(results, frameworks)
    print()
    print(markdown(data))
    write_json(json_out, data)


if __name__ == "__main__":
    main()
