#!/usr/bin/python3
"""PyTorch side of tests/e2e/interop_test.cpp: weights move between Tandem and PyTorch as safetensors.

Owns two commands, both on the MNIST IDX files in --data-dir, normalised as torchvision does:
  eval  --weights W: loads W (Tandem's state_dict names) strictly into bench/pytorch_mnist.py's Net,
        evaluates the first --test-limit test images (eval mode, batches of 1000);
  train --out W: seeds torch, builds Net, trains one unshuffled epoch of Adadelta (lr 1.0, batch 64)
        on the first --limit training images (so BatchNorm's running stats are no longer their
        initial values), saves the state_dict to W, then evaluates as `eval` does.
Both write --json-out {"test_loss", "test_accuracy", "correct", "total"} and, with
--predictions-out, one predicted class per line (test image order).
Assumes: Debian's /usr/bin/python3 with PyTorch 1.13; no pip packages (safetensors is read and
written by bench/pytorch_mnist.py's own reader/writer). One thread, for reproducible sums.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
from pytorch_mnist import Net, load_dataset, read_safetensors, write_safetensors  # noqa: E402


def evaluate(model, x, y, batch_size=1000):
    model.eval()
    loss, preds = 0.0, []
    with torch.no_grad():
        for i in range(0, x.shape[0], batch_size):
            out = model(x[i:i + batch_size])
            loss += F.nll_loss(out, y[i:i + batch_size], reduction="sum").item()
            preds.append(out.argmax(dim=1))
    pred = torch.cat(preds)
    correct = int((pred == y).sum().item())
    n = int(x.shape[0])
    return {"test_loss": loss / n, "test_accuracy": correct / n, "correct": correct, "total": n}, pred


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["eval", "train"])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--weights", help="eval: safetensors to load")
    p.add_argument("--out", help="train: where to save the trained weights")
    p.add_argument("--limit", type=int, default=1280, help="train: first N training images")
    p.add_argument("--test-limit", type=int, default=0, help="first N test images (0: all)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json-out", required=True)
    p.add_argument("--predictions-out")
    a = p.parse_args()
    torch.set_num_threads(1)

    model = Net()
    if a.command == "eval":
        if not a.weights:
            p.error("eval needs --weights")
        state = read_safetensors(a.weights)
        model.load_state_dict(state, strict=True)
    else:
        if not a.out:
            p.error("train needs --out")
        torch.manual_seed(a.seed)
        model = Net()
        x, y = load_dataset(a.data_dir, train=True, limit=a.limit)
        opt = torch.optim.Adadelta(model.parameters(), lr=1.0, rho=0.9, eps=1e-6)
        model.train()
        for i in range(0, x.shape[0], 64):
            opt.zero_grad()
            F.nll_loss(model(x[i:i + 64]), y[i:i + 64]).backward()
            opt.step()
        write_safetensors(a.out, model.state_dict())

    xt, yt = load_dataset(a.data_dir, train=False, limit=a.test_limit or None)
    result, pred = evaluate(model, xt, yt)
    with open(a.json_out, "w") as f:
        json.dump(result, f)
    if a.predictions_out:
        with open(a.predictions_out, "w") as f:
            f.write("\n".join(str(int(v)) for v in pred.tolist()) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
