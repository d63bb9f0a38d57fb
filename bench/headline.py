#!/usr/bin/python3
"""The headline table: every ratio against PyTorch that the README states, from one run folder.

Owns: reading the JSON files that bench/run_all.sh leaves in its run folder (compare_pytorch.json,
compare_pytorch_bf16.json, compare_models.json, compare_models_bf16.json, compare_ddp.json, ddp_buckets.json,
allreduce.json, kernels.json) and writing one markdown table, table.md, headed by the CPU (model, cores, the flags that choose kernels),
the PyTorch version it was compared with and the date. A file that is missing leaves its rows out and
is named under the table, so a partial run still reports what it measured. The rows from kernels.json
(kernels_bench) are Tandem's alone, with "-" for PyTorch: the GEMM peak f32 and bf16 at 1 and 2 threads,
the core's multiply-add peak (a register-only loop), the MNIST trainer as a share of its GEMM-bound
limit (the peak of its dtype at its thread count over the FLOPs of one training sample), and each conv
and linear case's GFLOP/s and share of its dtype's peak; a peak is the larger of the GEMM's and the
multiply-add loop's (times the threads).
Assumes: the files' formats as the scripts of bench/ write them. Only the standard library.
Example:  /usr/bin/python3 bench/headline.py bench/runs/<date-time>
"""
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from machine import cpu_label, describe  # noqa: E402


def load(folder, name):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def count(n, word):
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def per_threads(results, key="threads"):
    return {r[key]: r for r in results}


# A bf16 result's (Tandem, PyTorch) bf16 / own fp32 and a label note: from the fp32 runs of the same
# rounds (--own-fp32) when it has them, else divided by the separate fp32 step's result (or None).
def own_fp32_ratio(bf16_result, fp32_result):
    if "amp_over_own_fp32" in bf16_result:
        o = bf16_result["amp_over_own_fp32"]
        return o["tandem"], o["pytorch"], " (fp32 runs in the same rounds)"
    if fp32_result is None:
        return None
    return (bf16_result["tandem"]["samples_per_s"] / fp32_result["tandem"]["samples_per_s"],
            bf16_result["pytorch"]["samples_per_s"] / fp32_result["pytorch"]["samples_per_s"],
            " (fp32 from the fp32 step)")


def mnist_rows(fp32, bf16):
    rows = []
    if fp32:
        for t, r in sorted(per_threads(fp32["results"]).items()):
            rows.append((f"MNIST trainer, {count(t, 'thread')}, samples/s", r["tandem"]["samples_per_s"],
                         r["pytorch"]["samples_per_s"], r["ratio_samples_per_s"]))
        worst = max(fp32["results"], key=lambda r: r["tandem"]["peak_rss_bytes"])
        rows.append(("MNIST trainer, peak RSS MiB", worst["tandem"]["peak_rss_bytes"] / 2**20,
                     worst["pytorch"]["peak_rss_bytes"] / 2**20, worst["ratio_peak_rss"]))
    if bf16:
        own = per_threads(fp32["results"]) if fp32 else {}
        for t, r in sorted(per_threads(bf16["results"]).items()):
            rows.append((f"MNIST trainer, bf16 autocast, {count(t, 'thread')}, samples/s", r["tandem"]["samples_per_s"],
                         r["pytorch"]["samples_per_s"], r["ratio_samples_per_s"]))
            ratio = own_fp32_ratio(r, own.get(t))
            if ratio:
                rows.append((f"  bf16 / own fp32, {count(t, 'thread')}{ratio[2]}", ratio[0], ratio[1], None))
    return rows


def model_rows(models, bf16):
    rows = []
    for r in models["results"] if models else []:
        rows.append((f"{r['model']} training step, {count(r['threads'], 'thread')}, samples/s", r["tandem"]["samples_per_s"],
                     r["pytorch"]["samples_per_s"], r["ratio_samples_per_s"]))
    own = {(r["model"], r["threads"]): r for r in models["results"]} if models else {}
    for r in bf16["results"] if bf16 else []:
        key, label = (r["model"], r["threads"]), f"{r['model']} training step, bf16 autocast, {count(r['threads'], 'thread')}"
        rows.append((f"{label}, samples/s", r["tandem"]["samples_per_s"], r["pytorch"]["samples_per_s"],
                     r["ratio_samples_per_s"]))
        ratio = own_fp32_ratio(r, own.get(key))
        if ratio:
            rows.append((f"  bf16 / own fp32, {r['model']}, {count(r['threads'], 'thread')}{ratio[2]}", ratio[0],
                         ratio[1], None))
    return rows


