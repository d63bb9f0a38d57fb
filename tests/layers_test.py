#!/usr/bin/env python3
"""The engine's layering rule, checked against the build's own compile commands.

The rule (docs/architecture.md): core <- kernels <- {nn, optim} <- dist <- train, and data uses only
core. Inside dist/: store <- group <- parallel (a store cannot include a process group or a wrapper). Each folder is the object library tandem_<folder> (cmake/TandemLayers.cmake), which sees only
the folders it may use. This test states the rule independently of the CMake code and proves it:

1. every engine source is compiled by its own folder's library, and by nothing else but a test
   executable's own copy of it;
2. for every pair of folders (L, F): a file compiled exactly as L's sources are (the same compiler,
   flags and include directories, from compile_commands.json) that includes a header of F compiles
   when L may use F, and fails naming that header when it may not. So adding
   `#include "nn/module.h"` to a file in core/ fails tandem_core's build.

3. (--max-lines N) no source file of the engine or its apps is longer than N lines.
4. (--max-function-lines N) no function in apps/ or train/ is longer than N lines (a body from a
   line that opens it, at namespace level or as an inline member, to its closing brace at the same
   indentation): a long loop becomes a Runner hook or a helper.

Usage: layers_test.py --build BUILD_DIR --source SOURCE_DIR
       layers_test.py --source SOURCE_DIR --max-lines 600
       layers_test.py --source SOURCE_DIR --max-function-lines 120
"""
import argparse
import re
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import tempfile

# What each folder may include besides itself: the specification, kept here on purpose so that a
# loosened CMake declaration fails this test.
MAY_USE = {
    "core": set(),
    "kernels": {"core"},
    "nn": {"core", "kernels"},
    "optim": {"core", "kernels"},
    "data": {"core"},
    "dist/store": {"core"},
    "dist/group": {"core", "dist/store"},
    "dist/parallel": {"core", "kernels", "nn", "optim", "dist/store", "dist/group"},
    "train": {"core", "kernels", "nn", "optim", "data", "dist/store", "dist/group", "dist/parallel"},
}
# One header per folder to include (any would do; these are small).
PROBE = {
    "core": "core/error.h",
    "kernels": "kernels/activation.h",
    "nn": "nn/module.h",
    "optim": "optim/optimizer.h",
    "data": "data/sampler.h",
    "dist/store": "dist/store/store.h",
    "dist/group": "dist/group/process_group.h",
    "dist/parallel": "dist/parallel/comm_hook.h",
    "train": "train/work_dir.h",
}


def layer_of(rel):
    """The layer a source file belongs to: the longest MAY_USE folder that holds it (dist/store/x.cpp
    belongs to dist/store), or None for a file outside the engine."""
    parts = rel.split(os.sep)
    for n in range(len(parts) - 1, 0, -1):
        folder = "/".join(parts[:n])
        if folder in MAY_USE:
            return folder
    return None


def arguments(entry):
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]
    return args


def syntax_only(args, source, probe):
    """The compile command of `source` turned into a syntax check of `probe`."""
    out, skip = [], 0
    for i, a in enumerate(args):
        if skip:
            skip -= 1
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = 1
            continue
        if a in ("-c", "-MD", "-MMD") or a == source:
            continue
        out.append(a)
    return out + ["-fsyntax-only", probe]


def check_lengths(src, limit):
    """Every engine and app source within `limit` lines: a file past it is split by concern."""
    long_files, n = [], 0
    for top in list(MAY_USE) + ["apps"]:
        for root, _, files in os.walk(os.path.join(src, top)):
            for f in files:
                if f.endswith((".h", ".cpp", ".cu", ".cuh")):
                    n += 1
                    path = os.path.join(root, f)
                    count = sum(1 for _ in open(path, errors="replace"))
                    if count > limit:
                        long_files.append(f"{os.path.relpath(path, src)}: {count} lines")
    if n == 0:
        print(f"FAIL: no source file found under {src}")
        return 1
    if long_files:
        print(f"FAIL: over {limit} lines (split by concern):\n  " + "\n  ".join(long_files))
        return 1
    print(f"ok: {n} files, none over {limit} lines")
    return 0


FUNCTION_HEAD = re.compile(r"^( *)[^ /#}].*\)[^;]*\{\s*$")
NOT_FUNCTION = re.compile(r"^\s*(namespace|class|struct|enum|union|if|for|while|switch|else|do|try|catch)\b")


