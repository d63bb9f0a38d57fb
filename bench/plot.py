#!/usr/bin/python3
"""Pictures and markdown tables from the communication benchmarks' JSON.

Owns: turning bench/results/ddp_buckets.json (bench/ddp_buckets.py) and bench/results/allreduce.json
(allreduce_bench's --benchmark_out) into
  results/ddp_buckets_<model>.png  step time and hidden share against bucket_cap_mb, tandem vs PyTorch,
                                   with the compute-only step and the bound max(compute, all-reduce)
  results/allreduce.png            bus bandwidth against message size per variant (engine, engine_tcp,
                                   raw Gloo algorithms), the engine's time over the fastest raw Gloo
                                   variant, and engine_tcp's over gloo_ring (gloo::allreduce's ring, the
                                   call the engine's TCP path makes: its overhead)
  results/ddp_buckets.md, results/allreduce.md   the same numbers as markdown tables
  (a sweep run with --gradient-as-bucket-view writes ddp_buckets_<model>_view.png and ddp_buckets_view.md)
Either input may be missing (its outputs are skipped). Rates and times are drawn on log axes, so the
slow and the fast variants both stay readable; titles name the CPU and the transports in words. Outputs go
next to the inputs (--in-dir, default bench/results/) or to --out-dir; an existing output is replaced only
with --overwrite. Uses Debian's python3-matplotlib (Agg backend).
Example:  /usr/bin/python3 bench/plot.py --in-dir bench/runs/<date-time>   (a fresh sweep's folder)
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ddp_buckets import markdown as ddp_markdown  # noqa: E402

COLORS = {"tandem": "tab:blue", "pytorch": "tab:orange"}


def plot_ddp(data, outdir):
    written = []
    caps = data["settings"]["caps"]
    for model, per in data["results"].items():
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        xs = list(range(len(caps)))
        for fw, res in per.items():
            sweep = res["sweep"]
            ys = [sweep[c]["step_ms"] if c in sweep else float("nan") for c in caps]
            ax1.plot(xs, ys, "o-", color=COLORS.get(fw), label=f"{fw} DDP step")
            ax1.axhline(res["compute"]["step_ms"], color=COLORS.get(fw), ls=":", lw=1,
                        label=f"{fw} compute-only (1 process)")
            s = data["summary"].get(model, {}).get(fw)
            if s:
                ax1.axhline(s["bound_ms"], color=COLORS.get(fw), ls="--", lw=1,
                            label=f"{fw} bound max(compute, all-reduce {s['allreduce_all_ms']:.0f} ms)")
            hs = [sweep[c]["hidden_share"] if c in sweep else float("nan") for c in caps]
            # Clipped at -1 (waiting longer than twice the all-reduce alone: a late rank); NaN stays a gap.
            ax2.plot(xs, [h if h != h else max(-1.0, h) for h in hs], "o-", color=COLORS.get(fw), label=fw)
        for ax in (ax1, ax2):
            ax.set_xticks(xs)
            ax.set_xticklabels(caps)
            ax.set_xlabel("bucket_cap_mb (none = one bucket after backward)")
            ax.grid(alpha=0.3)
        ax1.set_ylabel("step time, ms (rank 0, median; log)")
        ax1.set_yscale("log")
        ax1.legend(fontsize=7)
        ax2.set_ylabel("hidden share = 1 - exposed / all-reduce\n(clipped at -1)", fontsize=9)
        ax2.set_ylim(-1.05, 1.05)
        ax2.axhline(0, color="gray", lw=0.8)
        ax2.legend(fontsize=8)
        params = next(iter(per.values()))["compute"]["params"]
        st = data["settings"]
        fig.suptitle(f"DDP bucket sweep, {model} ({params / 1e6:.1f}M params), {st['nproc']} ranks x "
                     f"{st['threads']} thread, batch {st['batch']}/rank, {cpu_name(data)}"
                     f"{', gradient_as_bucket_view' if st.get('gradient_as_bucket_view') else ''}"
                     f"{' (quick)' if st.get('quick') else ''}", fontsize=10)
        fig.tight_layout()
        path = os.path.join(outdir, f"ddp_buckets_{model}{view_suffix(data)}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    path = os.path.join(outdir, f"ddp_buckets{view_suffix(data)}.md")
    with open(path, "w") as f:
        f.write(ddp_markdown(data) + "\n")
    written.append(path)
    return written


def load_allreduce(data):
    """{variant: {bytes: (time_us, busbw_GBps)}} from Google Benchmark's JSON (iterations, not aggregates):
    the median iteration when the run has it, else the mean."""
    out = {}
    for b in data.get("benchmarks", []):
        if b.get("error_occurred") or b.get("run_type", "iteration") != "iteration":
            continue
        variant = b["name"].split("/")[0]
        scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b.get("time_unit", "us")]
        if "median_us" in b:  # the median iteration (allreduce_bench's counters)
            out.setdefault(variant, {})[int(b["bytes"])] = (b["median_us"], b["busbw_median_GBps"])
        else:
            out.setdefault(variant, {})[int(b["bytes"])] = (b["real_time"] * scale, b["busbw_GBps"])
    return out


def view_suffix(data):
    """'_view' for a sweep run with --gradient-as-bucket-view, so both sweeps' outputs can sit side by side."""
    return "_view" if data.get("settings", {}).get("gradient_as_bucket_view") else ""


