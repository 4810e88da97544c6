#!/usr/bin/python3
"""The seed user's own population-based training, written plainly in PyTorch.

This is the setup ckpt is measured against (issue 11), as the user runs it:
one torch.multiprocessing.Pool(7); one file per member holding its model and
optimizer state_dicts, torch.load-ed, trained, evaluated and torch.save-d back
by a pool worker every interval; torch.set_num_threads(1) in each worker; the
synchronous PBT step in the parent between intervals (the bottom 20% copy a
random top-20% member's file and hyperparameters, then multiply each
hyperparameter by 0.8 or 1.2); at the end the best member's test accuracy.

Workloads (--workload; the options not named below default alike):
  fashion-lenet5 (default): 30 LeNet-5 members, Fashion-MNIST from the IDX
    files of --dataset (default /usr/share/datasets/fashion-mnist), SGD with
    momentum and weight decay, batch 64, 4 intervals x 100 steps, validation on
    2,000 images after each interval. The data split matches ckpt's: the last
    10,000 training images are the validation split (the first --eval-size of
    them are scored), inputs are normalized with the training split's mean and
    standard deviation. Search space of examples/fashion-mnist-pbt.toml.
  cifar-resnet20: ckpt's built-in "resnet20" (He et al. 2016's CIFAR ResNet-20:
    conv 3x3 16, three stages of three basic blocks of 16, 32, 64 channels,
    BatchNorm, a conv1x1 + BatchNorm shortcut where a stage halves the size,
    global average pooling, linear 64->10; 272,474 parameters) on a ckpt tensor
    dataset: --dataset is a safetensors file (default cifar10.safetensors) with
    train.x uint8 [N, 3, 32, 32], train.y int64 and optionally val.x/val.y,
    test.x/test.y, as examples/make_dataset.py cifar-synthetic writes; without
    val the last --val-size (default 5000) train rows are held out, as ckpt's
    [data] val_size. Inputs stay uint8 in memory; each batch is augmented
    (random crop with 4 pixels of zero padding and a horizontal flip, drawn per
    image from the member's seeded generator, for the whole batch at once, on
    the raw pixels) and normalized per channel with the train split's mean and
    standard deviation of value / 255, as ckpt does. Batch 128 by default;
    search space of examples/cifar10-resnet20-pbt.toml (lr 0.01-0.4 log,
    momentum 0.8-0.95, weight_decay 5e-5-1e-3 log). Without test.x/test.y,
    test_acc is -1.

  /usr/bin/python3 bench/seed_approach.py [--workload fashion-lenet5]
      [--population 30] [--intervals 4] [--steps 100] [--batch 64|128]
      [--seed 2026] [--processes 7] [--eval-size 2000]
      [--dataset /usr/share/datasets/fashion-mnist|cifar10.safetensors]
      [--val-size 5000] [--workdir DIR] [--no-pss] [--device cpu]

A member's data order for an interval is a seeded permutation of the train
split (more permutations follow it when --steps x --batch exceeds the split).

--device cuda (or cuda:N): the user's GPU setup. The parent never touches CUDA
(forking after CUDA starts is not allowed), so each pool worker creates its
own CUDA context, copies the dataset to the GPU once, trains there, and
torch.load/torch.save the member files with map_location on every interval.

The last line printed is one JSON object: samples_per_s (training samples over
the wall time from start to the final test accuracy), wall_s, pss_bytes (the
peak over the run of the summed PSS of this process and its descendants,
sampled from /proc/PID/smaps_rollup once a second; 0 with --no-pss, for a
caller that samples the tree from outside), best_val_acc, test_acc, and
the run's settings (bench, population, intervals, steps_per_interval,
processes, train_samples = population x intervals x steps x batch, torch,
device, workload).
"""
import argparse
import gzip
import json
import math
import os
import random
import shutil
import sys
import tempfile
import threading
import time

import numpy as np
import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

# LeNet-5 as the user writes it: ckpt's built-in "lenet5", the same layers.
try:
    from ckpt_client.models import LeNet5