def check_function_lengths(src, limit, tops=("apps", "train")):
    """Every function body in `tops` within `limit` lines."""
    long_functions, n = [], 0
    for top in tops:
        for root, _, files in os.walk(os.path.join(src, top)):
            for f in files:
                if not f.endswith((".h", ".cpp")):
                    continue
                path = os.path.join(root, f)
                lines = open(path, errors="replace").read().split("\n")
                i = 0
                while i < len(lines):
                    m = FUNCTION_HEAD.match(lines[i])
                    if not m or NOT_FUNCTION.match(lines[i]) or len(m.group(1)) > 2:
                        i += 1
                        continue
                    close = m.group(1) + "}"
                    j = i + 1
                    while j < len(lines) and not (lines[j].startswith(close) and
                                                  lines[j][len(close):len(close) + 1] in ("", ";", " ")):
                        j += 1
                    n += 1
                    if j - i + 1 > limit:
                        long_functions.append(f"{os.path.relpath(path, src)}:{i + 1}: {j - i + 1} lines")
                    i = j + 1
    if n == 0:
        print(f"FAIL: no function found under {tops}")
        return 1
    if long_functions:
        print(f"FAIL: functions over {limit} lines:\n  " + "\n  ".join(long_functions))
        return 1
    print(f"ok: {n} functions in {', '.join(tops)}, none over {limit} lines")
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build")
    p.add_argument("--source", required=True)
    p.add_argument("--max-lines", type=int)
    p.add_argument("--max-function-lines", type=int)
    a = p.parse_args()
    src = os.path.realpath(a.source)
    if a.max_function_lines is not None:
        return check_function_lengths(src, a.max_function_lines)
    if a.max_lines is not None:
        return check_lengths(src, a.max_lines)
    if not a.build:
        p.error("--build is required to check the layers")
    db_path = os.path.join(a.build, "compile_commands.json")
    if not os.path.exists(db_path):
        print(f"FAIL: {db_path} is missing (the build exports it: CMAKE_EXPORT_COMPILE_COMMANDS)")
        return 1
    db = json.load(open(db_path))
    failures = []

    # 1. Each engine source belongs to its folder's library only.
    commands = {}
    by_layer = set()     # engine sources that their folder's library compiles
    test_copies = []     # (source, output): an engine source a test executable compiles a copy of
    for e in db:
        f = os.path.realpath(os.path.join(e["directory"], e["file"]))
        rel = os.path.relpath(f, src)
        folder = layer_of(rel)
        if folder is None:
            continue
        target = f"tandem_{folder.replace('/', '_')}.dir"
        output = e.get("output", "")
        if not output:
            args = arguments(e)
            output = args[args.index("-o") + 1] if "-o" in args else ""
        out = "/" + output.replace(os.sep, "/")
        if f"/{target}/" in out:
            by_layer.add(rel)
            if rel.endswith(".cpp"):
                commands.setdefault(folder, (e, f))
        elif out.startswith("/tests/CMakeFiles/"):
            test_copies.append((rel, output))
        else:
            failures.append(f"{rel} is compiled by {output}, not by {target[:-4]}")
    # A test executable may compile its own copy of an engine source (the GPU tests of a shared build take
    # the cuBLAS forwarders that libtandem keeps local: tests/CMakeLists.txt), as long as the source's
    # folder's library compiles it too.
    for rel, output in test_copies:
        if rel not in by_layer:
            failures.append(f"{rel} is compiled by {output} only, not by its folder's library")
    for folder in MAY_USE:
        if folder not in commands:
            failures.append(f"no C++ source of {folder}/ in compile_commands.json (is tandem_{folder} built?)")
        if not os.path.exists(os.path.join(src, PROBE[folder])):
            failures.append(f"probe header {PROBE[folder]} does not exist: update PROBE")
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        return 1

    # 2. Every pair of folders.
    tmp = tempfile.mkdtemp(prefix="tandem-layers-")
    jobs = []
    for layer, (entry, source) in commands.items():
        for folder, header in PROBE.items():
            probe = os.path.join(tmp, f"{layer}_includes_{folder}.cpp".replace("/", "_"))
            with open(probe, "w") as f:
                f.write(f'#include "{header}"\n')
            args = syntax_only(arguments(entry), entry["file"], probe)
            allowed = folder == layer or folder in MAY_USE[layer]
            jobs.append((layer, folder, header, allowed, args, entry["directory"]))

    def run(job):
        layer, folder, header, allowed, args, cwd = job
        r = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
        return job, r

    checked = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        for (layer, folder, header, allowed, args, _), r in pool.map(run, jobs):
            checked += 1
            said = (r.stdout + r.stderr).strip()
            if allowed and r.returncode != 0:
                failures.append(f"{layer} may include {header} but it does not compile there:\n{said[:2000]}")
            elif not allowed and r.returncode == 0:
                failures.append(f"{layer} must not include {header}, yet it compiles with tandem_{layer}'s flags")
            elif not allowed and not any(m in said for m in (f"{header}: No such file or directory",  # gcc
                                                             f"'{header}' file not found")):  # clang
                failures.append(f"{layer} including {header} fails, but not by not finding it:\n{said[:2000]}")
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    os.rmdir(tmp)
    allowed_pairs = sum(1 for j in jobs if j[3])
    if failures:
        print("\n\n".join("FAIL: " + f for f in failures))
        return 1
    print(f"ok: {checked} pairs checked ({allowed_pairs} allowed and compiling, "
          f"{checked - allowed_pairs} refused for a missing include)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
