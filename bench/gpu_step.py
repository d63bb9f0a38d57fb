#!/usr/bin/env python3
"""Training-step throughput of the MNIST convnet in PyTorch on one GPU: eager and torch.compile.

Owns: the PyTorch side of scripts/gpu/check.sh's benchmark step (Tandem's side is tandem-mnist's own
"epoch" metrics line, measured in the same run by that script).
What it runs: bench/pytorch_mnist.py's Net (the network tandem-mnist trains, same parameter names and
init), nll_loss, Adadelta lr 1.0 (the reference recipe), batch 64, on Fashion-MNIST (or random data with
--synthetic), for --warmup steps and then --steps timed steps, for each mode:
  eager           the module as it is
  compile         torch.compile(module) (inductor; needs PyTorch >= 2 and Triton: reported as
                  unavailable, not failed, when either is missing); compilation happens in the warm-up
and each data path:
  host            as tandem-mnist's loop: the batch gathered on the host from a shuffled order, copied
                  to the GPU, loss.item() after every step (tandem-mnist writes every iteration's loss,
                  so it synchronises every step too)
  device          the data set on the GPU, batches gathered there, no host sync inside the timed loop
torch.cuda.synchronize() before the clock starts and before it stops. samples/s = steps x batch / time.
Prints one JSON object (and writes it to --json-out): settings, versions, device, results per mode/path.
Assumes: a PyTorch with CUDA (exits 3 saying so otherwise); only the standard library besides torch.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pytorch_mnist import Net, load_dataset  # noqa: E402  (the one definition of the net and data)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--synthetic", action="store_true", help="random images and labels instead of the data")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=200, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps first (compilation happens here)")
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--paths", default="host,device")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cuda", help="cuda, cuda:N (cpu only to test this script)")
    p.add_argument("--json-out", default=None)
    return p.parse_args()


def make_data(args, n):
    if args.synthetic:
        g = torch.Generator().manual_seed(args.seed)
        return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)
    return load_dataset(args.data_dir, True, n)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure(args, mode, path, x_host, y_host, dev):
    torch.manual_seed(args.seed)
    net = Net().to(dev)
    net.train()
    model = net
    if mode == "compile":
        if not hasattr(torch, "compile"):
            return {"status": "unavailable", "why": f"torch {torch.__version__} has no torch.compile"}
        model = torch.compile(net)
    opt = torch.optim.Adadelta(net.parameters(), lr=1.0, rho=0.9, eps=1e-6)
    n = x_host.shape[0]
    b = args.batch_size
    gen = torch.Generator().manual_seed(args.seed)
    if path == "device":
        x_src, y_src = x_host.to(dev), y_host.to(dev)
    else:
        x_src, y_src = x_host, y_host
    order = torch.randperm(n, generator=gen)
    if path == "device":
        order = order.to(dev)
    pos = [0]

    def batch():
        if pos[0] + b > n:
            pos[0] = 0
        idx = order[pos[0]:pos[0] + b]
        pos[0] += b
        xb, yb = x_src.index_select(0, idx), y_src.index_select(0, idx)
        if path == "host":
            xb, yb = xb.to(dev), yb.to(dev)
        return xb, yb

    def step():
        xb, yb = batch()
        opt.zero_grad(set_to_none=True)
        loss = F.nll_loss(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    t_compile = time.perf_counter()
    try:
        for _ in range(args.warmup):
            loss = step()
            if path == "host":
                loss.item()
    except Exception as e:  # torch.compile without Triton, an unsupported GPU for inductor, ...
        if mode == "compile":
            return {"status": "unavailable", "why": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        raise
    sync(dev)
    warmup_s = time.perf_counter() - t_compile
    t0 = time.perf_counter()
    last = None
    for _ in range(args.steps):
        loss = step()
        if path == "host":
            last = loss.item()
    sync(dev)
    seconds = time.perf_counter() - t0
    if last is None:
        last = loss.item()
    return {"status": "ok", "samples_per_s": args.steps * b / seconds, "step_ms": 1000 * seconds / args.steps,
            "seconds": seconds, "warmup_seconds": warmup_s, "last_loss": last}


def main():
    args = parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": f"torch {torch.__version__}: torch.cuda.is_available() is False"}))
        return 3
    n = max(args.batch_size * (args.steps + args.warmup), 12800)
    x, y = make_data(args, min(n, 60000))
    out = {
        "what": "PyTorch training step of the MNIST convnet (bench/pytorch_mnist.py Net), Adadelta lr 1.0",
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if dev.type == "cuda" else None,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (a test of this script)",
        "capability": list(torch.cuda.get_device_capability(dev)) if dev.type == "cuda" else None,
        "settings": {"batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup,
                     "data": "synthetic" if args.synthetic else args.data_dir,
                     "cudnn.benchmark": torch.backends.cudnn.benchmark,
                     "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
                     "matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32},
        "results": {},
    }
    for mode in [m for m in args.modes.split(",") if m]:
        for path in [p for p in args.paths.split(",") if p]:
            r = measure(args, mode, path, x, y, dev)
            out["results"][f"{mode}_{path}"] = r
            print(f"# {mode:7s} {path:6s} " + (f"{r['samples_per_s']:10.0f} samples/s  {r['step_ms']:.3f} ms/step"
                                               if r["status"] == "ok" else f"unavailable: {r['why']}"),
                  file=sys.stderr, flush=True)
            write(args, out)  # after every measurement: a run cut short by a timeout keeps what it measured
    print(json.dumps(out, indent=1))
    return 0


def write(args, out):
    if args.json_out:
        with open(args.json_out + ".tmp", "w") as f:
            f.write(json.dumps(out, indent=1) + "\n")
        os.replace(args.json_out + ".tmp", args.json_out)


if __name__ == "__main__":
    sys.exit(main())
