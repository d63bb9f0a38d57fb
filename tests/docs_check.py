#!/usr/bin/env python3
"""The README's and docs/' commands, paths and flags exist.

For every shell block (```sh) of README.md, docs/*.md and bench/README.md, each command line (with its
continuation lines) is split into the programs it runs: a Tandem app (build/apps/tandem-*, or the bare
name as an installed program), a launcher script (tools/*.sh, whose extra arguments go to tandem-train),
a Python tool (tools/, bench/), a shell script (scripts/, bench/). Each program must exist and every
--flag given to it must be one it knows: an app's or a Python tool's own --help lists it, a shell
script's source names it. A trainer command without placeholders is also dry-run with --print-config
(the config, its _base_ files and every --cfg-options key resolve). Every repository path in those
commands, and every backticked repository path in the prose, must exist.

Usage: docs_check.py --source DIR --build DIR
"""
import argparse
import glob
import os
import re
import shlex
import subprocess
import sys

APPS = ("tandem-mnist", "tandem-train", "tandem-test", "tandem-run")
# Top-level folders whose paths the docs name; a backticked path under one of these must exist.
REPO_DIRS = ("apps", "bench", "cmake", "configs", "core", "data", "dist", "docs", "examples", "fuzz",
             "kernels", "nn", "optim", "scripts", "tests", "tools", "train")
# Paths that runs create, not the repository.
GENERATED = ("work_dirs/", "bench/runs/", "bench/results/", "gpu-check/", "gpu-bundle/", "build")
# The Python the set-up installs PyTorch and matplotlib for (Debian's), which the docs' tools use.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def markdown_files(source):
    files = [os.path.join(source, "README.md"), os.path.join(source, "bench", "README.md")]
    files += sorted(glob.glob(os.path.join(source, "docs", "*.md")))
    return files


def shell_commands(text):
    """(line number, command) for each command of the ```sh blocks, continuation lines joined."""
    commands, in_block, pending, start = [], False, "", 0
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            in_block = stripped in ("```sh", "```bash") if not in_block else False
            pending = ""
            continue
        if not in_block:
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        command = (pending + stripped).strip()
        pending = ""
        command = re.sub(r"(^|\s)#.*$", "", command).strip()  # the comment
        if command:
            commands.append((start, command))
    return commands


