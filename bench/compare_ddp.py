#!/usr/bin/python3
"""Benchmarks data-parallel scaling on one machine: tandem-mnist and PyTorch, 1 rank x 1 thread against
2 ranks x 1 thread, and against the machine's ceiling for two processes.

Owns: running the configurations below as child processes on the same data and recipe, and reporting
training throughput (samples/s from rank 0's "epoch" metrics lines: samples of all ranks / rank 0's
training-loop wall time; eval excluded) with the ratios 2 ranks / 1 rank per framework and
tandem / PyTorch per configuration, as a markdown table on stdout and as JSON (--json-out):
  tandem  1 rank : tandem-mnist --threads 1
  tandem  2 ranks: tandem-run --nproc-per-node 2 --master-port P tandem-mnist --launcher pytorch --threads 1
  PyTorch 1 rank : pytorch_mnist.py --threads 1
  PyTorch 2 ranks: pytorch_mnist.py --nproc-per-node 2 --threads 1  (DistributedDataParallel over gloo,
                   DistributedSampler; torchrun's variables set by the script itself)
  tandem  pair   : two independent 1-rank runs started together, no communication at all: what two
                   processes get from this machine's cores, caches and memory bandwidth. Each runs
                   one epoch more than asked and that last one is not counted, so both are measured
                   while both train. The pair's samples/s is the sum of the two; its lockstep
                   samples/s is twice the slower one's, the most that ranks which wait for each
                   other every step can reach (the two vCPUs are often not equally fast).
                   (pytorch_pair, the same for PyTorch, runs only when --only names it.)
2 ranks / lockstep pair is then how much of the reachable scaling DDP delivers.
Every process runs the same number of steps per epoch (--limit / --batch-size): a 2-rank epoch
covers 2 x --limit samples, so throughput is compared at the same point of each process's life
(steps get faster over a process's first seconds).
Assumes: Linux, 2+ cores; Debian's /usr/bin/python3 with PyTorch 1.13; the tandem binaries built.
Only the standard library is used here (helpers shared with compare_pytorch.py).
Guarantees: runs are sequential (the pair's two processes run together, as one run), interleaved
across configurations on each repeat
(so that slow drift in machine load spreads over all four); OMP_NUM_THREADS=MKL_NUM_THREADS=1 and
--threads 1 for every rank; the 1-minute load average before each run is recorded; a child that
fails or times out stops the script with its status and the tail of its output.

Example:
  /usr/bin/python3 bench/compare_ddp.py --tandem-bin build/apps/tandem-mnist \\
      --tandem-run build/apps/tandem-run --repeats 3     # results in bench/runs/<date-time>/compare_ddp.json
"""
import argparse
import concurrent.futures
import os
import socket
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from compare_pytorch import run_measured  # noqa: E402
from machine import add_output_args, cpu_label, describe, output_path, write_json  # noqa: E402

# (framework, ranks): ranks 0 is the pair of independent 1-rank runs.
CONFIGS = [("tandem", 1), ("tandem", 2), ("tandem", 0), ("pytorch", 1), ("pytorch", 2), ("pytorch", 0)]
DEFAULT = ["tandem1", "tandem2", "tandem_pair", "pytorch1", "pytorch2"]