# The engine's own variants; the others are Gloo called directly.
ENGINE_VARIANTS = ("engine", "engine_buffer", "engine_tcp", "nccl")


def human(nbytes):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes / div:g} {unit}"
    return f"{nbytes} B"


def cpu_name(data):
    """The CPU a result was measured on, from either result format's machine block."""
    cpu = data.get("machine", {}).get("cpu", "unknown CPU")
    return cpu.get("model", "unknown CPU") if isinstance(cpu, dict) else cpu


def allreduce_title(ctx):
    """'all-reduce, 2 ranks on one host, AMD EPYC; engine: shared memory (...); Gloo: TCP over lo (127.0.0.1)'
    from allreduce_bench's context (its transport string is Gloo's device description)."""
    fields = dict(f.strip().split("=", 1) for f in ctx.get("transport", "").split(",") if "=" in f)
    gloo = "TCP"
    if fields.get("iface"):
        gloo += f" over {fields['iface']}"
    if fields.get("addr"):
        gloo += f" ({fields['addr'].strip('[]')})"
    return (f"all-reduce of float32 messages, {ctx.get('world_size', '?')} ranks, {ctx.get('cpu_model', 'unknown CPU')}; "
            f"engine: {ctx.get('engine_transport', '?')}; Gloo's own algorithms: {gloo}")


