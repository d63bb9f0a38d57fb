#!/usr/bin/python3
"""PyTorch reference trainer for Tandem's MNIST convnet (the recipe tandem-mnist runs).

Owns: the reference definition of the network (Net, whose state_dict names Tandem must match),
the Fashion-MNIST/MNIST IDX reader and normalisation, a dependency-free safetensors reader/writer,
and a trainer that writes the same metrics JSON lines as apps/tandem-mnist:
  {"type":"train","epoch":E,"iter":I,"loss":..,"lr":..,"time":..,"data_time":..}  (I from 1)
  {"type":"epoch","epoch":E,"samples":N,"seconds":S,"samples_per_s":N/S}
  {"type":"eval","epoch":E,"test_loss":..,"test_accuracy":..}
Assumes: Debian's /usr/bin/python3 with PyTorch 1.13 (CPU); no pip packages.
Guarantees: "epoch" timing covers the training loop only (batch gathering, forward, backward,
optimizer step, metrics line); dataset decoding and evaluation are outside it. With --no-shuffle
and --init-weights the losses are a pure function of the data, the weights and the recipe (and of
the thread count only through float32 summation order).
Data parallel: with --launcher pytorch (started by tandem-run or a torchrun-like launcher: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT) it trains DistributedDataParallel over gloo,
--batch-size per rank, with DistributedSampler (seed --seed, set_epoch each epoch; --no-shuffle: rank
r visits r, r+W, ...), as tandem-mnist --launcher pytorch does. Rank 0 alone writes metrics (its own
loss; "epoch" samples = all ranks' samples, timed on rank 0), evaluates (the whole test set, with its
own module) and saves weights (names without "module."). --nproc-per-node N starts N such workers
itself on 127.0.0.1 and a free port (Debian's torch 1.13 `torch.distributed.run` fails under its
Python 3.11 in the elastic agent, so this script does not rely on it).
tests/fixtures/make_fixtures.py imports Net, load_dataset, read/write_safetensors from here, so the
fixtures and the benchmark use one definition of the network and the data.
"""
import argparse
import gzip
import json
import os
import socket
import struct
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN = 0.1307
STD = 0.3081


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.n1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.n2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(1600, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.n1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.n2(self.conv2(x))), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


# ---------------------------------------------------------------- data

def _open(path):
    if os.path.exists(path):
        return open(path, "rb")
    if os.path.exists(path + ".gz"):
        return gzip.open(path + ".gz", "rb")
    raise FileNotFoundError(f"{path}[.gz] not found (run scripts/setup.sh to install the data)")


def read_idx(path, limit=None):
    """Reads an IDX file (raw or .gz, name given without .gz). Returns a uint8 tensor."""
    with _open(path) as f:
        magic = struct.unpack(">I", f.read(4))[0]
        if magic not in (2049, 2051):
            raise ValueError(f"{path}: bad IDX magic {magic:#x}, expected 0x801 or 0x803")
        ndim = magic & 0xFF
        dims = list(struct.unpack(">" + "I" * ndim, f.read(4 * ndim)))
        if limit is not None:
            dims[0] = min(dims[0], limit)
        count = 1
        for d in dims:
            count *= d
        data = f.read(count)
        if len(data) != count:
            raise ValueError(f"{path}: truncated, {len(data)} of {count} bytes")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).reshape(dims)


def load_dataset(data_dir, train, limit=None):
    """(images float32 [N,1,28,28] normalised as torchvision does: x/255, -mean, /std), labels i64."""
    prefix = "train" if train else "t10k"
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte"), limit)
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte"), limit)
    x = images.to(torch.float32).div(255.0).sub(MEAN).div(STD).unsqueeze(1).contiguous()
    return x, labels.to(torch.int64)


# ---------------------------------------------------------------- safetensors

_ST_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16",
              torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8"}
_ST_FROM = {v: k for k, v in _ST_DTYPES.items()}


def write_safetensors(path, tensors, metadata=None):
    """8-byte LE header length, JSON header (dtype, shape, data_offsets) padded with spaces to a
    multiple of 8, then the raw little-endian data. Tensors are laid out by decreasing element
    size, then by name (as the safetensors library does), so every tensor is naturally aligned."""
    names = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header, blobs, offset = {}, [], 0
    for name in names:
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in _ST_DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} not supported")
        blob = t.numpy().tobytes() if t.dtype != torch.bfloat16 else \
            t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dtype = _ST_FROM[info["dtype"]]
        buf = bytearray(raw[base + b:base + e])
        if dtype == torch.bfloat16:
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()
    return out


# ---------------------------------------------------------------- training

def make_optimizer(name, params, lr, momentum=0.0, weight_decay=0.0):
    if name == "adadelta":
        return torch.optim.Adadelta(params, lr=lr, rho=0.9, eps=1e-6, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}, expected adadelta, sgd or adam")


