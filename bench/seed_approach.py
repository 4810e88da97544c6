#!/usr/bin/python3
"""The seed user's own population-based training, written plainly in PyTorch.

This is the setup ckpt is measured against (issue 11), as the user runs it:
one torch.multiprocessing.Pool(7); one file per member holding its model and
optimizer state_dicts, torch.load-ed, trained, evaluated and torch.save-d back
by a pool worker every interval; torch.set_num_threads(1) in each worker; the
synchronous PBT step in the parent between intervals (the bottom 20% copy a
random top-20% member's file and hyperparameters, then multiply each
hyperparameter by 0.8 or 1.2); at the end the best member's test accuracy.

Workload (defaults): 30 LeNet-5 members, Fashion-MNIST, SGD with momentum and
weight decay, batch 64, 4 intervals x 100 steps, validation on 2,000 images
after each interval. The data split matches ckpt's: the last 10,000 training
images are the validation split (the first --eval-size of them are scored),
inputs are normalized with the training split's mean and standard deviation.

  /usr/bin/python3 bench/seed_approach.py [--population 30] [--intervals 4]
      [--steps 100] [--seed 2026] [--processes 7] [--eval-size 2000]
      [--dataset /usr/share/datasets/fashion-mnist] [--workdir DIR] [--no-pss]
      [--device cpu]

--device cuda (or cuda:N): the user's GPU setup. The parent never touches CUDA
(forking after CUDA starts is not allowed), so each pool worker creates its
own CUDA context, copies the dataset to the GPU once, trains there, and
torch.load/torch.save the member files with map_location on every interval.

The last line printed is one JSON object: samples_per_s (training samples over
the wall time from start to the final test accuracy), wall_s, pss_bytes (the
peak over the run of the summed PSS of this process and its descendants,
sampled from /proc/PID/smaps_rollup once a second; 0 with --no-pss, for a
caller that samples the tree from outside), best_val_acc, test_acc.
"""
import argparse
import gzip
import json
import math
import os
import random
import shutil
import tempfile
import threading
import time

import numpy as np
import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

VALIDATION_SIZE = 10000  # the tail of the training file held out, as ckpt does
BATCH = 64


class LeNet5(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(bytearray(data), dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load_dataset(directory):
    """Float tensors [N, 1, 28, 28], normalized, and int64 labels."""
    train_x = read_idx(os.path.join(directory, "train-images-idx3-ubyte.gz"))
    train_y = read_idx(os.path.join(directory, "train-labels-idx1-ubyte.gz"))
    test_x = read_idx(os.path.join(directory, "t10k-images-idx3-ubyte.gz"))
    test_y = read_idx(os.path.join(directory, "t10k-labels-idx1-ubyte.gz"))
    n_train = train_x.shape[0] - VALIDATION_SIZE
    # Mean and standard deviation of the training pixels from their histogram
    # (exact, and no float64 copy of the images).
    counts = np.bincount(train_x[:n_train].ravel(), minlength=256).astype(np.float64)
    values = np.arange(256, dtype=np.float64) / 255.0
    mean = float((counts * values).sum() / counts.sum())
    std = math.sqrt(float((counts * values * values).sum() / counts.sum()) - mean * mean)

    def images(x):
        return torch.from_numpy(x).float().div_(255.0).sub_(mean).div_(std).unsqueeze(1)

    def labels(y):
        return torch.from_numpy(y.astype(np.int64))

    return {
        "train": (images(train_x[:n_train]), labels(train_y[:n_train])),
        "val": (images(train_x[n_train:]), labels(train_y[n_train:])),
        "test": (images(test_x), labels(test_y)),
    }


# The dataset, loaded once in the parent before the pool forks, so the workers
# share its pages (the cheapest way a Python user gets it into every worker).
DATA = None


DEVICE = "cpu"


def init_worker(device="cpu"):
    global DATA, DEVICE
    torch.set_num_threads(1)
    DEVICE = device
    if device != "cpu":
        DATA = {k: (x.to(device), y.to(device)) for k, (x, y) in DATA.items()}


def accuracy(model, split, count):
    x, y = DATA[split]
    x, y = x[:count], y[:count]
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 1000):
            correct += (model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum().item()
    return correct / len(x)


def train_interval(job):
    """One member's interval in a pool worker: load its file, train, evaluate, save."""
    path, hp, steps, eval_size, data_seed = job
    model = LeNet5().to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=hp["lr"], momentum=hp["momentum"],
                                weight_decay=hp["weight_decay"])
    state = torch.load(path, map_location=DEVICE)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    # The hyperparameters are the parent's (PBT changes them between intervals).
    for group in optimizer.param_groups:
        group.update(hp)
    x, y = DATA["train"]
    generator = torch.Generator().manual_seed(data_seed)
    order = torch.randperm(len(x), generator=generator).to(DEVICE)
    model.train()
    for s in range(steps):
        idx = order[s * BATCH:(s + 1) * BATCH]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
    val_acc = accuracy(model, "val", eval_size)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    return val_acc


def test_accuracy(path):
    model = LeNet5().to(DEVICE)
    model.load_state_dict(torch.load(path, map_location=DEVICE)["model"])
    return accuracy(model, "test", len(DATA["test"][0]))


def children_of(pid):
    """The processes pid's threads forked (/proc/PID/task/*/children)."""
    out = []
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for task in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, task)) as f:
                out.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def tree_pss_bytes(root_pid):
    """Summed PSS of root_pid and its descendants (0 for a process that just ended)."""
    total, stack = 0, [root_pid]
    while stack:
        pid = stack.pop()
        stack.extend(children_of(pid))
        try:
            with open("/proc/%d/smaps_rollup" % pid) as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