def plot_allreduce(data, outdir):
    runs = load_allreduce(data)
    if not runs:
        return []
    raw = [v for v in runs if v not in ENGINE_VARIANTS]
    sizes = sorted({s for v in runs.values() for s in v})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for variant, pts in sorted(runs.items()):
        xs = sorted(pts)
        ax1.plot(xs, [pts[x][1] for x in xs], "o-", lw=2.5 if variant in ENGINE_VARIANTS else 1.2, label=variant)
    ratios, same, inplace = [], [], []
    for s in sizes:
        best = min((runs[v][s][0] for v in raw if s in runs[v]), default=None)
        if "engine" in runs and s in runs["engine"] and best:
            ratios.append((s, runs["engine"][s][0] / best))
        if "engine_buffer" in runs and s in runs["engine_buffer"] and best:
            inplace.append((s, runs["engine_buffer"][s][0] / best))
        if "engine_tcp" in runs and s in runs["engine_tcp"] and s in runs.get("gloo_ring", {}):
            same.append((s, runs["engine_tcp"][s][0] / runs["gloo_ring"][s][0]))
    ax2.plot([r[0] for r in ratios], [r[1] for r in ratios], "o-", color="tab:blue",
             label="engine (shared memory on one host) / fastest raw Gloo variant")
    if inplace:
        ax2.plot([r[0] for r in inplace], [r[1] for r in inplace], "^-", color="tab:purple",
                 label="engine_buffer (in place, DDP's buckets) / fastest raw Gloo variant")
    ax2.plot([r[0] for r in same], [r[1] for r in same], "s--", color="tab:green",
             label="engine_tcp / gloo_ring (the call the engine's TCP path makes)")
    ax2.legend(fontsize=7, loc="best", framealpha=0.8)
    ax2.axhline(1.0, color="gray", lw=0.8)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([human(s) for s in sizes], rotation=45, fontsize=7)
        ax.set_xlabel("message size (float32)")
        ax.grid(alpha=0.3)
    ax1.set_ylabel("bus bandwidth GB/s = 2(n-1)/n x bytes / median time (log)")
    ax1.set_yscale("log")
    ax1.legend(fontsize=8)
    ax2.set_ylabel("engine time / raw Gloo time (log)")
    ax2.set_yscale("log")
    ctx = data.get("context", {})
    fig.suptitle(allreduce_title(ctx), fontsize=9)
    fig.tight_layout()
    png = os.path.join(outdir, "allreduce.png")
    fig.savefig(png, dpi=100)
    plt.close(fig)

    variants = [v for v in ENGINE_VARIANTS if v in runs] + sorted(v for v in runs if v not in ENGINE_VARIANTS)
    lines = ["| size | " + " | ".join(f"{v} median us (bus GB/s)" for v in variants) +
             " | engine_tcp / gloo_ring | engine / fastest raw Gloo | engine_buffer / fastest raw Gloo |",
             "|---|" + "---:|" * (len(variants) + 3)]
    columns = (dict(same), dict(ratios), dict(inplace))
    for s in sizes:
        cells = []
        for v in variants:
            t = runs.get(v, {}).get(s)
            cells.append(f"{t[0]:.0f} ({t[1]:.2f})" if t else "")
        cells += [f"{c[s]:.2f}" if s in c else "" for c in columns]
        lines.append(f"| {human(s)} | " + " | ".join(cells) + " |")
    md = os.path.join(outdir, "allreduce.md")
    with open(md, "w") as f:
        f.write("\n".join(lines) + "\n")
    return [png, md]


def outputs(data_kind, data, outdir):
    """The files plot_ddp / plot_allreduce would write for `data`."""
    if data_kind == "allreduce":
        return [os.path.join(outdir, n) for n in ("allreduce.png", "allreduce.md")]
    suffix = view_suffix(data)
    return ([os.path.join(outdir, f"ddp_buckets_{m}{suffix}.png") for m in data["results"]] +
            [os.path.join(outdir, f"ddp_buckets{suffix}.md")])


def main(argv=None):
    p = argparse.ArgumentParser(description="plots and tables from the communication benchmarks' JSON")
    p.add_argument("--in-dir", default=os.path.join(HERE, "results"),
                   help="folder with ddp_buckets.json and/or allreduce.json (default bench/results)")
    p.add_argument("--ddp-json", default=None, help="default: IN_DIR/ddp_buckets.json")
    p.add_argument("--allreduce-json", default=None, help="default: IN_DIR/allreduce.json")
    p.add_argument("--out-dir", default=None, help="default: IN_DIR")
    p.add_argument("--overwrite", action="store_true", help="replace outputs that exist already")
    args = p.parse_args(argv)
    args.ddp_json = args.ddp_json or os.path.join(args.in_dir, "ddp_buckets.json")
    args.allreduce_json = args.allreduce_json or os.path.join(args.in_dir, "allreduce.json")
    args.out_dir = args.out_dir or args.in_dir
    os.makedirs(args.out_dir, exist_ok=True)
    inputs = []
    for kind, path in (("ddp", args.ddp_json), ("allreduce", args.allreduce_json)):
        if os.path.exists(path):
            with open(path) as f:
                inputs.append((kind, json.load(f)))
    existing = [o for kind, data in inputs for o in outputs(kind, data, args.out_dir) if os.path.exists(o)]
    if existing and not args.overwrite:
        sys.exit(f"{existing[0]} exists: pass --overwrite to replace it, or --out-dir another folder")
    written = []
    for kind, data in inputs:
        written += (plot_ddp if kind == "ddp" else plot_allreduce)(data, args.out_dir)
    if not written:
        sys.exit(f"nothing to plot: neither {args.ddp_json} nor {args.allreduce_json} exists")
    for w in written:
        print("wrote", w)


if __name__ == "__main__":
    main()
