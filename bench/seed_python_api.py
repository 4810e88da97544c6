#!/usr/bin/env python3
"""The seed user's workload through ckpt's Python API, for `ckpt-bench seed`.

Their own LeNet5 nn.Module and Fashion-MNIST as NumPy arrays (read from the
IDX files, ckpt's splits: train = the first 50,000 train images, val = the
last 10,000, test = t10k) go through ckpt_client.Experiment(...).run(): the
module is converted to a layer list by torch.fx (the fused path), or with
--torchscript saved with torch.jit.script and given as a TorchScript file
(what the API falls back to for a module it cannot convert), or with
--builtin replaced by the built-in name "lenet5" (the same network as ckpt's
own layer list: the A/B of the conversion against the built-in, everything
else equal). The experiment
is ckpt-bench seed's own (bench/seed_bench.cc ExperimentToml): the same
search space, PBT step, devices and seed. Prints one JSON line last:
{"best_val_acc", "test_acc", "model": "layers" | "torchscript" | "builtin"}.
"""
import argparse
import gzip
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import ckpt_client as ckpt


class LeNet5(nn.Module):
    """The seed user's model, as they wrote it for PyTorch."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc3(F.relu(self.fc2(x)))


def idx(folder, name, header):
    with gzip.open(os.path.join(folder, f"{name}-ubyte.gz")) as f:
        return np.frombuffer(f.read(), np.uint8, offset=header)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--population", type=int, default=30)
    p.add_argument("--intervals", type=int, default=4)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--eval-size", type=int, default=2000)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--fusion", default="plain")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--final-eval-top", type=int, default=5)
    p.add_argument("--dataset", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--store", required=True)
    p.add_argument("--name", default="seed")
    p.add_argument("--torchscript", action="store_true",
                   help="give the module as a TorchScript file instead of converting it")
    p.add_argument("--builtin", action="store_true",
                   help='give the built-in "lenet5" instead of the module')
    a = p.parse_args()

    x = idx(a.dataset, "train-images-idx3", 16).reshape(-1, 1, 28, 28)
    y = idx(a.dataset, "train-labels-idx1", 8)
    xt = idx(a.dataset, "t10k-images-idx3", 16).reshape(-1, 1, 28, 28)
    yt = idx(a.dataset, "t10k-labels-idx1", 8)
    data = {"train": (x[:50000], y[:50000]), "val": (x[50000:], y[50000:]), "test": (xt, yt)}

    torch.manual_seed(a.seed)
    model = LeNet5()
    if a.builtin:
        model = "lenet5"
    elif a.torchscript:
        os.makedirs(a.store, exist_ok=True)
        model_path = os.path.join(a.store, "lenet5-scripted.pt")
        torch.jit.script(model).save(model_path)
        model = model_path
    exp = ckpt.Experiment(
        model, data,
        {"lr": ckpt.loguniform(0.001, 0.2), "momentum": ckpt.uniform(0.5, 0.99),
         "weight_decay": ckpt.loguniform(0.000001, 0.01)},
        name=a.name, seed=a.seed, optimizer="sgd",
        population=a.population, intervals=a.intervals, steps_per_interval=a.steps,
        batch_size=a.batch, eval_size=a.eval_size,
        # The user's PBT: bottom 20% copy a top-20% member, then each
        # hyperparameter times 0.8 or 1.2 (never resampled).
        policy=ckpt.pbt(quantile=0.2, perturb=[0.8, 1.2], resample_probability=0.0,
                        ready_intervals=1),
        devices={"device": "cpu", "slots": a.slots, "fusion": a.fusion, "fusion_width": 8,
                 "intra_op_threads": 1})
    result = exp.run(store=a.store, progress=False)
    best = result.members.iloc[0]
    metric = result.metric if hasattr(result, "metric") else "accuracy"
    converted = exp.converted
    print(json.dumps({
        "best_val_acc": float(best[f"val_{metric}"]),
        "test_acc": float(best[f"test_{metric}"]),
        "model": "builtin" if a.builtin
                 else "torchscript" if a.torchscript or (converted and not converted.fused)
                 else "layers"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
