#!/usr/bin/env python3
"""Realistic user mistakes, each answered by one line that says what was wrong, what was expected and
the fix, in the user's own terms: through the trainer (tandem-mnist, tandem-train, tandem-test), the
launcher (tandem-run), the scripts (tools/dist_train.sh, tools/slurm_train.sh) and the tools
(tools/analyze_logs.py).

Each case runs a command and checks: the exit code; that exactly one line of its stderr is an error
line (starts with "<program>: error:", "usage:" or names the script); that this line contains every
expected piece, in order; and that it carries no source tag ("[file.cpp:12]"), no raw library
exception text ("[json.exception") and no 309-digit range.

Usage: mistakes_test.py --source DIR --build DIR
"""
import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def cases(apps, tmp):
    """(name, argv, env, exit code, pieces the error line must contain, in order)."""
    mnist, train, test, run = (os.path.join(apps, n) for n in ("tandem-mnist", "tandem-train", "tandem-test",
                                                             "tandem-run"))
    mm = "configs/mnist/mnist_net_adadelta.json"
    bad_json = os.path.join(tmp, "bad.json")
    with open(bad_json, "w") as f:
        f.write('{"train": {"epochs": 2,}}\n')
    not_weights = os.path.join(tmp, "notes.safetensors")
    with open(not_weights, "w") as f:
        f.write("these are my notes, not weights\n")
    no_cuda = {"CUDA_VISIBLE_DEVICES": "-1"}
    return [
        # -- the trainer's flags
        ("batch size 0", [mnist, "--batch-size", "0"], {}, 2, ["tandem-mnist: error: --batch-size (train_dataloader.batch_size): must be >= 1, got 0"]),
        ("epochs 0", [train, "--epochs", "0"], {}, 2, ["tandem-train: error: --epochs (train_cfg.max_epochs): must be >= 1, got 0"]),
        ("negative lr", [mnist, "--lr", "-1"], {}, 2, ["--lr (optim_wrapper.optimizer.lr): must be >= 0, got -1"]),
        ("gamma 0", [mnist, "--gamma", "0"], {}, 2, ["--gamma (param_scheduler[0].gamma): must be > 0, got 0"]),
        ("epochs not a number", [mnist, "--epochs", "abc"], {}, 2, ["--epochs (train_cfg.max_epochs): must be an integer, got 'abc'"]),
        ("flag without its value", [mnist, "--auto-scale-lr", "--work-dir", "x"], {}, 2,
         ["--auto-scale-lr: needs a value (an integer) before '--work-dir'"]),
        ("misspelt flag", [mnist, "--epoch", "3"], {}, 2, ["unknown flag --epoch", "did you mean --epochs?"]),
        ("stray argument", [mnist, "configs/mnist_sgd.json", "3"], {}, 2, ["unexpected argument '3'"]),
        ("optimizer not offered", [mnist, "--optimizer", "rmsprop"], {}, 2,
         ["--optimizer: 'rmsprop' is not one of adadelta, sgd, adam"]),
        ("amp kind", [mnist, "--amp", "fp8"], {}, 2, ["--amp: 'fp8' is not one of off, fp16, bf16, auto"]),
        ("two configs", [train, mm, "--config", "configs/mnist_sgd.json"], {}, 2,
         ["two configs given", "give one"]),
        # -- configs
        ("missing config", [train, "configs/mnist_net.json"], {}, 2,
         ["cannot read config file 'configs/mnist_net.json': no such file", "configs/"]),
        ("config not JSON", [train, bad_json], {}, 2, ["config file", "is not valid JSON", "line 1"]),
        ("MMEngine key misspelt", [train, mm, "--cfg-options", "train_cfg.max_epoch=3"], {}, 2,
         ["unknown key 'train_cfg.max_epoch'", "did you mean 'train_cfg.max_epochs'?"]),
        ("MMEngine top-level key misspelt", [train, mm, "--cfg-options", "optim_wraper.optimizer.lr=0.1"], {}, 2,
         ["unknown config key 'optim_wraper'", "did you mean 'optim_wrapper'?"]),
        ("MMEngine value of the wrong type", [train, mm, "--cfg-options", "train_cfg.max_epochs=abc"], {}, 2,
         ["--cfg-options: config key 'train_cfg.max_epochs' must be an integer >= 1, got \"abc\""]),
        ("MMEngine value out of range", [train, mm, "--cfg-options", "train_cfg.max_epochs=0"], {}, 2,
         ["--cfg-options: config key 'train_cfg.max_epochs' must be >= 1, got 0"]),
        ("MMEngine optimizer misspelt", [train, mm, "--cfg-options", "optim_wrapper.optimizer.type=Adamm"], {}, 2,
         ["'optim_wrapper.optimizer.type' 'Adamm' is not a registered optimizer", "did you mean 'Adam'?",
          "registered: Adadelta, Adam, AdamW, SGD"]),
        ("optimizer argument misspelt", [train, mm, "--cfg-options", "optim_wrapper.optimizer.lrr=0.1",
                                         "--work-dir", os.path.join(tmp, "w0")], no_cuda, 2,
         ["optim_wrapper.optimizer: unknown argument 'lrr' (did you mean 'lr'?)"]),
        ("own key misspelt", [mnist, "--cfg-options", "optimizer.lt=1"], {}, 2,
         ["unknown config key 'optimizer.lt'", "did you mean 'optimizer.lr'?",
          "optimizer.lr is optim_wrapper.optimizer.lr"]),
        ("unsupported vis backend", [train, mm, "--cfg-options",
                                     'visualizer.vis_backends=[{"type":"WandbVisBackend"}]'], {}, 2,
         ["'WandbVisBackend' is not supported", "TensorboardVisBackend"]),
        # -- data, devices, files, launchers
        ("no data there", [mnist, "--data-dir", tmp, "--work-dir", os.path.join(tmp, "w1")], no_cuda, 1,
         ["MNIST train files not found under", "run scripts/setup.sh"]),
        ("no GPU", [mnist, "--device", "cuda:7", "--limit", "64", "--work-dir", os.path.join(tmp, "w2")], no_cuda, 1,
         ["--device cuda:7", "CUDA", "--device cpu"]),
        ("device typo", [mnist, "--device", "gpu", "--limit", "64", "--work-dir", os.path.join(tmp, "w3")], no_cuda, 1,
         ["device 'gpu'", "cpu", "cuda"]),
        ("resume from nothing", [mnist, "--resume", os.path.join(tmp, "nosuch.safetensors"),
                                 "--work-dir", os.path.join(tmp, "w4")], no_cuda, 1,
         ["checkpoint", "nosuch.safetensors", "does not exist"]),
        ("weights that are not weights", [mnist, "--init-weights", not_weights, "--limit", "64",
                                          "--work-dir", os.path.join(tmp, "w5")], no_cuda, 1,
         ["notes.safetensors"]),
        ("launcher without its environment", [mnist, "--launcher", "pytorch", "--work-dir",
                                              os.path.join(tmp, "w6")], no_cuda, 1,
         ["launcher 'pytorch'", "RANK is not set", "tandem-run"]),
        ("tandem-test without a checkpoint", [test, mm], {}, 2, ["usage:", "CONFIG CHECKPOINT"]),
        # -- the launcher
        ("no workers", [run, "--nproc-per-node", "0", "/bin/true"], {}, 2, ["--nproc-per-node must be >= 1, got 0"]),
        ("no program", [run, "--nproc-per-node", "2"], {}, 2, ["no PROGRAM given"]),
        ("program missing", [run, "/no/such/prog"], {}, 127,
         ["tandem-run: error: cannot start rank 0: cannot execute /no/such/prog", "No such file"]),
        ("port 0", [run, "--master-port", "0", "/bin/true"], {}, 2, ["--master-port: must be between 1 and 65535, got 0"]),
        ("negative restarts", [run, "--max-restarts", "-1", "/bin/true"], {}, 2, ["--max-restarts: must be >= 0, got -1"]),
        ("elastic range reversed", [run, "--nnodes", "3:2", "/bin/true"], {}, 2, ["--nnodes 3:2", "MIN <= MAX"]),
        ("rendezvous backend unknown", [run, "--nnodes", "2", "--rdzv-backend", "zookeeper", "/bin/true"], {}, 2,
         ["--rdzv-backend", "zookeeper", "etcd"]),
        # -- the scripts and tools
        ("dist_train.sh without GPUS", ["sh", "tools/dist_train.sh", mm], {}, 2, ["usage:", "CONFIG GPUS"]),
        ("dist_train.sh with a missing config", ["sh", "tools/dist_train.sh", "configs/nosuch.json", "2"], {}, 2,
         ["dist_train.sh: error: config 'configs/nosuch.json' not found"]),
        ("dist_train.sh GPUS not a number", ["sh", "tools/dist_train.sh", mm, "two"], {}, 2,
         ["dist_train.sh: error: GPUS must be a number of processes >= 1, got 'two'"]),
        ("slurm_train.sh without WORK_DIR", ["sh", "tools/slurm_train.sh", "p", "job", mm], {}, 2,
         ["usage:", "PARTITION JOB_NAME CONFIG WORK_DIR"]),
        ("analyze_logs.py on no file", [PYTHON, "tools/analyze_logs.py", "plot_curve", os.path.join(tmp, "no.json")],
         {}, 2, ["analyze_logs.py: error:", "no such file", "vis_data/scalars.json"]),
        ("analyze_logs.py without matplotlib", [PYTHON, "-S", "tools/analyze_logs.py", "plot_curve",
                                                os.path.join(tmp, "no.json")], {}, 2,
         ["analyze_logs.py: error: plot_curve draws with matplotlib", "apt install python3-matplotlib"]),
    ]