def is_placeholder(token):
    """CONFIG, PARTITION, F, [ARGS...], <path>: words a reader replaces."""
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_]*|\[.*|.*\.\.\..*|<.*>|.*\|.*", token))


class Checker:
    def __init__(self, source, build):
        self.source, self.build = source, build
        self.help_cache = {}
        self.failures = []

    def fail(self, where, message):
        self.failures.append(f"{where}: {message}")

    def app_path(self, name):
        return os.path.join(self.build, "apps", name)

    def known_flags(self, key, argv):
        if key not in self.help_cache:
            try:
                out = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=120,
                                     cwd=self.source)
                text = out.stdout + out.stderr
            except (OSError, subprocess.TimeoutExpired) as e:
                text = ""
                self.fail(key, f"--help did not run: {e}")
            self.help_cache[key] = set(re.findall(r"--[A-Za-z0-9][A-Za-z0-9_-]*", text))
        return self.help_cache[key]

    def check_flags(self, where, program, flags, known):
        for flag in flags:
            if flag not in known:
                self.fail(where, f"{program} has no flag {flag} (its --help lists {len(known)} flags)")

    def check_path(self, where, token):
        token = re.sub(r":\d+$", "", token.split("=", 1)[-1])  # file:line
        if not re.match(r"^(%s)/" % "|".join(REPO_DIRS), token) or is_placeholder(token):
            return
        if any(token.startswith(g) for g in GENERATED) or re.search(r"[*{}<>$]", token):
            return
        path = os.path.join(self.source, token.rstrip("/"))
        # A module is named without its extension (train/runner: runner.h and runner.cpp).
        if not any(os.path.exists(path + ext) for ext in ("", ".h", ".cpp", ".py")):
            self.fail(where, f"names {token}, which does not exist")

    def segments(self, tokens):
        """Split a command into (program, arguments) pieces: a launcher's program starts a new piece."""
        pieces, current = [], None
        for token in tokens:
            base = os.path.basename(token)
            starts = (base in APPS and (token.startswith("build/apps/") or token == base)) or \
                re.match(r"^(tools|scripts|bench|tests)/.*\.(sh|py)$", token) or \
                re.match(r"^build/(bench|examples)/|^build-[a-z]+/", token)
            # A Python tool's arguments name programs (--tandem-bin build/apps/...); they start nothing.
            if starts and not (current is not None and current[0].endswith(".py")):
                current = [token, []]
                pieces.append(current)
            elif current is not None:
                current[1].append(token)
        return pieces

    def check_command(self, where, command):
        try:
            tokens = shlex.split(command.replace("$((", "").replace("))", ""))
        except ValueError as e:
            self.fail(where, f"does not parse as a shell command ({e}): {command}")
            return
        for token in tokens:
            self.check_path(where, token)
        for program, args in self.segments(tokens):
            flags = [a.split("=", 1)[0] for a in args if a.startswith("--")]
            base = os.path.basename(program)
            if base in APPS:
                self.check_app(where, base, args, flags)
            elif program.endswith(".sh") and program.startswith("tools/"):
                # MMRazor's scripts: CONFIG GPUS [ARGS...] or PARTITION JOB CONFIG WORK_DIR [ARGS...];
                # the extra arguments go to tandem-train.
                self.check_script_exists(where, program)
                self.check_flags(where, f"tandem-train (through {program})", flags,
                                 self.known_flags("tandem-train", [self.app_path("tandem-train")]))
            elif program.endswith(".sh"):
                text = self.check_script_exists(where, program)
                for flag in flags:
                    if text is not None and flag not in text:
                        self.fail(where, f"{program} does not take {flag} (not in its source)")
            elif program.endswith(".py"):
                if self.check_script_exists(where, program) is not None and flags:
                    # A subcommand (analyze_logs.py plot_curve) has flags of its own.
                    sub = args[:1] if args and re.fullmatch(r"[a-z_]+", args[0]) else []
                    argv = [PYTHON, os.path.join(self.source, program)] + sub
                    self.check_flags(where, program, flags, self.known_flags(" ".join([program] + sub), argv))
            elif not os.path.exists(os.path.join(self.build, program.split("/", 1)[1])) and \
                    program.startswith("build/"):
                self.fail(where, f"{program} is not built by the default build")

    def check_script_exists(self, where, program):
        path = os.path.join(self.source, program)
        if not os.path.isfile(path):
            self.fail(where, f"{program} does not exist")
            return None
        with open(path, encoding="utf-8") as f:
            return f.read()

    def check_app(self, where, app, args, flags):
        path = self.app_path(app)
        if not os.path.isfile(path):
            self.fail(where, f"{app} is not built in {self.build}")
            return
        known = self.known_flags(app, [path])
        if app == "tandem-run":
            # Only tandem-run's own flags: the worker's program starts the next piece.
            self.check_flags(where, app, flags, known)
            return
        self.check_flags(where, app, flags, known)
        if app != "tandem-test" and not any(is_placeholder(a) for a in args):
            self.dry_run(where, path, args)

    def dry_run(self, where, path, args):
        # Drop what needs a launcher or a previous run; keep the config and the overrides.
        # --resume's file is optional; the others always take a value.
        drop_with_value = ("--launcher", "--init-weights", "--save-weights", "--local_rank", "--local-rank")
        kept, i = [], 0
        while i < len(args):
            a = args[i]
            i += 1
            if a in drop_with_value:
                i += 1
            elif a == "--resume":
                i += 1 if i < len(args) and args[i].endswith(".safetensors") else 0
            elif not a.startswith(tuple(f + "=" for f in drop_with_value + ("--resume",))):
                kept.append(a)
        argv = [path] + kept + ["--print-config"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.source,
                             env={**os.environ, "CUDA_VISIBLE_DEVICES": "-1"})
        if out.returncode != 0:
            last = (out.stderr.strip() or out.stdout.strip()).split("\n")[-1]
            self.fail(where, f"dry run `{' '.join(argv[1:])}` failed: {last}")

    def every_flag(self):
        """The flags of every program the docs talk about: the apps, the tools, the scripts, the benchmarks."""
        flags = set()
        for app in APPS:
            flags |= self.known_flags(app, [self.app_path(app)])
        for path in sorted(glob.glob(os.path.join(self.source, "*", "*.py")) +
                           glob.glob(os.path.join(self.source, "*", "*.sh")) +
                           glob.glob(os.path.join(self.source, "*", "*", "*.sh")) +
                           glob.glob(os.path.join(self.source, "tests", "*", "*.py"))):
            with open(path, encoding="utf-8", errors="replace") as f:
                flags |= set(re.findall(r"--[A-Za-z0-9][A-Za-z0-9_-]*", f.read()))
        for path in sorted(glob.glob(os.path.join(self.build, "bench", "*"))):
            if os.path.isfile(path) and os.access(path, os.X_OK):
                flags |= self.known_flags(path, [path])
        return flags

    def check_prose_flags(self, where_file, text, known):
        for number, line in enumerate(text.split("\n"), 1):
            for flag in re.findall(r"`(--[A-Za-z0-9][A-Za-z0-9_-]*)", line):
                if flag not in known and not re.search(r"(PyTorch|torchrun|MMEngine|Slurm|srun|mpirun|cmake|nvcc)",
                                                       line):
                    self.fail(f"{where_file}:{number}", f"names the flag {flag}, which no program here takes")

    def check_prose_paths(self, where_file, text):
        for number, line in enumerate(text.split("\n"), 1):
            for match in re.finditer(r"`([^`\s]+)`", line):
                # MMEngine's `tools/train.py` is theirs, not a path here.
                if re.search(r"(MMEngine|MMRazor|PyTorch|torchrun)'s (`[^`]*`\)?(, | and | or ))*$",
                             line[:match.start()]):
                    continue
                self.check_path(f"{where_file}:{number}", match.group(1).rstrip(".,:;"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True)
    parser.add_argument("--build", required=True)
    args = parser.parse_args()
    checker = Checker(os.path.abspath(args.source), os.path.abspath(args.build))
    count = 0
    known_flags = checker.every_flag()
    for path in markdown_files(checker.source):
        rel = os.path.relpath(path, checker.source)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for number, command in shell_commands(text):
            checker.check_command(f"{rel}:{number}", command)
            count += 1
        checker.check_prose_paths(rel, text)
        checker.check_prose_flags(rel, text, known_flags)
    if count < 20:
        checker.fail("docs_check", f"only {count} commands found: is the block syntax (```sh) still used?")
    for failure in checker.failures:
        print(failure)
    print(f"docs_check: {count} commands in {len(markdown_files(checker.source))} files, "
          f"{len(checker.failures)} problem(s)")
    return 1 if checker.failures else 0


if __name__ == "__main__":
    sys.exit(main())
