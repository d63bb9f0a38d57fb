#!/usr/bin/python3
"""PyTorch 1.13 reference of bench/model_steps.cpp: the training step of the two example models.

Owns: the PyTorch definitions of train/models/resnet.h (ResNet: the CIFAR ResNet of He et al.
for 1x28x28 images, torchvision's names) and train/models/gpt.h (GPT: token and position
embeddings, pre-norm blocks with causal nn.MultiheadAttention and a GELU MLP, a final LayerNorm,
the output layer tied to the token embedding), and their recipes:
  resnet: images N(0, 1) [batch, 1, 28, 28], labels uniform in [0, 10), log_softmax + nll_loss,
          SGD lr 0.1, momentum 0.9, Nesterov, weight decay 5e-4;
  gpt:    token windows uniform in [0, vocab), cross-entropy on the next token, AdamW lr 3e-3,
          betas 0.9/0.99, weight decay 0.1 on matrices only, clip_grad_norm_ 1.0.
--amp bf16|fp16 runs the forward under torch.autocast (fp16 with a GradScaler, on CUDA only), as
model_steps --amp does under Tandem's autocast.
Same flags and the same JSON line as model_steps (bench/compare_models.py runs both); the
initialisation is PyTorch's own (it does not change the work of a step).
Guarantees: 8 batches are made before the clock starts and cycled; --warmup steps are untimed,
then --iters steps are timed as one interval; one line
  {"type":"bench","model":..,"threads":..,"batch_size":..,"iters":..,"seconds":..,
   "samples_per_s":..,"tokens_per_s":..(gpt),"first_loss":..,"last_loss":..,"params":..}
is appended to --metrics-out (or printed). --profile prints torch.autograd.profiler's table of
the timed steps, sorted by self CPU time.
Assumes: Debian's /usr/bin/python3 with PyTorch 1.13 (CPU); with --device cuda, a python whose torch has CUDA
(the GPU check passes the GPU machine's own).
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv3x3(cin, cout, stride):
    return nn.Conv2d(cin, cout, 3, stride, 1, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = conv3x3(cin, cout, stride)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = conv3x3(cout, cout, 1)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    def __init__(self, width, blocks_per_stage, num_classes=10):
        super().__init__()
        self.conv1 = conv3x3(1, width, 1)
        self.bn1 = nn.BatchNorm2d(width)
        cin = width
        for stage in range(3):
            cout = width << stage
            layer = []
            for b in range(blocks_per_stage):
                layer.append(BasicBlock(cin, cout, 2 if stage > 0 and b == 0 else 1))
                cin = cout
            setattr(self, f"layer{stage + 1}", nn.Sequential(*layer))
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.layer3(self.layer2(self.layer1(h)))
        h = torch.flatten(F.adaptive_avg_pool2d(h, (1, 1)), 1)
        return F.log_softmax(self.fc(h), dim=1)


class Block(nn.Module):
    def __init__(self, dim, heads, block):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=0.0, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
                                 nn.Dropout(0.0))
        # True marks positions that may not be attended: j > i.
        self.register_buffer("causal", torch.triu(torch.ones(block, block, dtype=torch.bool), 1))

    def forward(self, x):
        T = x.size(1)
        h = self.ln_1(x)
        a = self.attn(h, h, h, need_weights=False, attn_mask=self.causal[:T, :T])[0]
        y = x + a
        return y + self.mlp(self.ln_2(y))


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, dim):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(block, dim)
        self.h = nn.ModuleList([Block(dim, heads, block) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        nn.init.normal_(self.wte.weight, 0.0, 0.02)
        nn.init.normal_(self.wpe.weight, 0.0, 0.02)
        self.register_buffer("positions", torch.arange(block))

    def forward(self, idx):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(self.positions[:T])
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Times the training step of the example ResNet or GPT "
                                            "in PyTorch on synthetic data")
    p.add_argument("--model", required=True, choices=["resnet", "gpt"])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=0, help="default: resnet 64, gpt 16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--vocab", type=int, default=99)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--metrics-out", default=None)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: model and batches live there")
    p.add_argument("--amp", default="off", choices=["off", "bf16", "fp16"],
                   help="the forward under torch.autocast in that dtype (fp16: with a GradScaler, CUDA only)")
    args = p.parse_args(argv)
    if args.amp == "fp16" and not args.device.startswith("cuda"):
        p.error("--amp fp16 needs --device cuda: PyTorch's CPU autocast runs bfloat16 only (it would "
                "silently run float32)")
    if args.iters < 1 or args.warmup < 0 or args.batch_size < 0 or args.threads < 1:
        p.error("--iters and --threads must be >= 1, --warmup and --batch-size >= 0")
    if args.batch_size == 0:
        args.batch_size = 64 if args.model == "resnet" else 16
    return args


def autocast(a):
    """torch.autocast in --amp's dtype, or a disabled one for --amp off."""
    dtype = torch.float16 if a.amp == "fp16" else torch.bfloat16
    return torch.autocast(device_type=torch.device(a.device).type, dtype=dtype, enabled=a.amp != "off")