def config_name(side, ranks):
    return f"{side}_pair" if ranks == 0 else f"{side}{ranks}"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="DDP scaling: 1 rank vs 2 ranks x 1 thread, tandem and PyTorch")
    p.add_argument("--tandem-bin", default=os.path.join(ROOT, "build", "apps", "tandem-mnist"))
    p.add_argument("--tandem-run", default=None, help="default: tandem-run next to --tandem-bin")
    p.add_argument("--python", default="/usr/bin/python3", help="interpreter with PyTorch")
    p.add_argument("--pytorch-script", default=os.path.join(HERE, "pytorch_mnist.py"))
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--limit", type=int, default=12800,
                   help="training samples per epoch and process (a 2-rank epoch covers twice as many)")
    p.add_argument("--test-limit", type=int, default=1000, help="test samples (untimed eval)")
    p.add_argument("--epochs", type=int, default=2,
                   help="epochs per run; with more than one the first is dropped as warm-up")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--optimizer", default="adadelta", choices=["adadelta", "sgd", "adam"])
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--only", default=None,
                   help="comma-separated subset of tandem1,tandem2,tandem_pair,pytorch1,pytorch2,pytorch_pair "
                        f"(default {','.join(DEFAULT)}; ratios need both of their configurations)")
    p.add_argument("--repeats", type=int, default=1, help="runs per configuration; samples/s is the median")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    add_output_args(p, "compare_ddp.json")
    p.add_argument("--keep-logs", default=None, help="directory to keep each run's output in")
    args = p.parse_args(argv)
    if args.tandem_run is None:
        args.tandem_run = os.path.join(os.path.dirname(args.tandem_bin), "tandem-run")
    return args


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(args, side, ranks, metrics):
    epochs = args.epochs + 1 if ranks == 0 else args.epochs
    flags = ["--data-dir", args.data_dir, "--epochs", str(epochs), "--batch-size", str(args.batch_size),
             "--optimizer", args.optimizer, "--lr", str(args.lr), "--seed", str(args.seed),
             "--limit", str(args.limit * max(ranks, 1)), "--test-limit", str(args.test_limit),
             "--test-batch-size", str(args.batch_size), "--threads", "1", "--device", "cpu",
             "--metrics-out", metrics]
    if args.no_shuffle:
        flags.append("--no-shuffle")
    if side == "tandem":
        if ranks <= 1:
            return [args.tandem_bin] + flags
        return [args.tandem_run, "--nproc-per-node", str(ranks), "--master-port", str(free_port()),
                args.tandem_bin, "--launcher", "pytorch"] + flags
    cmd = [args.python, args.pytorch_script, "--quiet"] + flags
    return cmd + (["--nproc-per-node", str(ranks)] if ranks > 1 else [])


def run_once(args, side, ranks, rep, workdir):
    if ranks:
        return run_measured(f"{side}_{ranks}rank_r{rep}", command(args, side, ranks, "METRICS"), 1, workdir,
                            args.timeout)
    # The pair: both processes at once. Each counts the epochs a single run would (the first dropped
    # when there are several) and not its extra last one, which the other may already have left.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        jobs = [pool.submit(run_measured, f"{side}_pair{i}_r{rep}", command(args, side, 0, "METRICS"), 1,
                            workdir, args.timeout) for i in (0, 1)]
        halves = [j.result() for j in jobs]

    def counted(r):
        rates = r["epoch_samples_per_s"][:-1]
        return statistics.mean(rates[1:] if len(rates) > 1 else rates)

    rates = [counted(r) for r in halves]
    return {"samples_per_s": sum(rates), "lockstep_samples_per_s": 2 * min(rates), "processes": halves,
            "load_avg_1min_before": min(r["load_avg_1min_before"] for r in halves)}