def ddp_rows(ddp, buckets):
    rows = []
    if ddp:
        res, ratios = ddp["results"], ddp["ratios"]
        for n in (1, 2):
            t, p = res.get(f"tandem{n}"), res.get(f"pytorch{n}")
            if t and p:
                rows.append((f"MNIST DDP, {count(n, 'rank')} x 1 thread, samples/s", t["samples_per_s"], p["samples_per_s"],
                             t["samples_per_s"] / p["samples_per_s"]))
        if "tandem_2_over_1" in ratios and "pytorch_2_over_1" in ratios:
            rows.append(("  2 ranks / 1 rank", ratios["tandem_2_over_1"], ratios["pytorch_2_over_1"], None))
    mlp = (buckets or {}).get("summary", {}).get("mlp", {})
    if "tandem" in mlp and "pytorch" in mlp:
        t, p = mlp["tandem"], mlp["pytorch"]
        rows.append(("MLP compute-only step, ms", t["compute_ms"], p["compute_ms"], t["compute_ms"] / p["compute_ms"]))
        cap = "25" if "25" in mlp.get("tandem_over_pytorch", {}) else None
        if cap:
            sweep = buckets["results"]["mlp"]
            ts, ps = sweep["tandem"]["sweep"][cap]["step_ms"], sweep["pytorch"]["sweep"][cap]["step_ms"]
            rows.append(("MLP DDP step, 2 ranks, bucket cap 25 MiB, ms", ts, ps, ts / ps))
        rows.append(("MLP all-reduce of all gradients, ms", t["allreduce_all_ms"], p["allreduce_all_ms"],
                     t["allreduce_all_ms"] / p["allreduce_all_ms"]))
    return rows


def allreduce_rows(data):
    """The engine's in-place all-reduce against Gloo's ring over TCP, per size (median iteration)."""
    rows, runs = [], {}
    for b in (data or {}).get("benchmarks", []):
        if b.get("run_type", "iteration") == "iteration" and "median_us" in b:
            runs.setdefault(b["name"].split("/")[0], {})[int(b["bytes"])] = b["median_us"]
    ours, ring = runs.get("engine_buffer", {}), runs.get("gloo_ring", {})
    for size in sorted(set(ours) & set(ring)):
        rows.append((f"all-reduce {size / 2**20:g} MiB, 2 ranks, us (engine in place / Gloo ring)", ours[size],
                     ring[size], ours[size] / ring[size]))
    return rows


# FLOPs of one MnistNet training sample as the profiler counts its GEMM-shaped work: conv1 forward and
# weight grad (2 x 194,688 multiply-adds), conv2 forward and both grads (3 x 2,230,272), fc1 (3 x 204,800)
# and fc2 (3 x 1,280) forward and both grads: 7,698,432 multiply-adds, ~15.4 MFLOP.
MNIST_FLOP_PER_SAMPLE = 2 * 7_698_432
DTYPES = ("f32", "bf16")


def kernel_figures(data):
    """{(case, args...): (label, median FLOP/s over its repetitions)} from kernels_bench's JSON."""
    runs = {}
    for b in (data or {}).get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration" or "FLOP/s" not in b:
            continue
        parts = b.get("run_name", b["name"]).split("/")
        key = (parts[0].removeprefix("BM_"),) + tuple(int(p) for p in parts[1:] if p.isdigit())
        runs.setdefault(key, (b.get("label", ""), []))[1].append(b["FLOP/s"])
    return {k: (label, statistics.median(v)) for k, (label, v) in runs.items()}


