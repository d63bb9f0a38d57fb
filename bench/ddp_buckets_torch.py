#!/usr/bin/python3
"""PyTorch side of bench/ddp_buckets.py: the same step timing as bench/ddp_buckets.cpp, with torch 1.13.

Owns: one process of the sweep. Prints one JSON object (the last line of rank 0's stdout) with the same
keys as the C++ program: step_ms (median), forward_ms, backward_ms, optimizer_ms, and in ddp mode
exposed_comm_ms, buckets, bucket_sizes, allreduce_all_ms, bucket_comm_ms, hidden_share.
Modes:
  compute  one process, no DDP: zero_grad + forward + loss + backward + SGD step.
  ddp      one rank of DistributedDataParallel over gloo (torchrun's variables RANK, WORLD_SIZE,
           MASTER_ADDR, MASTER_PORT; bench/ddp_buckets.py sets them). --bucket-cap-mb none = one bucket
           reduced after backward: bucket_cap_mb and dist._DEFAULT_FIRST_BUCKET_BYTES both huge.
Exposed communication: PyTorch does not report the reducer's wait, so it is estimated the same way the
engine measures it: from the last parameter gradient computed (a tensor hook on every parameter, which
fires just before DDP's own autograd hook for it) to backward() returning (DDP's finalize waited for
every bucket and copied the results).
Models: mnist (bench/pytorch_mnist.py's Net) and mlp (nn.Sequential of Linear/ReLU, 1024 -> 2048 x6 ->
10 by default), inputs and labels random but fixed (seed 1); loss nll_loss(log_softmax(out)); SGD lr 1e-4.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def make_model(args):
    if args.model == "mnist":
        from pytorch_mnist import Net
        return Net(), torch.rand(args.batch, 1, 28, 28) * 2 - 1
    layers, width = [], args.mlp_in
    for _ in range(args.mlp_layers):
        layers += [nn.Linear(width, args.mlp_hidden), nn.ReLU()]
        width = args.mlp_hidden
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers), torch.rand(args.batch, args.mlp_in) * 2 - 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["compute", "ddp"], default="ddp")
    p.add_argument("--model", choices=["mlp", "mnist"], default="mlp")
    p.add_argument("--bucket-cap-mb", default="25")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--mlp-in", type=int, default=1024)
    p.add_argument("--mlp-hidden", type=int, default=2048)
    p.add_argument("--mlp-layers", type=int, default=6)
    p.add_argument("--gradient-as-bucket-view", action="store_true")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    net, x = make_model(args)
    y = torch.randint(0, 10, (args.batch,))
    net.train()
    n_params = sum(p.numel() for p in net.parameters())
    out = {"framework": "pytorch", "torch": torch.__version__, "mode": args.mode, "model": args.model,
           "params": n_params, "grad_bytes": n_params * 4, "batch": args.batch, "threads": args.threads,
           "steps": args.steps, "warmup": args.warmup, "world": 1}

    rank, model = 0, net
    if args.mode == "ddp":
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        if args.bucket_cap_mb == "none":
            dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 62
            cap = 1e9
        else:
            cap = float(args.bucket_cap_mb)
        model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=cap,
                                                    gradient_as_bucket_view=args.gradient_as_bucket_view)
        out.update(world=dist.get_world_size(), bucket_cap_mb=args.bucket_cap_mb,
                   first_bucket_cap_mb="none" if args.bucket_cap_mb == "none" else "1.000000")
        args.warmup = max(args.warmup, 2)  # buckets are rebuilt at the second iteration's forward

    last_grad = [0.0]

    def on_grad(_):
        last_grad[0] = time.perf_counter()

    for prm in net.parameters():
        prm.register_hook(on_grad)

    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    step, fwd, bwd, optm, exposed = [], [], [], [], []
    for it in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.nll_loss(F.log_softmax(model(x), dim=-1), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if it < args.warmup:
            continue
        step.append((t3 - t0) * 1e3)
        fwd.append((t1 - t0) * 1e3)
        bwd.append((t2 - t1) * 1e3)
        optm.append((t3 - t2) * 1e3)
        exposed.append(max(0.0, t2 - last_grad[0]) * 1e3)

    out.update(step_ms=statistics.median(step), step_ms_mean=statistics.mean(step), step_ms_all=step,
               forward_ms=statistics.median(fwd), backward_ms=statistics.median(bwd),
               optimizer_ms=statistics.median(optm))
    if args.mode == "ddp":
        ld = model._get_ddp_logging_data()
        # After the rebuild (iteration 2) the logger holds the rebuilt layout; bucket_sizes is the initial one.
        text = ld.get("rebuilt_bucket_sizes") or ld.get("bucket_sizes", "")
        sizes = [int(s) // 4 for s in str(text).replace(" ", "").split(",") if s]
        flat = torch.ones(n_params)
        bufs = [torch.ones(n) for n in sizes]
        all_ms, layout_ms = [], []
        dist.barrier()
        for it in range(1 + args.steps):
            t0 = time.perf_counter()
            dist.all_reduce(flat)
            t1 = time.perf_counter()
            works = [dist.all_reduce(b, async_op=True) for b in bufs]
            for w in works:
                w.wait()
            t2 = time.perf_counter()
            if it > 0:
                all_ms.append((t1 - t0) * 1e3)
                layout_ms.append((t2 - t1) * 1e3)
        ar = statistics.median(all_ms)
        layout = statistics.median(layout_ms) if bufs else 0.0
        ex = statistics.median(exposed)
        out.update(exposed_comm_ms=ex, exposed_comm_ms_mean=statistics.mean(exposed), buckets=len(sizes),
                   bucket_sizes=sizes, bucket_bytes=4 * sum(sizes), allreduce_all_ms=ar, bucket_comm_ms=layout,
                   hidden_share=1.0 - ex / ar if ar > 0 else 0.0,
                   hidden_share_layout=1.0 - ex / layout if layout > 0 else 0.0)
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
