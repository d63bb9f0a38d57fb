#!/usr/bin/env python3
"""Checks every CUDA-library symbol the engine uses against the installed libraries (no GPU needed).

Owns: the symbol half of scripts/ci/cuda.sh.
  1. Linked libraries: every undefined dynamic symbol of libtandem.so (nm -D --undefined-only) that
     looks like the CUDA runtime (cuda*, __cuda*), the driver API (cu[A-Z]*), cuDNN (cudnn*) or NCCL
     (nccl*) must be defined (nm -D --defined-only) in the library of that family that libtandem.so
     actually loads: its NEEDED entries resolved by ldd (RUNPATH included) to real paths. A versioned
     reference (name@VERSION) must find that version.
  2. cuBLAS, which the engine does not link but loads with dlopen (kernels/cuda/cublas_loader.cpp):
     every entry point that file forwards (the extern "C" functions it defines, and the names it
     passes to dlsym) must be defined in libcublas.so.<TANDEM_CUBLAS_SOVERSION>, the file the loader
     dlopens first, found beside TANDEM_CUBLAS_PATH or in <cuda-root>/lib64. Any cublas* symbol left
     undefined in libtandem.so is reported too (called but not forwarded).
Prints one table row per symbol; exits 1 naming each missing symbol and the library searched.
Assumes: binutils' nm and readelf, ldd; the compile definitions are read from compile_commands.json.

Usage: cuda_symbols.py --lib BUILD/libtandem.so.X --compile-commands BUILD/compile_commands.json
                       --loader kernels/cuda/cublas_loader.cpp [--cuda-root /usr/local/cuda]
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys

FAMILIES = [  # (family, symbol regex, library file name regex)
    ("cudart", re.compile(r"^(__cuda|cuda)"), re.compile(r"^libcudart\.so")),
    ("cudnn", re.compile(r"^cudnn"), re.compile(r"^libcudnn\.so")),
    ("nccl", re.compile(r"^p?nccl"), re.compile(r"^libnccl\.so")),
    ("driver", re.compile(r"^cu[A-Z]"), re.compile(r"^libcuda\.so")),
    ("cublas", re.compile(r"^cublas"), re.compile(r"^libcublas\.so")),
]


def run(argv):
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"cuda_symbols.py: {' '.join(argv)} failed ({r.returncode}):\n{r.stderr.strip()}")
    return r.stdout


def family_of(name):
    for fam, sym_re, _ in FAMILIES:
        if sym_re.match(name):
            return fam
    return None


def split_version(sym):
    """'cudaMalloc@libcudart.so.13' -> ('cudaMalloc', 'libcudart.so.13'); '@@' (default) likewise."""
    if "@" not in sym:
        return sym, None
    name, _, ver = sym.partition("@")
    return name, ver.lstrip("@") or None


def undefined_symbols(lib):
    out = {}
    for line in run(["nm", "-D", "--undefined-only", lib]).splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[-2] in ("U", "w", "v"):
            name, ver = split_version(parts[-1])
            out[name] = ver
    return out


_defined_cache = {}


def defined_symbols(lib):
    """name -> set of versions (None for an unversioned definition)."""
    if lib not in _defined_cache:
        syms = {}
        for line in run(["nm", "-D", "--defined-only", lib]).splitlines():
            parts = line.split()
            if len(parts) >= 3:
                name, ver = split_version(parts[-1])
                syms.setdefault(name, set()).add(ver)
        _defined_cache[lib] = syms
    return _defined_cache[lib]


def needed_libraries(lib):
    """[(soname, real path or None)] of lib's NEEDED entries, resolved the way the loader does (ldd)."""
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run(["readelf", "-d", lib]))
    ldd = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
    where = {}
    for line in ldd.splitlines():
        m = re.match(r"\s*(\S+) => (not found|\S+)", line)
        if m:
            where[m.group(1)] = None if m.group(2) == "not found" else os.path.realpath(m.group(2))
    return [(n, where.get(n)) for n in needed]


def compile_definition(commands_path, source_suffix, macro):
    with open(commands_path) as f:
        commands = json.load(f)
    for c in commands:
        if c["file"].endswith(source_suffix):
            argv = c.get("arguments") or shlex.split(c["command"])
            for a in argv:
                if a.startswith(f"-D{macro}="):
                    return a.split("=", 1)[1].strip('"')
            return None
    sys.exit(f"cuda_symbols.py: {source_suffix} is not in {commands_path} (not compiled in this build?)")