def main(argv=None):
    args = parse_args(argv)
    json_out = output_path(args.json_out, "compare_ddp.json", args.overwrite)
    wanted = {c.strip() for c in args.only.split(",") if c.strip()} if args.only else set(DEFAULT)
    configs = [c for c in CONFIGS if config_name(*c) in wanted]
    unknown = wanted - {config_name(*c) for c in CONFIGS}
    if unknown or not configs:
        sys.exit(f"--only {args.only!r}: expected some of {','.join(config_name(*c) for c in CONFIGS)}")
    for side, _ in configs:
        if side == "tandem":
            for b in (args.tandem_bin, args.tandem_run):
                if not os.access(b, os.X_OK):
                    sys.exit(f"{b} is not an executable (build the tandem-mnist and tandem-run targets)")
    if not os.path.isdir(args.data_dir):
        sys.exit(f"--data-dir {args.data_dir} not found (run scripts/setup.sh)")
    if args.limit % args.batch_size:
        print(f"note: --limit {args.limit} is not a multiple of --batch-size: every epoch ends with a short "
              "batch", file=sys.stderr)
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: 1-minute load average is {load:.2f}: other work shares the CPUs, so 2-rank "
              "throughput above all will be low and noisy", file=sys.stderr)

    runs = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="tandem_compare_ddp_") as tmp:
        workdir = args.keep_logs or tmp
        os.makedirs(workdir, exist_ok=True)
        for rep in range(args.repeats):
            for side, ranks in configs:
                runs[(side, ranks)].append(run_once(args, side, ranks, rep, workdir))

    res = {}
    for (side, ranks), rs in runs.items():
        res[config_name(side, ranks)] = {"samples_per_s": statistics.median(r["samples_per_s"] for r in rs),
                                         "command": command(args, side, ranks, "METRICS"), "runs": rs}
        if ranks == 0:
            res[config_name(side, ranks)]["lockstep_samples_per_s"] = statistics.median(
                r["lockstep_samples_per_s"] for r in rs)
    sps = {k: v["samples_per_s"] for k, v in res.items()}
    for side in ("tandem", "pytorch"):
        if side + "_pair" in res:
            sps[side + "_lockstep"] = res[side + "_pair"]["lockstep_samples_per_s"]
    ratio = lambda a, b: sps[a] / sps[b] if a in sps and b in sps else None  # noqa: E731
    ratios = {"tandem_2_over_1": ratio("tandem2", "tandem1"),
              "pytorch_2_over_1": ratio("pytorch2", "pytorch1"),
              "tandem_over_pytorch_1rank": ratio("tandem1", "pytorch1"),
              "tandem_over_pytorch_2ranks": ratio("tandem2", "pytorch2"),
              "tandem_pair_over_1": ratio("tandem_pair", "tandem1"),
              "tandem_lockstep_over_1": ratio("tandem_lockstep", "tandem1"),
              "tandem_2_over_lockstep": ratio("tandem2", "tandem_lockstep"),
              "pytorch_pair_over_1": ratio("pytorch_pair", "pytorch1"),
              "pytorch_lockstep_over_1": ratio("pytorch_lockstep", "pytorch1"),
              "pytorch_2_over_lockstep": ratio("pytorch2", "pytorch_lockstep")}

    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    recipe = (f"{args.optimizer} lr {args.lr}, batch {args.batch_size} per rank, {args.epochs} epoch(s) of "
              f"{args.limit} samples{', unshuffled' if args.no_shuffle else ', shuffled'}, 1 thread per rank")
    loads = [r["load_avg_1min_before"] for rs in runs.values() for r in rs]
    print(f"\nDDP scaling on {cpu_label()}; {recipe}; load before runs "
          f"{min(loads):.2f}-{max(loads):.2f}; median of {args.repeats}\n")
    print("| | 1 rank x 1 thread samples/s | 2 ranks x 1 thread samples/s | 2 ranks / 1 rank "
          "| 2 independent processes: sum / lockstep samples/s | sum / 1 rank | lockstep / 1 rank "
          "| 2 ranks / lockstep |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for side, name in (("tandem", "tandem"), ("pytorch", "PyTorch (gloo)")):
        print(f"| {name} | {fmt(sps.get(side + '1'), '.0f')} | {fmt(sps.get(side + '2'), '.0f')} | "
              f"{fmt(ratios[side + '_2_over_1'], '.2f')} | {fmt(sps.get(side + '_pair'), '.0f')} / "
              f"{fmt(sps.get(side + '_lockstep'), '.0f')} | {fmt(ratios[side + '_pair_over_1'], '.2f')} | "
              f"{fmt(ratios[side + '_lockstep_over_1'], '.2f')} | {fmt(ratios[side + '_2_over_lockstep'], '.2f')} |")
    print(f"| tandem / PyTorch | {fmt(ratios['tandem_over_pytorch_1rank'], '.2f')} | "
          f"{fmt(ratios['tandem_over_pytorch_2ranks'], '.2f')} | | | | | |")

    out = {
        "what": "DDP scaling, 1 vs 2 ranks x 1 thread: tandem-mnist (tandem-run) and PyTorch 1.13 "
                "DistributedDataParallel over gloo (bench/pytorch_mnist.py), CPU",
        "machine": describe(args.python),
        "config": {k: v for k, v in vars(args).items() if k not in ("json_out", "keep_logs", "overwrite")},
        "samples_per_s": "median over repeats of the mean over timed epochs of rank 0's epoch lines' "
                         "samples_per_s (samples of all ranks / rank 0's training-loop seconds); "
                         "for a pair, the sum over its two processes of the mean over their middle "
                         "epochs",
        "results": res, "ratios": ratios,
    }
    write_json(json_out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
