#!/usr/bin/python3
"""Benchmarks tandem-mnist against the PyTorch reference trainer (bench/pytorch_mnist.py).

Owns: running both trainers as child processes on the same data and recipe for each thread count,
and reporting training throughput (samples/s from their "epoch" metrics lines: training loop only,
eval excluded) and peak resident memory (the child's own ru_maxrss from os.wait4), with the ratios
tandem / pytorch, as a markdown table on stdout and as JSON (--json-out).
Assumes: Linux; Debian's /usr/bin/python3 with PyTorch 1.13 for the reference; both programs take
the flags below and write JSON lines to --metrics-out. Only the standard library is used here.
Guarantees: each child runs alone (sequentially), with OMP_NUM_THREADS / MKL_NUM_THREADS set to the
thread count and --threads N passed; the repeats run in rounds, each round running every side once
(Tandem, PyTorch, and with --own-fp32 both again without autocast), so that a change of the machine's
speed during the run hits every side alike and the ratios compare runs minutes apart at most; a
child that fails or times out stops the script with its exit status and the tail of its output.

Example:
  /usr/bin/python3 bench/compare_pytorch.py --tandem-bin build/apps/tandem-mnist \\
      --threads 1,2 --limit 12800 --json-out bench-results.json
  # without a tandem-mnist yet (PyTorch on both sides, to test this script):
  /usr/bin/python3 bench/compare_pytorch.py --pytorch-both
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from machine import add_output_args, cpu_label, describe, output_path, write_json  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Compare tandem-mnist with PyTorch: samples/s, peak RSS")
    p.add_argument("--tandem-bin", default=os.path.join(ROOT, "build", "apps", "tandem-mnist"))
    p.add_argument("--pytorch-both", action="store_true",
                   help="run the PyTorch trainer in the tandem slot too (tests this script)")
    p.add_argument("--python", default="/usr/bin/python3", help="interpreter with PyTorch")
    p.add_argument("--pytorch-script", default=os.path.join(HERE, "pytorch_mnist.py"))
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--limit", type=int, default=12800, help="training samples per epoch")
    p.add_argument("--test-limit", type=int, default=1000, help="test samples (untimed eval)")
    p.add_argument("--test-batch-size", type=int, default=None,
                   help="eval batch (default: --batch-size, so that eval activations do not "
                        "set the peak RSS)")
    p.add_argument("--epochs", type=int, default=1,
                   help="epochs per run; with more than one the first is dropped as warm-up")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--optimizer", default="adadelta", choices=["adadelta", "sgd", "adam"])
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per (program, threads); samples/s is the median, RSS the max")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--amp", default="off", choices=["off", "bf16"],
                   help="bf16: tandem-mnist --amp bf16 against PyTorch's bf16 autocast (torch.autocast('cpu'))")
    p.add_argument("--own-fp32", action="store_true",
                   help="with --amp bf16: also run both trainers without autocast in the same rounds, for the "
                        "bf16 / own fp32 ratios")
    add_output_args(p, "compare_pytorch.json")
    p.add_argument("--keep-logs", default=None, help="directory to keep each run's output in")
    args = p.parse_args(argv)
    if args.own_fp32 and args.amp == "off":
        p.error("--own-fp32 needs --amp bf16 (it adds the fp32 runs a bf16 run is divided by)")
    return args


def common_flags(args, threads, metrics):
    flags = ["--data-dir", args.data_dir, "--epochs", str(args.epochs),
             "--batch-size", str(args.batch_size), "--optimizer", args.optimizer,
             "--lr", str(args.lr), "--seed", str(args.seed), "--limit", str(args.limit),
             "--test-limit", str(args.test_limit),
             "--test-batch-size", str(args.test_batch_size or args.batch_size),
             "--threads", str(threads),
             "--device", "cpu", "--metrics-out", metrics]
    if args.amp != "off":
        flags += ["--amp", args.amp]
    if args.no_shuffle:
        flags.append("--no-shuffle")
    return flags


def command(args, side, threads, metrics):
    flags = common_flags(args, threads, metrics)
    if side == "pytorch" or args.pytorch_both:
        return [args.python, args.pytorch_script, "--quiet"] + flags
    return [args.tandem_bin] + flags


def run_child(argv, env, log_path, timeout):
    """Runs argv; returns (exit code, wall seconds, peak RSS in bytes of that child)."""
    with open(log_path, "wb") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            # wait4 reaps this child and returns its own rusage (RUSAGE_CHILDREN would be the
            # running maximum over every child this script has waited for).
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, wall, usage.ru_maxrss * 1024  # Linux reports KiB


def read_metrics(path):
    epochs, evals, last_loss = [], [], None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            if rec.get("type") == "epoch":
                epochs.append(rec)
            elif rec.get("type") == "eval":
                evals.append(rec)
            elif rec.get("type") == "train":
                last_loss = rec["loss"]
    return epochs, evals, last_loss


def tail(path, n=3000):
    with open(path, "rb") as f:
        data = f.read()
    return data[-n:].decode("utf-8", "replace")


def run_measured(tag, argv, threads, workdir, timeout):
    """Runs one trainer command with `threads` threads; returns its samples/s (the
    first epoch dropped as warm-up when there are several), peak RSS and results."""
    metrics = os.path.join(workdir, tag + ".jsonl")
    log = os.path.join(workdir, tag + ".log")
    argv = [metrics if a == "METRICS" else a for a in argv]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    load_before = os.getloadavg()[0]
    print(f"# {tag} (load {load_before:.2f}): {' '.join(argv)}", file=sys.stderr, flush=True)
    rc, wall, rss = run_child(argv, env, log, timeout)
    if rc != 0:
        sys.exit(f"{tag} failed with exit status {rc}; last output:\n{tail(log)}")
    epochs, evals, last_loss = read_metrics(metrics)
    if not epochs:
        sys.exit(f"{tag}: no \"epoch\" line in {metrics}; last output:\n{tail(log)}")
    timed = epochs[1:] if len(epochs) > 1 else epochs
    return {
        "samples_per_s": statistics.mean(e["samples_per_s"] for e in timed),
        "epoch_seconds": [e["seconds"] for e in epochs],
        "epoch_samples_per_s": [e["samples_per_s"] for e in epochs],
        "samples": sum(e["samples"] for e in timed),
        "peak_rss_bytes": rss, "wall_s": wall, "last_train_loss": last_loss,
        "load_avg_1min_before": load_before,
        "test_accuracy": evals[-1]["test_accuracy"] if evals else None,
        "test_loss": evals[-1]["test_loss"] if evals else None,
    }


# The sides of a round: (name, trainer, arguments); the *_fp32 ones run without autocast.
def sides_of(args):
    fp32 = argparse.Namespace(**dict(vars(args), amp="off"))
    sides = [("tandem", "tandem", args), ("pytorch", "pytorch", args)]
    if args.own_fp32:
        sides += [("tandem_fp32", "tandem", fp32), ("pytorch_fp32", "pytorch", fp32)]
    return sides


def measure_rounds(args, threads, workdir):
    """Runs --repeats rounds of every side; returns {side name: summary}."""
    sides = [(name, command(side_args, trainer, threads, "METRICS")) for name, trainer, side_args in sides_of(args)]
    runs = {name: [] for name, _ in sides}
    for rep in range(args.repeats):
        for name, argv in sides:
            runs[name].append(run_measured(f"{name}_t{threads}_r{rep}", argv, threads, workdir, args.timeout))
    return {name: summarize(runs[name], argv) for name, argv in sides}


def amp_over_own_fp32(summaries):
    """{side: amp samples/s / the same side's fp32 samples/s} for Tandem and PyTorch, from the summaries
    of one set of rounds keyed by side name (the fp32 ones named <side>_fp32)."""
    return {side: summaries[side]["samples_per_s"] / summaries[side + "_fp32"]["samples_per_s"]
            for side in ("tandem", "pytorch")}


def summarize(runs, argv):
    return {
        "samples_per_s": statistics.median(r["samples_per_s"] for r in runs),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
        "last_train_loss": runs[-1]["last_train_loss"],
        "test_accuracy": runs[-1]["test_accuracy"],
        "test_loss": runs[-1]["test_loss"],
        "command": argv,
        "runs": runs,
    }



def fmt_mib(b):
    return f"{b / 2**20:.0f}"


def main(argv=None):
    args = parse_args(argv)
    json_out = output_path(args.json_out, "compare_pytorch.json", args.overwrite)
    try:
        thread_counts = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        sys.exit(f"--threads: expected comma-separated integers, got {args.threads!r}")
    if not args.pytorch_both and not os.access(args.tandem_bin, os.X_OK):
        sys.exit(f"--tandem-bin {args.tandem_bin} is not an executable (build tandem-mnist, or "
                 "pass --pytorch-both to test this script with PyTorch on both sides)")
    if not os.path.isdir(args.data_dir):
        sys.exit(f"--data-dir {args.data_dir} not found (run scripts/setup.sh)")

    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: 1-minute load average is {load:.2f}: other work shares the CPUs, so "
              "throughput (multi-threaded runs above all) will be low and noisy", file=sys.stderr)
    tandem_name = "pytorch(as tandem)" if args.pytorch_both else "tandem"
    results = []
    with tempfile.TemporaryDirectory(prefix="tandem_compare_") as tmp:
        workdir = args.keep_logs or tmp
        os.makedirs(workdir, exist_ok=True)
        for threads in thread_counts:
            m = measure_rounds(args, threads, workdir)
            t, p = m["tandem"], m["pytorch"]
            results.append(dict(m, **{
                "threads": threads,
                "ratio_samples_per_s": t["samples_per_s"] / p["samples_per_s"],
                "ratio_peak_rss": t["peak_rss_bytes"] / p["peak_rss_bytes"],
            }))
            if args.own_fp32:
                results[-1]["amp_over_own_fp32"] = amp_over_own_fp32(m)

    recipe = (f"{args.optimizer} lr {args.lr}, batch {args.batch_size}, "
              f"{args.epochs} epoch(s) of {args.limit} samples"
              f"{', unshuffled' if args.no_shuffle else ', shuffled'}"
              f"{', ' + args.amp + ' autocast' if args.amp != 'off' else ''}")
    machine = describe(args.python)
    print(f"\n{tandem_name} vs PyTorch {machine['pytorch']} on {cpu_label(machine['cpu'])}; {recipe}\n")
    print(f"| threads | {tandem_name} samples/s | PyTorch samples/s | ratio | "
          f"{tandem_name} peak RSS MiB | PyTorch peak RSS MiB | ratio | last loss t / p |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        t, p = r["tandem"], r["pytorch"]
        print(f"| {r['threads']} | {t['samples_per_s']:.0f} | {p['samples_per_s']:.0f} | "
              f"{r['ratio_samples_per_s']:.2f} | {fmt_mib(t['peak_rss_bytes'])} | "
              f"{fmt_mib(p['peak_rss_bytes'])} | {r['ratio_peak_rss']:.2f} | "
              f"{t['last_train_loss']:.3f} / {p['last_train_loss']:.3f} |")
    if args.own_fp32:
        print(f"\n| threads | {tandem_name} {args.amp} / own fp32 | PyTorch {args.amp} / own fp32 |\n|---:|---:|---:|")
        for r in results:
            o = r["amp_over_own_fp32"]
            print(f"| {r['threads']} | {o['tandem']:.2f} | {o['pytorch']:.2f} |")

    out = {
        "what": "tandem-mnist vs PyTorch (bench/pytorch_mnist.py), CPU",
        "tandem_side": "pytorch_mnist.py" if args.pytorch_both else args.tandem_bin,
        "machine": machine,
        "config": {k: v for k, v in vars(args).items() if k not in ("json_out", "keep_logs", "overwrite")},
        "samples_per_s": "median over repeats of the mean over timed epochs of the epoch "
                         "lines' samples_per_s (training loop only)",
        "peak_rss": "the child's own ru_maxrss (os.wait4), max over repeats",
        "results": results,
    }
    write_json(json_out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