def evaluate(model, x, y, batch_size=1000):
    model.eval()
    total, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch_size):
            out = model(x[i:i + batch_size])
            total += F.nll_loss(out, y[i:i + batch_size], reduction="sum").item()
            correct += (out.argmax(dim=1) == y[i:i + batch_size]).sum().item()
    n = x.shape[0]
    return total / n, correct / n


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_workers(nproc, argv, timeout=None):
    """Runs this script nproc times with torchrun's variables and --launcher pytorch; when one worker
    fails, ends the others. Returns the first non-zero exit status (0 if all succeeded)."""
    port = str(free_port())
    procs = []
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv +
                                      ["--launcher", "pytorch"], env=env))
    rc = 0
    start = time.monotonic()
    while any(p.poll() is None for p in procs):
        failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
        if failed or (timeout and time.monotonic() - start > timeout):
            rc = failed[0] if failed else 124
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                p.wait()
            break
        time.sleep(0.05)
    return rc or next((p.returncode for p in procs if p.returncode != 0), 0)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--test-batch-size", type=int, default=1000)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--gamma", type=float, default=0.7, help="StepLR factor applied per epoch")
    p.add_argument("--optimizer", default="adadelta", choices=["adadelta", "sgd", "adam"])
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--limit", type=int, default=None, help="use the first N training samples")
    p.add_argument("--test-limit", type=int, default=None, help="use the first N test samples")
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu", choices=["cpu"], help="accepted for flag parity")
    p.add_argument("--amp", default="off", choices=["off", "bf16"],
                   help="bf16: forward and loss under torch.autocast('cpu', dtype=torch.bfloat16)")
    p.add_argument("--init-weights", default=None, help="safetensors state_dict to start from")
    p.add_argument("--save-weights", default=None)
    p.add_argument("--metrics-out", default=None, help="JSON lines file (default: stdout only)")
    p.add_argument("--quiet", action="store_true", help="print only epoch and eval lines")
    p.add_argument("--launcher", default="none", choices=["none", "pytorch"],
                   help="pytorch: DDP over gloo from torchrun's environment variables")
    p.add_argument("--dist-timeout", type=float, default=300, help="seconds for any collective")
    p.add_argument("--nproc-per-node", type=int, default=1,
                   help="start this many DDP workers on this machine (implies --launcher pytorch)")
    args = p.parse_args(argv)
    if args.nproc_per_node > 1 and "RANK" not in os.environ:
        return spawn_workers(args.nproc_per_node, argv)

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    x_train, y_train = load_dataset(args.data_dir, True, args.limit)
    x_test, y_test = load_dataset(args.data_dir, False, args.test_limit)

    rank, world = 0, 1
    if args.launcher == "pytorch":
        import datetime
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DistributedSampler
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=args.dist_timeout))

    net = Net()
    if args.init_weights:
        state = read_safetensors(args.init_weights)
        net.load_state_dict(state, strict=True)
    model = DistributedDataParallel(net) if args.launcher == "pytorch" else net
    opt = make_optimizer(args.optimizer, model.parameters(), args.lr, args.momentum,
                         args.weight_decay)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=args.gamma)
    gen = torch.Generator().manual_seed(args.seed)

    out = open(args.metrics_out, "w") if args.metrics_out and rank == 0 else None

    def emit(rec, always=False):
        if rank != 0:
            return
        line = json.dumps(rec)
        if out:
            out.write(line + "\n")
        if always or not args.quiet:
            print(line, flush=True)

    n = x_train.shape[0]
    sampler = None
    if args.launcher == "pytorch":
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank,
                                     shuffle=not args.no_shuffle, seed=args.seed)
    for epoch in range(1, args.epochs + 1):
        model.train()
        if sampler is not None:
            sampler.set_epoch(epoch - 1)
            order = torch.tensor(list(sampler), dtype=torch.int64)
        else:
            order = torch.arange(n) if args.no_shuffle else torch.randperm(n, generator=gen)
        samples = 0
        t_epoch = time.perf_counter()
        t_prev = t_epoch
        for it, start in enumerate(range(0, order.numel(), args.batch_size), 1):
            idx = order[start:start + args.batch_size]
            xb = x_train.index_select(0, idx)
            yb = y_train.index_select(0, idx)
            t_data = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
                loss = F.nll_loss(model(xb), yb)
            loss.backward()
            opt.step()
            loss_v = loss.item()
            t_now = time.perf_counter()
            samples += idx.numel()
            emit({"type": "train", "epoch": epoch, "iter": it, "loss": loss_v,
                  "lr": opt.param_groups[0]["lr"], "time": t_now - t_prev,
                  "data_time": t_data - t_prev})
            t_prev = time.perf_counter()
        seconds = time.perf_counter() - t_epoch
        samples *= world  # every rank ran the same number of batches of this size
        emit({"type": "epoch", "epoch": epoch, "samples": samples, "seconds": seconds,
              "samples_per_s": samples / seconds}, always=True)
        if rank == 0:
            test_loss, acc = evaluate(net, x_test, y_test, args.test_batch_size)
            emit({"type": "eval", "epoch": epoch, "test_loss": test_loss, "test_accuracy": acc},
                 always=True)
        sched.step()

    if out:
        out.close()
    if args.save_weights and rank == 0:
        write_safetensors(args.save_weights, net.state_dict(), {"format": "pt"})
    if args.launcher == "pytorch":
        dist.barrier()  # the other ranks wait for rank 0's eval and save
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