def port_in_use_cases(apps):
    """A port another job holds: named with the way the user chose it (flag or PORT=)."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    run = os.path.join(apps, "tandem-run")
    return holder, [
        ("port taken, tandem-run", [run, "--master-port", str(port), "/bin/true"], {}, 1,
         [f"MASTER_PORT {port}", "already in use", "--master-port"]),
        ("port taken, dist_train.sh", ["sh", "tools/dist_train.sh", "configs/mnist_ddp.json", "1"],
         {"PORT": str(port)}, 1, [f"MASTER_PORT {port}", "already in use", f"PORT={port + 1} sh tools/dist_train.sh"]),
    ]


def error_lines(stderr):
    return [l for l in stderr.splitlines()
            if re.match(r"^[\w.-]+: (error|unexpected error)|^usage:", l) or ": error:" in l]


def check(source, apps, case, failures):
    name, argv, env, code, pieces = case
    out = subprocess.run(argv, cwd=source, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TANDEM_BIN": apps, **env})
    lines = error_lines(out.stderr)
    problems = []
    if out.returncode != code:
        problems.append(f"exit code {out.returncode}, expected {code}")
    if len(lines) != 1:
        problems.append(f"{len(lines)} error lines, expected one")
    line = lines[-1] if lines else ""
    at = 0
    for piece in pieces:
        found = line.find(piece, at)
        if found < 0:
            problems.append(f"lacks {piece!r}")
        else:
            at = found + len(piece)
    for bad in (r"\[[\w/]+\.(cpp|h|cu):\d+\]", r"\[json\.exception", r"\d{40}", r"Traceback"):
        if re.search(bad, out.stderr):
            problems.append(f"has {bad!r}")
    if problems:
        failures.append(f"{name}: {'; '.join(problems)}\n    $ {' '.join(argv)}\n    stderr: "
                        + "\n            ".join(out.stderr.strip().splitlines()[-3:]))
    return line


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True)
    parser.add_argument("--build", required=True)
    parser.add_argument("--show", action="store_true", help="print every case's error line")
    args = parser.parse_args()
    source = os.path.abspath(args.source)
    apps = os.path.join(os.path.abspath(args.build), "apps")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        holder, port_cases = port_in_use_cases(apps)
        all_cases = cases(apps, tmp) + port_cases
        for case in all_cases:
            line = check(source, apps, case, failures)
            if args.show:
                print(f"{case[0]:40} {line}")
        holder.close()
    for f in failures:
        print("FAIL", f)
    print(f"mistakes_test: {len(all_cases)} mistakes, {len(failures)} without the expected one-line answer")
    return 1 if failures or len(all_cases) < 30 else 0


if __name__ == "__main__":
    sys.exit(main())
