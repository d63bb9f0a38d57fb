#!/usr/bin/python3
"""Benchmarks PowerSGD against plain all-reduce: test accuracy and bytes sent, 2-rank DDP training of
the MNIST net with tandem-mnist.

Owns: running `tandem-run --nproc-per-node 2 tandem-mnist --launcher pytorch --comm-hook H ...` for
each hook setting and seed (sequentially), and reporting per setting the mean test accuracy after
the last epoch, its difference from plain all-reduce (same seeds), and the bytes rank 0's comm hook
sent per synchronised step over the whole run (from the metrics' `comm_bytes`) against plain
all-reduce's (`bucket_bytes`), as a markdown table on stdout and as JSON (--json-out).
Assumes: the tandem binaries built; Fashion-MNIST where tandem-mnist looks for it by default.
Guarantees: only the standard library; every run has --threads 1 per rank, the same seeds and
the trainer's default recipe (Adadelta lr 1.0, StepLR 0.7 per epoch, batch 64 per rank); a run that fails or times out stops the script with its status and its output's tail.

Example (the numbers in bench/README.md):
  /usr/bin/python3 bench/powersgd.py --tandem-bin build/apps/tandem-mnist \\
      --tandem-run build/apps/tandem-run --epochs 2 --seeds 1 2          # results in bench/runs/<date-time>/powersgd.json
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import add_output_args, describe, output_path, write_json  # noqa: E402

SETTINGS = [
    ("allreduce", []),
    ("powersgd r1", ["--comm-hook", "powersgd", "--powersgd-rank", "1"]),
    ("powersgd r2", ["--comm-hook", "powersgd", "--powersgd-rank", "2"]),
    ("powersgd r4", ["--comm-hook", "powersgd", "--powersgd-rank", "4"]),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args, flags, seed, workdir):
    metrics = os.path.join(workdir, "metrics.jsonl")
    cmd = [args.tandem_run, "--nproc-per-node", "2", "--master-port", str(free_port()), args.tandem_bin,
           "--launcher", "pytorch", "--threads", "1", "--epochs", str(args.epochs), "--seed", str(seed),
           "--powersgd-start-iter", str(args.start_iter), "--log-interval", "100000",
           "--work-dir", os.path.join(workdir, "work"), "--metrics-out", metrics, *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{(p.stdout + p.stderr)[-3000:]}")
    records = [json.loads(line) for line in open(metrics)]
    evals = [r for r in records if r["type"] == "eval"]
    train = [r for r in records if r["type"] == "train" and "comm_bytes" in r]
    return {"accuracy": evals[-1]["test_accuracy"], "test_loss": evals[-1]["test_loss"],
            "comm_bytes": sum(r["comm_bytes"] for r in train), "bucket_bytes": sum(r["bucket_bytes"] for r in train),
            "steps": len(train)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tandem-bin", default="build/apps/tandem-mnist")
    ap.add_argument("--tandem-run", default="build/apps/tandem-run")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--start-iter", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=1800)
    add_output_args(ap, "powersgd.json")
    args = ap.parse_args()
    json_out = output_path(args.json_out, "powersgd.json", args.overwrite)
    results = {}
    for seed in args.seeds:
        for name, flags in SETTINGS:
            with tempfile.TemporaryDirectory(prefix="tandem-powersgd-") as d:
                r = run(args, flags, seed, d)
            results.setdefault(name, []).append(r)
            print(f"seed {seed} {name}: accuracy {r['accuracy']:.4f}, sent {r['comm_bytes'] / 1e6:.1f} MB "
                  f"of {r['bucket_bytes'] / 1e6:.1f} MB", file=sys.stderr, flush=True)
    base = results["allreduce"]
    rows = []
    print("| setting | test accuracy (mean) | vs all-reduce | bytes sent / all-reduce's |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        acc = sum(r["accuracy"] for r in runs) / len(runs)
        delta = acc - sum(r["accuracy"] for r in base) / len(base)
        ratio = sum(r["comm_bytes"] for r in runs) / sum(r["bucket_bytes"] for r in runs)
        rows.append({"setting": name, "accuracy": acc, "accuracy_delta": delta, "bytes_ratio": ratio, "runs": runs})
        print(f"| {name} | {acc:.4f} | {delta:+.4f} | {ratio:.4f} |")
    recipe = {k: v for k, v in vars(args).items() if k not in ("json_out", "overwrite")}
    write_json(json_out, {"machine": describe(), "recipe": recipe, "rows": rows})


if __name__ == "__main__":
    main()
