"""What every benchmark states beside its figures, and where it writes them.

Owns: the CPU a figure was measured on (lscpu's model name, the core count and the flags that decide
which kernels run: AMX, AVX512_BF16, AVX512_FP16, AVX-512, AVX2), the peer's version (the PyTorch the
comparison ran against), and the output rule shared by the benchmark scripts: results go to a fresh
folder bench/runs/<date-time>/ unless a path is named, and an existing file is written over only with
--overwrite (so the committed bench/results/ files change only when asked).
Assumes: Linux (/proc/cpuinfo); only the standard library.
"""
import datetime
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs")

# The flags that choose a kernel path, in the order they are reported (cpuinfo spelling).
KERNEL_FLAGS = ("amx_tile", "amx_bf16", "amx_fp16", "avx512_fp16", "avx512_bf16", "avx512f", "avx2", "fma")


def _amd_core(family, model):
    """AMD's core generation from cpuinfo's family and model (a VM often reports just 'AMD EPYC')."""
    if family == 26:
        return "Zen 5"
    if family == 25:
        zen4 = 0x10 <= model <= 0x1F or 0x60 <= model <= 0x7F or 0xA0 <= model <= 0xAF
        return "Zen 4" if zen4 else "Zen 3"
    return None


def _cpuinfo():
    model, flags, family, number = None, set(), None, None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key == "cpu family" and family is None:
                    family = int(value)
                elif key == "model" and number is None:
                    number = int(value)
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except (OSError, ValueError):
        pass
    return model or platform.processor() or "unknown CPU", flags, family, number


def cpu_model():
    return _cpuinfo()[0]


def cpu():
    """{"model", "family", "model_number", "core", "cpus", "flags"}: the model name, cpuinfo's family
    and model numbers and the core generation they mean (AMD; else None), the logical CPUs, the
    kernel-choosing flags present."""
    model, flags, family, number = _cpuinfo()
    core = _amd_core(family, number) if "AMD" in model and family is not None and number is not None else None
    return {"model": model, "family": family, "model_number": number, "core": core, "cpus": os.cpu_count(),
            "flags": [f for f in KERNEL_FLAGS if f in flags]}


def cpu_label(info=None):
    """One line for a table's caption:
    'AMD EPYC (Zen 5, family 26 model 2), 2 CPUs (avx512_bf16 avx512f avx2 fma; no AMX)'."""
    info = info or cpu()
    flags = info["flags"]
    amx = "" if any(f.startswith("amx") for f in flags) else "; no AMX"
    ident = ""
    if info.get("family") is not None:
        core = f"{info['core']}, " if info.get("core") else ""
        ident = f" ({core}family {info['family']} model {info.get('model_number')})"
    return f"{info['model']}{ident}, {info['cpus']} CPUs ({' '.join(flags) or 'no AVX2'}{amx})"


def torch_version(python="/usr/bin/python3"):
    """The PyTorch version `python` imports, or None when it has none."""
    try:
        r = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                           text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def describe(python="/usr/bin/python3"):
    """The machine block every JSON result carries."""
    return {"cpu": cpu(), "python": sys.version.split()[0], "pytorch": torch_version(python)}


def fresh_run_dir():
    """A new folder bench/runs/<date-time>[-n]/ for one run's outputs."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path, n = os.path.join(RUNS, stamp), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(RUNS, f"{stamp}-{n}")
    os.makedirs(path)
    return path


def output_path(requested, default_name, overwrite, run_dir=None):
    """Where a script writes `default_name`: `requested` when given, else a file of a fresh run folder.
    Exits with a one-line message when the file exists and `overwrite` is false."""
    path = requested or os.path.join(run_dir or fresh_run_dir(), default_name)
    if os.path.exists(path) and not overwrite:
        sys.exit(f"{path} exists: pass --overwrite to replace it, or name another file "
                 "(without a path, results go to a fresh folder under bench/runs/)")
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    return path


def add_output_args(parser, name):
    """--json-out and --overwrite, worded alike in every script."""
    parser.add_argument("--json-out", default=None,
                        help=f"results file (default: bench/runs/<date-time>/{name})")
    parser.add_argument("--overwrite", action="store_true",
                        help="allow --json-out to replace an existing file (e.g. the committed bench/results/)")


def write_json(path, obj):
    """Writes one result file and says where."""
    import json
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    print(f"\nresults: {path}")