class PssSampler(threading.Thread):
    """Samples the summed PSS of this process tree once a second; keeps the peak.

    Reading smaps_rollup walks a process's page tables under its mmap lock, so
    sampling more often slows down what it measures.
    """

    def __init__(self):
        super().__init__(daemon=True)
        self.peak = 0
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            self.peak = max(self.peak, tree_pss_bytes(os.getpid()))
            self.done.wait(1.0)

    def stop(self):
        self.done.set()
        self.join()
        return self.peak


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--population", type=int, default=30)
    parser.add_argument("--intervals", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--processes", type=int, default=7)
    parser.add_argument("--eval-size", type=int, default=2000)
    parser.add_argument("--dataset", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--workdir", default="", help="member files (default: a temp dir)")
    parser.add_argument("--no-pss", action="store_true",
                        help="no PSS sampling here (a caller samples this process tree itself)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (see above)")
    args = parser.parse_args()

    start = time.monotonic()
    sampler = PssSampler()
    if not args.no_pss:
        sampler.start()
    global DATA
    DATA = load_dataset(args.dataset)
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    workdir = args.workdir or tempfile.mkdtemp(prefix="seed-approach-")
    os.makedirs(workdir, exist_ok=True)

    # The same search space as examples/fashion-mnist-pbt.toml.
    members = []
    for i in range(args.population):
        hp = {"lr": math.exp(rng.uniform(math.log(1e-3), math.log(0.2))),
              "momentum": rng.uniform(0.5, 0.99),
              "weight_decay": math.exp(rng.uniform(math.log(1e-6), math.log(1e-2)))}
        path = os.path.join(workdir, "member%d.pt" % i)
        model = LeNet5()
        optimizer = torch.optim.SGD(model.parameters(), **hp)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        members.append({"path": path, "hp": hp, "val_acc": 0.0})

    cut = max(1, int(round(args.population * 0.2)))
    with mp.Pool(args.processes, initializer=init_worker, initargs=(args.device,)) as pool:
        for interval in range(args.intervals):
            jobs = [(m["path"], m["hp"], args.steps, args.eval_size,
                     args.seed * 1000003 + i * 1009 + interval) for i, m in enumerate(members)]
            for m, acc in zip(members, pool.map(train_interval, jobs, chunksize=1)):
                m["val_acc"] = acc
            if interval + 1 == args.intervals:
                break
            ranked = sorted(members, key=lambda m: m["val_acc"], reverse=True)
            for loser in ranked[-cut:]:
                donor = rng.choice(ranked[:cut])
                shutil.copyfile(donor["path"], loser["path"])
                loser["hp"] = {k: v * rng.choice((0.8, 1.2)) for k, v in donor["hp"].items()}
        best = max(members, key=lambda m: m["val_acc"])
        test_acc = pool.apply(test_accuracy, (best["path"],))

    wall_s = time.monotonic() - start
    pss = sampler.stop() if not args.no_pss else 0
    if not args.workdir:
        shutil.rmtree(workdir)
    samples = args.population * args.intervals * args.steps * BATCH
    print(json.dumps({
        "bench": "seed_approach",
        "population": args.population,
        "intervals": args.intervals,
        "steps_per_interval": args.steps,
        "processes": args.processes,
        "train_samples": samples,
        "samples_per_s": samples / wall_s,
        "wall_s": wall_s,
        "pss_bytes": pss,
        "best_val_acc": best["val_acc"],
        "test_acc": test_acc,
        "torch": torch.__version__,
        "device": args.device,
    }))


if __name__ == "__main__":
    main()