def forwarded_cublas_names(loader_path):
    src = open(loader_path).read()
    names = set(re.findall(r"CUBLASWINAPI\s+(cublas\w+)\s*\(", src))  # the functions it defines
    names |= set(re.findall(r"cublas_symbol<[^>]*>\(\s*\"(\w+)\"", src))  # literal dlsym names
    names |= set(re.findall(r"TANDEM_FORWARD\(\s*(cublas\w+)\s*,", src))  # #name in the macro
    return sorted(names)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lib", required=True, help="the shared engine library (libtandem.so...)")
    p.add_argument("--compile-commands", required=True)
    p.add_argument("--loader", required=True, help="kernels/cuda/cublas_loader.cpp")
    p.add_argument("--cuda-root", default="/usr/local/cuda")
    args = p.parse_args()
    cuda_root = os.path.realpath(args.cuda_root)

    rows, missing = [], []  # rows: (symbol, family, library, status)

    # ---- 1. the libraries libtandem.so links ----
    needed = needed_libraries(args.lib)
    by_family = {}
    print(f"libtandem: {args.lib}")
    for soname, path in needed:
        fam = next((f for f, _, lib_re in FAMILIES if lib_re.match(soname)), None)
        if fam:
            print(f"  NEEDED {soname} -> {path or 'NOT FOUND'}")
            if path is None:
                missing.append(f"{soname}: NEEDED by {args.lib} but not found by the loader (ldd)")
            elif not path.startswith(cuda_root + os.sep):
                print(f"  note: {soname} resolves outside {cuda_root}")
            by_family.setdefault(fam, []).append(path)
    undefined = undefined_symbols(args.lib)
    checked = 0
    for name in sorted(undefined):
        fam = family_of(name)
        if fam is None:
            continue
        checked += 1
        ver = undefined[name]
        label = name + (f"@{ver}" if ver else "")
        if fam == "cublas":
            rows.append((label, fam, "(dlopen, not linked)", "MISSING"))
            missing.append(f"{name}: called by the engine but not forwarded by {args.loader}, and cuBLAS is "
                           "not linked")
            continue
        libs = [l for l in by_family.get(fam, []) if l]
        if not libs:
            rows.append((label, fam, "(none linked)", "MISSING"))
            missing.append(f"{label}: no {fam} library among libtandem's NEEDED entries "
                           f"({', '.join(n for n, _ in needed)})")
            continue
        found = None
        for lib in libs:
            versions = defined_symbols(lib).get(name)
            if versions is not None and (ver is None or ver in versions):
                found = lib
                break
        if found:
            rows.append((label, fam, found, "ok"))
        else:
            rows.append((label, fam, " ".join(libs), "MISSING"))
            missing.append(f"{label}: not defined in {' '.join(libs)}")

    # ---- 2. cuBLAS through the loader ----
    sover = compile_definition(args.compile_commands, "kernels/cuda/cublas_loader.cpp", "TANDEM_CUBLAS_SOVERSION")
    cpath = compile_definition(args.compile_commands, "kernels/cuda/cublas_loader.cpp", "TANDEM_CUBLAS_PATH")
    forwarded = forwarded_cublas_names(args.loader)
    if not sover:
        missing.append("TANDEM_CUBLAS_SOVERSION is not defined for kernels/cuda/cublas_loader.cpp")
    else:
        soname = f"libcublas.so.{sover}"
        dirs = ([os.path.dirname(cpath)] if cpath else []) + [os.path.join(cuda_root, "lib64"),
                                                             os.path.join(cuda_root, "lib")]
        cublas = next((os.path.realpath(os.path.join(d, soname)) for d in dirs
                       if os.path.exists(os.path.join(d, soname))), None)
        print(f"cuBLAS (dlopen): TANDEM_CUBLAS_SOVERSION={sover}, TANDEM_CUBLAS_PATH={cpath} -> "
              f"{cublas or 'NOT FOUND'}; {len(forwarded)} forwarded entry points")
        if cpath and not re.search(r"\.so\." + re.escape(sover) + r"(\.|$)", os.path.realpath(cpath)):
            missing.append(f"TANDEM_CUBLAS_PATH {cpath} is not a libcublas.so.{sover}")
        if not forwarded:
            missing.append(f"no forwarded cuBLAS entry point recognised in {args.loader}")
        if cublas is None:
            missing.append(f"{soname}: not found in {' '.join(dirs)}")
        for name in forwarded:
            checked += 1
            if cublas and name in defined_symbols(cublas):
                rows.append((name, "cublas", cublas, "ok"))
            else:
                rows.append((name, "cublas", cublas or soname, "MISSING"))
                missing.append(f"{name}: forwarded by {args.loader} but not defined in {cublas or soname}")

    w = max([len(r[0]) for r in rows] + [6])
    wl = max([len(r[2]) for r in rows] + [7])
    print(f"\n| {'symbol':<{w}} | family | {'library':<{wl}} | status  |")
    print(f"|{'-' * (w + 2)}|--------|{'-' * (wl + 2)}|---------|")
    for sym, fam, lib, status in rows:
        print(f"| {sym:<{w}} | {fam:<6} | {lib:<{wl}} | {status:<7} |")
    print(f"\n{checked} CUDA-library symbols checked ({sum(r[3] == 'ok' for r in rows)} ok)")
    if missing:
        print(f"\ncuda_symbols.py: FAILED, {len(missing)} problem(s):", file=sys.stderr)
        for m in missing:
            print(f"  {m}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