def kernel_rows(data, fp32, bf16):
    """Tandem alone ("-" for PyTorch): the peaks, the MNIST trainer against its GEMM-bound limit, and
    each conv and linear case of kernels_bench against the 1-thread peak of its dtype."""
    figures = kernel_figures(data)
    if not figures:
        return []
    gemm = {(d, t): figures[("GemmPeak", t, i)][1] for i, d in enumerate(DTYPES) for t in (1, 2)
            if ("GemmPeak", t, i) in figures}
    fma = {d: figures[("FmaPeak", i)][1] for i, d in enumerate(DTYPES) if ("FmaPeak", i) in figures}
    # The peak a share is of: the larger of the 512^3 GEMM and the core's multiply-add loop (times the
    # threads), so that no kernel reads above what the core can do.
    peak = {(d, t): max(v, t * fma.get(d, 0)) for (d, t), v in gemm.items()}
    rows = [("**Tandem alone** (kernels_bench; no PyTorch figure): speed against the core's peak", "", "", "")]
    order = lambda kv: (DTYPES.index(kv[0][0]), kv[0][1])  # noqa: E731
    for (d, t), v in sorted(gemm.items(), key=order):
        rows.append((f"GEMM peak 512^3, {d}, {count(t, 'thread')}, GFLOP/s", v / 1e9, "-", "-"))
    for d, v in sorted(fma.items(), key=lambda kv: DTYPES.index(kv[0])):
        rows.append((f"multiply-add peak (registers only), {d}, 1 thread, GFLOP/s", v / 1e9, "-", "-"))
    for (d, t), v in sorted(peak.items(), key=order):
        rows.append((f"peak the shares are of, {d}, {count(t, 'thread')}, GFLOP/s (the larger of the two, x threads)",
                     v / 1e9, "-", "-"))
    for d, run, what in (("f32", fp32, "MNIST trainer"), ("bf16", bf16, "MNIST trainer, bf16 autocast")):
        for t, r in sorted(per_threads(run["results"]).items()) if run else []:
            if (d, t) in peak:
                limit = peak[(d, t)] / MNIST_FLOP_PER_SAMPLE
                label = f"{what}, {count(t, 'thread')}, % of its GEMM-bound limit ({d} peak / 15.4 MFLOP per sample)"
                rows.append((label, 100 * r["tandem"]["samples_per_s"] / limit, "-", "-"))
    def shapes(kind):
        return sorted({k[1] for k in figures if k[0].startswith(kind)})
    cases = [("Linear", "linear", n) for n in reversed(shapes("Linear"))]
    cases += [("Conv2d", "conv", n) for n in shapes("Conv2d")]
    for kind, word, n in cases:
        for direction in ("Forward", "Backward"):
            for i, d in enumerate(DTYPES):
                key = (kind + direction + ("Bf16" if d == "bf16" and kind == "Conv2d" else ""), n)
                key += (i,) if kind == "Linear" else ()
                if key not in figures:
                    continue
                label, v = figures[key]
                share = f" ({100 * v / peak[(d, 1)]:.0f}%)" if (d, 1) in peak else ""
                rows.append((f"{word} {label}: {direction.lower()} {d}, 1 thread, GFLOP/s (% of {d} peak)",
                             f"{fmt(v / 1e9)}{share}", "-", "-"))
    # A downsampling block's two convs as one op beside the two one by one (BM_Conv2dPair/block/separate/pass).
    for key in sorted(k for k in figures if k[0] == "Conv2dPair"):
        label, v = figures[key]
        share = f" ({100 * v / peak[('f32', 1)]:.0f}%)" if ("f32", 1) in peak else ""
        rows.append((f"conv pair {label}, f32, 1 thread, GFLOP/s (% of f32 peak)", f"{fmt(v / 1e9)}{share}", "-", "-"))
    return rows


def fmt(v):
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def table(folder):
    fp32, bf16 = load(folder, "compare_pytorch.json"), load(folder, "compare_pytorch_bf16.json")
    models, ddp = load(folder, "compare_models.json"), load(folder, "compare_ddp.json")
    models_bf16 = load(folder, "compare_models_bf16.json")
    buckets, allreduce = load(folder, "ddp_buckets.json"), load(folder, "allreduce.json")
    kernels = load(folder, "kernels.json")
    machine = next((d["machine"] for d in (fp32, models, ddp, bf16) if d and isinstance(d.get("machine", {}).get("cpu"), dict)),
                   None) or describe()
    rows = mnist_rows(fp32, bf16) + model_rows(models, models_bf16) + ddp_rows(ddp, buckets) + allreduce_rows(allreduce)
    rows += kernel_rows(kernels, fp32, bf16)
    lines = [f"Measured on {cpu_label(machine['cpu'])}; peer: PyTorch {machine.get('pytorch') or 'not found'}; "
             f"{time.strftime('%Y-%m-%d', time.localtime(os.path.getmtime(folder)))}; folder {os.path.basename(os.path.abspath(folder))}",
             "", "| what | Tandem | PyTorch | Tandem / PyTorch |", "|---|---:|---:|---:|"]
    lines += [f"| {what} | {fmt(t)} | {fmt(p)} | {fmt(r)} |" for what, t, p, r in rows]
    missing = [n for n, d in (("compare_pytorch.json", fp32), ("compare_pytorch_bf16.json", bf16),
                              ("compare_models.json", models), ("compare_models_bf16.json", models_bf16),
                              ("compare_ddp.json", ddp),
                              ("ddp_buckets.json", buckets), ("allreduce.json", allreduce),
                              ("kernels.json", kernels)) if d is None]
    if missing:
        lines += ["", "Not measured in this run (file missing): " + ", ".join(missing)]
    return "\n".join(lines) + "\n", rows


def main(argv):
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        sys.exit("usage: bench/headline.py RUN_FOLDER (a folder that bench/run_all.sh filled)")
    text, rows = table(argv[0])
    if not rows:
        sys.exit(f"{argv[0]}: no benchmark results in it (expected the JSON files of bench/run_all.sh)")
    with open(os.path.join(argv[0], "table.md"), "w") as f:
        f.write(text)
    print(text, end="")
    print(f"\ntable: {os.path.join(argv[0], 'table.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
