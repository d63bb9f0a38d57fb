#!/usr/bin/python3
"""Benchmarks the training step of the two example models, Tandem against PyTorch 1.13.

Owns: running bench/model_steps (Tandem: train/models/resnet.h and train/models/gpt.h
built into one program) and bench/pytorch_models.py (the same models and recipes in PyTorch) as
child processes with the same flags, for each model and thread count, and reporting training
throughput (samples/s over --iters timed steps after --warmup untimed ones: training loop only,
synthetic data made before the clock starts) and peak resident memory (the child's own
ru_maxrss from os.wait4), with the ratios tandem / pytorch, as a markdown table on stdout and
as JSON (--json-out).
Assumes: Linux; Debian's /usr/bin/python3 with PyTorch 1.13 for the reference. Only the
standard library is used here (and compare_pytorch.py's process helpers).
Guarantees: one child at a time; each repeat runs Tandem then PyTorch (then --baseline-bin, another
model_steps build, when given, then with --own-fp32 both again without autocast) back to back, so a
change of load hits every side alike; samples/s is the median over --repeats, peak RSS the max; the
children get OMP_NUM_THREADS / MKL_NUM_THREADS and --threads N; a child that fails or times out
stops the script with its exit status and the tail of its output.

Example:
  /usr/bin/python3 bench/compare_models.py --tandem-bin build/bench/model_steps \\
      --threads 1,2 --repeats 3          # results in bench/runs/<date-time>/compare_models.json
  # PyTorch on both sides, tiny runs (tests this script without a build):
  /usr/bin/python3 bench/compare_models.py --pytorch-both --iters 2 --warmup 1 --repeats 1
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

from compare_pytorch import amp_over_own_fp32, fmt_mib, run_child, tail
from machine import add_output_args, cpu_label, describe, output_path, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = ("resnet", "gpt")
RECIPES = {
    "resnet": "ResNet-20 shape, width 8 (68,642 parameters), 1x28x28 images, batch 64, "
              "SGD momentum 0.9 Nesterov, weight decay 5e-4",
    "gpt": "GPT 2 layers, 4 heads, dim 64, context 64, vocabulary 99 (110,528 parameters), "
           "batch 16 windows, AdamW, clip_grad_norm 1",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Compare the example models' training step, Tandem "
                                            "vs PyTorch: samples/s, peak RSS")
    p.add_argument("--tandem-bin", default=os.path.join(ROOT, "build", "bench", "model_steps"))
    p.add_argument("--baseline-bin", default=None,
                   help="another model_steps build (e.g. of an older commit), run in each repeat "
                        "too: before/after ratios from the same run")
    p.add_argument("--pytorch-both", action="store_true",
                   help="run the PyTorch script in the tandem slot too (tests this script)")
    p.add_argument("--python", default="/usr/bin/python3", help="interpreter with PyTorch")
    p.add_argument("--pytorch-script", default=os.path.join(HERE, "pytorch_models.py"))
    p.add_argument("--models", default="resnet,gpt", help="comma-separated: resnet, gpt")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--iters", type=int, default=30, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per (program, model, threads); samples/s is the median, RSS the max")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--device", default="cpu",
                   help="cpu, cuda or cuda:N: both sides train there (the GPU check uses cuda; the PyTorch "
                        "side then needs --python with a CUDA-enabled torch)")
    add_output_args(p, "compare_models.json")
    p.add_argument("--amp", default="off", choices=["off", "bf16", "fp16"],
                   help="both sides run the forward under autocast in that dtype (fp16: CUDA only on "
                        "PyTorch's side)")
    p.add_argument("--own-fp32", action="store_true",
                   help="with --amp: also run both sides without autocast in the same rounds, for the amp / own "
                        "fp32 ratios")
    p.add_argument("--keep-logs", default=None, help="directory to keep each run's output in")
    args = p.parse_args(argv)
    if args.own_fp32 and args.amp == "off":
        p.error("--own-fp32 needs --amp (it adds the fp32 runs an amp run is divided by)")
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in args.model_list if m not in MODELS]
    if bad or not args.model_list:
        p.error(f"--models: unknown {','.join(bad) or '(none)'}; expected a comma-separated "
                f"subset of {','.join(MODELS)}")
    try:
        args.thread_list = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        p.error(f"--threads: expected comma-separated integers, got {args.threads!r}")
    if not args.thread_list or min(args.thread_list) < 1:
        p.error(f"--threads: expected integers >= 1, got {args.threads!r}")
    if args.amp == "fp16" and not args.device.startswith("cuda"):
        p.error("--amp fp16 needs --device cuda: PyTorch's CPU autocast runs bfloat16 only, so there is no "
                "float16 peer to compare with on the CPU (use --amp bf16)")
    if args.iters < 1 or args.warmup < 0 or args.repeats < 1:
        p.error("--iters and --repeats must be >= 1, --warmup >= 0")
    return args


# A side named *_fp32 (--own-fp32) is the side before the underscore without autocast.
def command(args, side, model, threads, metrics):
    amp = "off" if side.endswith("_fp32") else args.amp
    side = side.removesuffix("_fp32")
    flags = ["--model", model, "--iters", str(args.iters), "--warmup", str(args.warmup),
             "--threads", str(threads), "--metrics-out", metrics, "--device", args.device,
             "--amp", amp]
    if side == "pytorch" or args.pytorch_both:
        return [args.python, args.pytorch_script] + flags
    return [args.baseline_bin if side == "baseline" else args.tandem_bin] + flags


def run_once(args, side, model, threads, rep, workdir):
    tag = f"{model}_{side}_t{threads}_r{rep}"
    metrics = os.path.join(workdir, tag + ".jsonl")
    log = os.path.join(workdir, tag + ".log")
    argv = command(args, side, model, threads, metrics)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    load = os.getloadavg()[0]
    print(f"# {tag} (load {load:.2f}): {' '.join(argv)}", file=sys.stderr, flush=True)
    rc, wall, rss = run_child(argv, env, log, args.timeout)
    if rc != 0:
        sys.exit(f"{tag} failed with exit status {rc}; last output:\n{tail(log)}")
    recs = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            recs = [json.loads(line) for line in f if line.strip()]
    if len(recs) != 1 or recs[0].get("type") != "bench":
        sys.exit(f"{tag}: expected one \"bench\" line in {metrics}, got {len(recs)}; last output:\n"
                 f"{tail(log)}")
    return dict(recs[0], peak_rss_bytes=rss, wall_s=wall, load_avg_1min_before=load)


def summary(runs, argv):
    return {"samples_per_s": statistics.median(r["samples_per_s"] for r in runs),
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
            "last_loss": runs[-1]["last_loss"], "params": runs[-1]["params"],
            "command": argv, "runs": runs}


def measure(args, model, threads, workdir):
    sides = ("tandem", "pytorch") + (("baseline",) if args.baseline_bin else ()) + \
        (("tandem_fp32", "pytorch_fp32") if args.own_fp32 else ())
    runs = {side: [] for side in sides}
    for rep in range(args.repeats):
        for side in sides:
            runs[side].append(run_once(args, side, model, threads, rep, workdir))
    s = {side: summary(runs[side], command(args, side, model, threads, "METRICS")) for side in sides}
    t, p = s["tandem"], s["pytorch"]
    out = {"model": model, "threads": threads, "tandem": t, "pytorch": p,
           "ratio_samples_per_s": t["samples_per_s"] / p["samples_per_s"],
           "ratio_peak_rss": t["peak_rss_bytes"] / p["peak_rss_bytes"]}
    if args.own_fp32:
        out.update(tandem_fp32=s["tandem_fp32"], pytorch_fp32=s["pytorch_fp32"], amp_over_own_fp32=amp_over_own_fp32(s))
    if args.baseline_bin:
        b = s["baseline"]
        out.update(baseline=b, baseline_ratio_samples_per_s=b["samples_per_s"] / p["samples_per_s"],
                   speedup_over_baseline=t["samples_per_s"] / b["samples_per_s"])
    return out


def amp_label(args):
    return f", amp {args.amp}" if args.amp != "off" else ""


def print_table(args, results):
    name = "pytorch(as tandem)" if args.pytorch_both else "tandem"
    print(f"\n{name} vs PyTorch on {args.device}{amp_label(args)}, host {cpu_label()}; {args.iters} timed steps "
          f"after {args.warmup}, median of {args.repeats}\n")
    for m in args.model_list:
        print(f"- {m}: {RECIPES[m]}")
    print(f"\n| model | threads | {name} samples/s | PyTorch samples/s | ratio | {name} peak RSS MiB "
          "| PyTorch peak RSS MiB | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        t, p = r["tandem"], r["pytorch"]
        print(f"| {r['model']} | {r['threads']} | {t['samples_per_s']:.1f} | {p['samples_per_s']:.1f} | "
              f"{r['ratio_samples_per_s']:.2f} | {fmt_mib(t['peak_rss_bytes'])} | "
              f"{fmt_mib(p['peak_rss_bytes'])} | {r['ratio_peak_rss']:.2f} |")
    if args.own_fp32:
        print(f"\n| model | threads | {name} {args.amp} / own fp32 | PyTorch {args.amp} / own fp32 |\n"
              "|---|---:|---:|---:|")
        for r in results:
            o = r["amp_over_own_fp32"]
            print(f"| {r['model']} | {r['threads']} | {o['tandem']:.2f} | {o['pytorch']:.2f} |")
    if args.baseline_bin:
        print(f"\nbaseline: {args.baseline_bin}\n")
        print(f"| model | threads | baseline samples/s | baseline / PyTorch | {name} / PyTorch | "
              f"{name} / baseline |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in results:
            print(f"| {r['model']} | {r['threads']} | {r['baseline']['samples_per_s']:.1f} | "
                  f"{r['baseline_ratio_samples_per_s']:.2f} | {r['ratio_samples_per_s']:.2f} | "
                  f"{r['speedup_over_baseline']:.2f} |")


def main(argv=None):
    args = parse_args(argv)
    json_out = output_path(args.json_out, "compare_models.json", args.overwrite)
    if not args.pytorch_both and not os.access(args.tandem_bin, os.X_OK):
        sys.exit(f"--tandem-bin {args.tandem_bin} is not an executable (build the model_steps "
                 "target, or pass --pytorch-both to test this script with PyTorch on both sides)")
    if args.baseline_bin and (args.pytorch_both or not os.access(args.baseline_bin, os.X_OK)):
        sys.exit(f"--baseline-bin {args.baseline_bin}: expected an executable model_steps build, "
                 "and no --pytorch-both")
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: 1-minute load average is {load:.2f}: other work shares the CPUs, so "
              "throughput (multi-threaded runs above all) will be low and noisy", file=sys.stderr)
    results = []
    with tempfile.TemporaryDirectory(prefix="tandem_models_") as tmp:
        workdir = args.keep_logs or tmp
        os.makedirs(workdir, exist_ok=True)
        for model in args.model_list:
            for threads in args.thread_list:
                results.append(measure(args, model, threads, workdir))
    print_table(args, results)
    out = {
        "what": "training step of examples/resnet and examples/transformer, Tandem "
                f"(bench/model_steps) vs PyTorch (bench/pytorch_models.py), {args.device}",
        "tandem_side": "pytorch_models.py" if args.pytorch_both else args.tandem_bin,
        "machine": describe(args.python),
        "config": {k: v for k, v in vars(args).items()
                   if k not in ("json_out", "keep_logs", "overwrite", "model_list", "thread_list")},
        "recipes": {m: RECIPES[m] for m in args.model_list},
        "samples_per_s": "median over repeats of batch * iters / seconds of the timed steps",
        "peak_rss": "the child's own ru_maxrss (os.wait4), max over repeats",
        "results": results,
    }
    write_json(json_out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
