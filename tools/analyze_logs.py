#!/usr/bin/python3
"""Plots training curves from Tandem's vis_data/scalars.json, as MMEngine's
tools/analysis_tools/analyze_logs.py plot_curve does from its scalars.

  python3 tools/analyze_logs.py plot_curve work_dirs/a/vis_data/scalars.json \\
      work_dirs/b/vis_data/scalars.json --keys loss lr accuracy --legend a b --out curves.png

Each file is JSON lines written by the trainer's LoggerHook: progress records (loss, lr, base_lr,
time, data_time, memory, grad_norm; "step" the global iteration) and validation records
(accuracy, test_loss; "step" the iteration at which it ran). One subplot per key, one line per
file (several runs on one plot); the x axis is the iteration. Needs matplotlib (Debian's
python3-matplotlib, installed by scripts/setup.sh); draws with the Agg backend, no display.
Errors (a missing file, a key no file has) are one line on stderr and exit status 2.
"""
import argparse
import json
import os
import sys


def load(path):
    records = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"analyze_logs.py: error: {path}:{n}: not a JSON line ({e.msg})")
    return records


def plot_curve(args):
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(f"analyze_logs.py: error: plot_curve draws with matplotlib, which {sys.executable} does not "
                         "have; install it (Debian: apt install python3-matplotlib, which /usr/bin/python3 uses) "
                         "or run this script with a Python that has it")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = []
    for path in args.json_logs:
        if not os.path.isfile(path):
            raise SystemExit(f"analyze_logs.py: error: {path}: no such file (expected <work_dir>/vis_data/scalars.json)")
        runs.append(load(path))
    legend = args.legend or [os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(p)))) or p
                             for p in args.json_logs]
    if len(legend) != len(runs):
        raise SystemExit(f"analyze_logs.py: error: --legend has {len(legend)} names for {len(runs)} files")
    fig, axes = plt.subplots(len(args.keys), 1, figsize=(8, 3 * len(args.keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], args.keys):
        drawn = False
        for name, records in zip(legend, runs):
            points = [(r["step"], r[key]) for r in records if key in r and r[key] is not None and "step" in r]
            if not points:
                continue
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o" if len(points) < 20 else None, label=name)
            drawn = True
        if not drawn:
            known = sorted({k for records in runs for r in records for k in r} - {"step", "epoch", "iter"})
            raise SystemExit(f"analyze_logs.py: error: no file has key '{key}' (keys: {', '.join(known)})")
        ax.set_xlabel("iter")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend()
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    if args.out:
        fig.savefig(args.out, dpi=args.dpi)
        print(f"saved {args.out}")
    else:
        raise SystemExit("analyze_logs.py: error: --out FILE.png is required (no display)")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Plot Tandem's training curves (vis_data/scalars.json).")
    sub = ap.add_subparsers(dest="task", required=True)
    p = sub.add_parser("plot_curve", help="loss, learning-rate and accuracy curves to an image")
    p.add_argument("json_logs", nargs="+", help="vis_data/scalars.json files, one per run")
    p.add_argument("--keys", nargs="+", default=["loss"], help="scalars to plot (default: loss)")
    p.add_argument("--legend", nargs="+", help="one name per file (default: the work dir names)")
    p.add_argument("--title")
    p.add_argument("--out", help="output image (PNG)")
    p.add_argument("--dpi", type=int, default=100)
    args = ap.parse_args(argv)
    if args.task == "plot_curve":
        plot_curve(args)


if __name__ == "__main__":
    try:
        main()
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            sys.exit(2)
        raise