except ImportError:
    # ckpt_client not installed in this python (or installed without models):
    # this checkout's python/.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "python"))
    sys.modules.pop("ckpt_client", None)
    from ckpt_client.models import LeNet5

VALIDATION_SIZE = 10000  # the tail of the training file held out, as ckpt does
BATCH = 64  # set from --batch in main (the pool's workers fork after that)
WORKLOADS = ("fashion-lenet5", "cifar-resnet20")
DEFAULT_DATASET = {"fashion-lenet5": "/usr/share/datasets/fashion-mnist",
                   "cifar-resnet20": "cifar10.safetensors"}
DEFAULT_BATCH = {"fashion-lenet5": 64, "cifar-resnet20": 128}
# (lr, momentum, weight_decay) ranges: examples/fashion-mnist-pbt.toml and
# examples/cifar10-resnet20-pbt.toml.
SEARCH_SPACE = {"fashion-lenet5": ((1e-3, 0.2), (0.5, 0.99), (1e-6, 1e-2)),
                "cifar-resnet20": ((0.01, 0.4), (0.8, 0.95), (5e-5, 1e-3))}
CROP_PADDING = 4  # cifar-resnet20's augmentation: random_crop:4 and hflip


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm; identity shortcut, or conv1x1 + BatchNorm
    where the block changes the shape (ckpt's "residual" layer)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(nn.Module):
    """ckpt's built-in "resnet20" (worker/spec/src/model_spec.cc Resnet20())."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        blocks, channels = [], 16
        for width in (16, 32, 64):
            for _ in range(3):
                blocks.append(BasicBlock(channels, width, 2 if width != channels else 1))
                channels = width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.blocks(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


MODELS = {"fashion-lenet5": LeNet5, "cifar-resnet20": ResNet20}


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


SAFETENSORS_DTYPES = {"U8": "u1", "I8": "i1", "I16": "<i2", "I32": "<i4", "I64": "<i8",
                      "F16": "<f2", "F32": "<f4", "F64": "<f8", "BOOL": "?"}


def read_safetensors(path):
    """{name: numpy array} of a safetensors file (safetensors.numpy when installed)."""
    try:
        from safetensors.numpy import load_file
    except ImportError:
        load_file = None
    if load_file is not None:
        return load_file(path)
    # The format by hand: an 8-byte little-endian header length, a JSON header
    # {name: {dtype, shape, data_offsets: [begin, end]}}, then the data.
    buf = np.fromfile(path, dtype=np.uint8)
    n = int.from_bytes(buf[:8].tobytes(), "little")
    header = json.loads(buf[8:8 + n].tobytes())
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = np.dtype(SAFETENSORS_DTYPES[info["dtype"]])
        begin, end = info["data_offsets"]
        a = np.frombuffer(buf, dtype=dtype, count=(end - begin) // dtype.itemsize,
                          offset=8 + n + begin).reshape(info["shape"])
        # uint8 stays a view of the file's buffer; wider types are copied (aligned).
        out[name] = a if dtype.itemsize == 1 else a.copy()
    return out


def load_tensor_dataset(path, val_size):
    """uint8 tensors [N, 3, 32, 32] and int64 labels of a ckpt tensor dataset, and
    the per-channel (scale, shift) that normalize value as value * scale + shift."""
    arrays = read_safetensors(path)
    for key in ("train.x", "train.y"):
        if key not in arrays:
            raise SystemExit("%s: no %s" % (path, key))
    train_x, train_y = arrays["train.x"], arrays["train.y"]
    if train_x.dtype != np.uint8 or tuple(train_x.shape[1:]) != (3, 32, 32):
        raise SystemExit("%s: train.x is %s%s; cifar-resnet20 needs uint8 [N, 3, 32, 32]" %
                         (path, train_x.dtype, list(train_x.shape)))
    if "val.x" in arrays:
        val_x, val_y = arrays["val.x"], arrays["val.y"]
    else:
        if not 1 <= val_size < len(train_x):
            raise SystemExit("%s: has no val split, so --val-size must hold out 1 to %d rows" %
                             (path, len(train_x) - 1))
        keep = len(train_x) - val_size
        train_x, train_y, val_x, val_y = train_x[:keep], train_y[:keep], train_x[keep:], train_y[keep:]
    # Per channel: mean and standard deviation of value / 255 over the train
    # split, from exact integer sums (store/format/src/tensor_dataset.cc).
    scale, shift = [], []
    count = float(train_x.shape[0] * train_x.shape[2] * train_x.shape[3])
    values = np.arange(256, dtype=np.int64)
    for c in range(train_x.shape[1]):
        hist = np.bincount(train_x[:, c].ravel(), minlength=256).astype(np.int64)
        mean = float((hist * values).sum()) / (count * 255.0)
        mean_sq = float((hist * values * values).sum()) / (count * 255.0 * 255.0)
        std = math.sqrt(max(mean_sq - mean * mean, 1e-12))
        scale.append(1.0 / (255.0 * std))
        shift.append(-mean / std)

    def labels(y):
        return torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))

    data = {"train": (torch.from_numpy(train_x), labels(train_y)),
            "val": (torch.from_numpy(val_x), labels(val_y))}
    if "test.x" in arrays:
        data["test"] = (torch.from_numpy(arrays["test.x"]), labels(arrays["test.y"]))
    for split, (_, y) in data.items():
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= 10):
            raise SystemExit("%s: %s.y has labels outside 0..9" % (path, split))
    return data, (torch.tensor(scale, dtype=torch.float32).view(1, -1, 1, 1),
                  torch.tensor(shift, dtype=torch.float32).view(1, -1, 1, 1))


# The dataset, loaded once in the parent before the pool forks, so the workers
# share its pages (the cheapest way a Python user gets it into every worker).
DATA = None
# cifar-resnet20: the per-channel (scale, shift) of the uint8 inputs (the
# fashion-lenet5 data are normalized at load time: None).
NORM = None
WORKLOAD = "fashion-lenet5"


DEVICE = "cpu"


def init_worker(device="cpu"):
    global DATA, DEVICE, NORM
    torch.set_num_threads(1)
    DEVICE = device
    if device != "cpu":
        DATA = {k: (x.to(device), y.to(device)) for k, (x, y) in DATA.items()}
        if NORM is not None:
            NORM = tuple(t.to(device) for t in NORM)


def inputs(x):
    """The model's input of stored rows: float32, normalized per channel."""
    if NORM is None:
        return x
    return x.float().mul_(NORM[0]).add_(NORM[1])


def augment(raw, generator):
    """Random crop with CROP_PADDING pixels of zero padding, then a horizontal flip
    with probability 1/2, of every image of a [B, C, H, W] batch at once; the
    offsets and flips come from `generator` (ckpt's Augment, member_tensors.cc)."""
    b, c, h, w = raw.shape
    p = CROP_PADDING
    oy = torch.randint(0, 2 * p + 1, (b, 1), generator=generator).to(raw.device)
    ox = torch.randint(0, 2 * p + 1, (b, 1), generator=generator).to(raw.device)
    flip = torch.randint(0, 2, (b, 1), generator=generator).to(raw.device).bool()
    rows = oy + torch.arange(h, device=raw.device).view(1, h)  # [B, H] in the padded image
    cols = torch.arange(w, device=raw.device).view(1, w)
    cols = ox + torch.where(flip, (w - 1) - cols, cols)  # [B, W], mirrored where flipped
    padded = F.pad(raw, (p, p, p, p))
    by_row = padded.gather(2, rows.view(b, 1, h, 1).expand(b, c, h, w + 2 * p))
    return by_row.gather(3, cols.view(b, 1, 1, w).expand(b, c, h, w))


def accuracy(model, split, count):
    x, y = DATA[split]
    x, y = x[:count], y[:count]
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 1000):
            correct += (model(inputs(x[i:i + 1000])).argmax(1) == y[i:i + 1000]).sum().item()
    return correct / len(x)