def make_scaler(a):
    """A GradScaler for --amp fp16; for off and bf16 a disabled one (plain backward and step)."""
    return torch.cuda.amp.GradScaler(enabled=a.amp == "fp16")


def resnet_recipe(a, gen):
    net = ResNet(a.width, a.blocks).to(a.device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    batches = [(torch.randn(a.batch_size, 1, 28, 28, generator=gen),
                torch.randint(0, 10, (a.batch_size,), generator=gen)) for _ in range(8)]
    batches = [(x.to(a.device), y.to(a.device)) for x, y in batches]

    scaler = make_scaler(a)

    def step(b):
        opt.zero_grad()
        with autocast(a):
            loss = F.nll_loss(net(b[0]), b[1])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.item()
    return net, batches, step


def gpt_recipe(a, gen):
    net = GPT(a.vocab, a.block_size, a.layers, a.heads, a.dim).to(a.device)
    decay = [p for p in net.parameters() if p.dim() >= 2]
    no_decay = [p for p in net.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=3e-3, betas=(0.9, 0.99))
    batches = []
    for _ in range(8):
        seq = torch.randint(0, a.vocab, (a.batch_size, a.block_size + 1), generator=gen)
        batches.append((seq[:, :-1].contiguous().to(a.device), seq[:, 1:].contiguous().to(a.device)))

    scaler = make_scaler(a)

    def step(b):
        with autocast(a):
            logits = net(b[0])
            loss = F.cross_entropy(logits.reshape(-1, a.vocab), b[1].reshape(-1))
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        return loss.item()
    return net, batches, step


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    net, batches, step = (resnet_recipe if a.model == "resnet" else gpt_recipe)(a, gen)
    net.train()
    first = last = 0.0
    for i in range(a.warmup):
        first = step(batches[i % len(batches)])
    prof = torch.autograd.profiler.profile() if a.profile else None
    if prof:
        prof.__enter__()
    if torch.device(a.device).type == "cuda":
        torch.cuda.synchronize(a.device)
    start = time.perf_counter()
    for i in range(a.iters):
        last = step(batches[(a.warmup + i) % len(batches)])
        if i == 0 and a.warmup == 0:
            first = last
    seconds = time.perf_counter() - start
    if prof:
        prof.__exit__(None, None, None)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    samples = a.batch_size * a.iters
    rec = {"type": "bench", "model": a.model, "threads": a.threads, "batch_size": a.batch_size,
           "iters": a.iters, "warmup": a.warmup, "seconds": seconds,
           "samples_per_s": samples / seconds, "first_loss": first, "last_loss": last,
           "params": sum(p.numel() for p in net.parameters()), "device": a.device,
           "amp": a.amp,
           "torch": torch.__version__}
    if a.model == "gpt":
        rec["tokens_per_s"] = samples * a.block_size / seconds
    line = json.dumps(rec)
    if a.metrics_out:
        with open(a.metrics_out, "a") as f:
            f.write(line + "\n")
    else:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
