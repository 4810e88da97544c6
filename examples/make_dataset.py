#!/usr/bin/env python3
"""Writes a ckpt tensor dataset (safetensors or .npz) from data on this machine.

The layout ckpt reads ([data] format = "safetensors" | "npz", see README "Your own data"):
  train.x  uint8 / float16 / float32, [N, C, H, W] or [N, F]
  train.y  int64 class labels [N], or float32 targets [N] / [N, T]
  val.x, val.y, test.x, test.y  optional (without val, set [data] val_size)

Sources (nothing is downloaded):
  fashion-mnist DIR   the IDX files of DIR (Debian's dataset-fashion-mnist:
                      /usr/share/datasets/fashion-mnist): train = the first 50,000
                      train images, val = the last 10,000, test = t10k, exactly
                      the splits ckpt makes of the IDX files
  digits              scikit-learn's bundled 8x8 digits (1,797 images, 10
                      classes), float32 [N, 1, 8, 8]; a seeded shuffle split
                      into train / val / test (1,297 / 250 / 250)
  diabetes            scikit-learn's bundled diabetes regression (442 rows, 10
                      features), float32 x [N, 10], y [N] standardized with the
                      train split's mean and std (so predicting the mean scores
                      neg_mse of about -1); split 342 / 50 / 50
  cifar-synthetic     CIFAR-shaped uint8 [N, 3, 32, 32], 10 classes: each class
                      a seeded colour cast and smooth colour pattern, each image
                      its class's at a random shift plus noise (--n rows, --seed)

The output's extension picks the format: .safetensors or .npz.

  examples/make_dataset.py fashion-mnist /usr/share/datasets/fashion-mnist fm.safetensors
  examples/make_dataset.py digits digits.npz
"""
import argparse
import gzip
import json
import os
import sys

import numpy as np


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise SystemExit(f"{path}: not a u8 IDX file")
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def find_idx(directory, base):
    for name in (base, base + ".gz"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return read_idx(path)
    raise SystemExit(f"{directory}: no {base}[.gz]")


def fashion_mnist(directory):
    x = find_idx(directory, "train-images-idx3-ubyte")
    y = find_idx(directory, "train-labels-idx1-ubyte").astype(np.int64)
    tx = find_idx(directory, "t10k-images-idx3-ubyte")
    ty = find_idx(directory, "t10k-labels-idx1-ubyte").astype(np.int64)
    x = x.reshape(x.shape[0], 1, x.shape[1], x.shape[2])
    tx = tx.reshape(tx.shape[0], 1, tx.shape[1], tx.shape[2])
    keep = x.shape[0] - 10000
    return {"train.x": x[:keep], "train.y": y[:keep], "val.x": x[keep:], "val.y": y[keep:],
            "test.x": tx, "test.y": ty}


def split(x, y, val, test, seed):
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_train = len(x) - val - test
    return {"train.x": x[:n_train], "train.y": y[:n_train],
            "val.x": x[n_train:n_train + val], "val.y": y[n_train:n_train + val],
            "test.x": x[n_train + val:], "test.y": y[n_train + val:]}


def digits(seed):
    from sklearn.datasets import load_digits
    d = load_digits()
    x = d.data.astype(np.float32).reshape(-1, 1, 8, 8)
    return split(x, d.target.astype(np.int64), 250, 250, seed)


def diabetes(seed):
    from sklearn.datasets import load_diabetes
    d = load_diabetes()
    out = split(d.data.astype(np.float32), d.target.astype(np.float64), 50, 50, seed)
    mean, std = out["train.y"].mean(), out["train.y"].std()
    for k in ("train.y", "val.y", "test.y"):
        out[k] = ((out[k] - mean) / std).astype(np.float32)
    return out


def cifar_synthetic(n, seed):
    rng = np.random.default_rng(seed)
    classes = 10
    # Per class a colour cast and a smooth pattern (random 3x4x4 colours
    # upsampled to 40x40), seen at a random shift of up to 8 pixels.
    cast = rng.normal(0, 1, size=(classes, 3, 1, 1))
    coarse = rng.normal(0, 1, size=(classes, 3, 4, 4))
    patterns = np.kron(coarse, np.ones((1, 1, 10, 10)))
    y = rng.integers(0, classes, size=n)
    dy = rng.integers(0, 9, size=n)
    dx = rng.integers(0, 9, size=n)
    x = np.empty((n, 3, 32, 32), dtype=np.float64)
    for i in range(n):
        x[i] = 30 * cast[y[i]] + 30 * patterns[y[i], :, dy[i]:dy[i] + 32, dx[i]:dx[i] + 32]
    x = 128 + x + rng.normal(0, 40, size=x.shape)
    x = np.clip(np.rint(x), 0, 255).astype(np.uint8)
    val = max(1, n // 10)
    return split(x, y.astype(np.int64), val, val, seed + 1)


SAFETENSORS_DTYPES = {"uint8": "U8", "int64": "I64", "float16": "F16", "float32": "F32"}


def save_safetensors(arrays, out):
    """The safetensors layout without the safetensors package (Debian's
    python3 lacks it): an 8-byte little-endian header length, the JSON header
    (dtype, shape, data_offsets per tensor, padded with spaces to 8 bytes), then
    the tensors' bytes back to back in the header's order."""
    header, at = {}, 0
    for name, a in arrays.items():
        header[name] = {"dtype": SAFETENSORS_DTYPES[a.dtype.name], "shape": list(a.shape),
                        "data_offsets": [at, at + a.nbytes]}
        at += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(out, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for a in arrays.values():
            f.write(a.tobytes())


def write(arrays, out):
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    if out.endswith(".safetensors"):
        try:
            from safetensors.numpy import save_file
        except ImportError:
            save_safetensors(arrays, out)
        else:
            save_file(arrays, out)
    elif out.endswith(".npz"):
        np.savez(out, **arrays)
    else:
        raise SystemExit(f"{out}: the name must end in .safetensors or .npz")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("source", choices=["fashion-mnist", "digits", "diabetes", "cifar-synthetic"])
    p.add_argument("args", nargs="+", help="[IDX_DIR] OUT (fashion-mnist takes the directory)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n", type=int, default=2000, help="cifar-synthetic rows")
    a = p.parse_args()
    if a.source == "fashion-mnist":
        if len(a.args) != 2:
            p.error("fashion-mnist takes IDX_DIR OUT")
        arrays, out = fashion_mnist(a.args[0]), a.args[1]
    else:
        if len(a.args) != 1:
            p.error(f"{a.source} takes OUT")
        out = a.args[0]
        arrays = {"digits": lambda: digits(a.seed), "diabetes": lambda: diabetes(a.seed),
                  "cifar-synthetic": lambda: cifar_synthetic(a.n, a.seed)}[a.source]()
    write(arrays, out)
    shapes = ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in arrays.items())
    print(f"{out}: {shapes}")


if __name__ == "__main__":
    sys.exit(main())