def train_interval(job):
    """One member's interval in a pool worker: load its file, train, evaluate, save."""
    path, hp, steps, eval_size, data_seed = job
    model = MODELS[WORKLOAD]().to(DEVICE)
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
    order = torch.randperm(len(x), generator=generator)
    if steps * BATCH > len(x):  # more epochs than one: more permutations after it
        epochs = [order] + [torch.randperm(len(x), generator=generator)
                            for _ in range((steps * BATCH - 1) // len(x))]
        order = torch.cat(epochs)
    order = order.to(DEVICE)
    model.train()
    for s in range(steps):
        idx = order[s * BATCH:(s + 1) * BATCH]
        optimizer.zero_grad()
        if NORM is None:
            batch = x[idx]
        else:
            batch = inputs(augment(x[idx], generator))
        loss = F.cross_entropy(model(batch), y[idx])
        loss.backward()
        optimizer.step()
    val_acc = accuracy(model, "val", eval_size)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    return val_acc


def test_accuracy(path):
    model = MODELS[WORKLOAD]().to(DEVICE)
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
    parser.add_argument("--workload", choices=WORKLOADS, default="fashion-lenet5")
    parser.add_argument("--population", type=int, default=30)
    parser.add_argument("--intervals", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=0,
                        help="batch size (default: 64 fashion-lenet5, 128 cifar-resnet20)")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--processes", type=int, default=7)
    parser.add_argument("--eval-size", type=int, default=2000)
    parser.add_argument("--dataset", default="",
                        help="the IDX directory (fashion-lenet5, default "
                        "/usr/share/datasets/fashion-mnist) or safetensors file "
                        "(cifar-resnet20, default cifar10.safetensors)")
    parser.add_argument("--val-size", type=int, default=5000,
                        help="cifar-resnet20 without val.x/val.y: train rows held out")
    parser.add_argument("--workdir", default="", help="member files (default: a temp dir)")
    parser.add_argument("--no-pss", action="store_true",
                        help="no PSS sampling here (a caller samples this process tree itself)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (see above)")
    args = parser.parse_args()
    global DATA, NORM, WORKLOAD, BATCH
    WORKLOAD = args.workload
    BATCH = args.batch or DEFAULT_BATCH[args.workload]
    if BATCH < 1:
        parser.error("--batch must be at least 1")
    dataset = args.dataset or DEFAULT_DATASET[args.workload]

    start = time.monotonic()
    sampler = PssSampler()
    if not args.no_pss:
        sampler.start()
    if WORKLOAD == "fashion-lenet5":
        DATA = load_dataset(dataset)
    else:
        DATA, NORM = load_tensor_dataset(dataset, args.val_size)
        print("cifar-resnet20: %d parameters; train %d, val %d, test %d rows; batch %d" %
              (sum(p.numel() for p in ResNet20().parameters()), len(DATA["train"][0]),
               len(DATA["val"][0]), len(DATA["test"][0]) if "test" in DATA else 0, BATCH),
              file=sys.stderr, flush=True)
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    workdir = args.workdir or tempfile.mkdtemp(prefix="seed-approach-")
    os.makedirs(workdir, exist_ok=True)

    # The same search space as examples/fashion-mnist-pbt.toml or
    # examples/cifar10-resnet20-pbt.toml.
    (lr_min, lr_max), (m_min, m_max), (wd_min, wd_max) = SEARCH_SPACE[WORKLOAD]
    members = []
    for i in range(args.population):
        hp = {"lr": math.exp(rng.uniform(math.log(lr_min), math.log(lr_max))),
              "momentum": rng.uniform(m_min, m_max),
              "weight_decay": math.exp(rng.uniform(math.log(wd_min), math.log(wd_max)))}
        path = os.path.join(workdir, "member%d.pt" % i)
        model = MODELS[WORKLOAD]()
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
        test_acc = pool.apply(test_accuracy, (best["path"],)) if "test" in DATA else -1.0

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
        "workload": args.workload,
    }))


if __name__ == "__main__":
    main()
