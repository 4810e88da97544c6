"""Reference trainer in Python PyTorch for the ckpt::model cross-check.

  torch_reference.py train --init A --result B --spec SPEC --optimizer sgd|adam|adamw
                           --hparams JSON --batch N --steps S --dataset DIR [--tolerance T]
      Loads the initial blob A (ckpt's safetensors layout, parsed here with
      json + struct + torch.frombuffer), trains S steps of torch.optim on the
      member's own batches (ckpt's documented data order and normalization),
      and compares every tensor with blob B. Exit 0 when all are within T
      (relative to each tensor's largest magnitude).

  torch_reference.py script --out PATH --spec SPEC
      Writes torch.jit.script of the model SPEC (a ckpt model spec) to PATH.
"""
import argparse
import gzip
import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import ckpt_client.models as ckpt_models
except ImportError:
    # ckpt_client not installed in this python (or installed without models):
    # this checkout's python/.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "..", "python"))
    sys.modules.pop("ckpt_client", None)
    import ckpt_client.models as ckpt_models

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15

LENET5 = [
    {"type": "conv2d", "in": 1, "out": 6, "kernel": 5, "padding": 2},
    {"type": "relu"},
    {"type": "maxpool2d", "kernel": 2},
    {"type": "conv2d", "in": 6, "out": 16, "kernel": 5},
    {"type": "relu"},
    {"type": "maxpool2d", "kernel": 2},
    {"type": "flatten"},
    {"type": "linear", "in": 400, "out": 120},
    {"type": "relu"},
    {"type": "linear", "in": 120, "out": 84},
    {"type": "relu"},
    {"type": "linear", "in": 84, "out": 10},
]


def read_blob(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    dtypes = {"F32": torch.float32, "I64": torch.int64, "F64": torch.float64}
    tensors = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        buf = bytearray(data[base + b:base + e])
        if len(buf) == 0:
            tensors[name] = torch.zeros(t["shape"], dtype=dtypes[t["dtype"]])
        else:
            tensors[name] = torch.frombuffer(buf, dtype=dtypes[t["dtype"]]).reshape(t["shape"]).clone()
    return meta, tensors


def splitmix64(state):
    state = (state + GOLDEN) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def epoch_permutation(seed, epoch, n):
    p = list(range(n))
    state = seed ^ ((GOLDEN * (epoch + 1)) & MASK)
    for i in range(n - 1, 0, -1):
        state, r = splitmix64(state)
        j = r % (i + 1)
        p[i], p[j] = p[j], p[i]
    return p


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    rank = data[3]
    dims = struct.unpack(">" + "I" * rank, data[4:4 + 4 * rank])
    return torch.frombuffer(bytearray(data[4 + 4 * rank:]), dtype=torch.uint8).reshape(dims)


def cpu_has_avx512():
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


CPU_HAS_AVX512 = cpu_has_avx512()
# --spread-factor trains twice: conv1 through each of PyTorch's two kernels (the
# im2col run with oneDNN off, so every convolution through im2col):
# None follows the CPU (as below), "onednn" or "thnn" forces one.
CONV1_KERNEL = None


class OneChannelConv2d(nn.Conv2d):
    """nn.Conv2d that, on a CPU without AVX-512, trains on a one-channel input
    through LibTorch's im2col and matrix product (thnn_conv2d), as ckpt does
    (worker/src/forward.cc: oneDNN's AVX2 kernels for that shape are slow).
    The same sums in another order, so the comparison stays bit-close instead
    of drifting by float rounding (with oneDNN's conv here, on an AMD EPYC of
    the first Zen generation, the runs end 7e-7 to 4e-5 apart, and an Adam
    second moment of a bias before BatchNorm, a gradient that is rounding
    noise, 7e-3). TorchScript-able: the choice is an attribute of the module,
    so a scripted model keeps the one made on the machine that scripted it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.use_thnn = not CPU_HAS_AVX512 if CONV1_KERNEL is None else CONV1_KERNEL == "thnn"

    def forward(self, x):
        if (self.use_thnn and torch.is_grad_enabled() and self.weight.requires_grad
                and x.device.type == "cpu" and x.dim() == 4 and x.size(1) == 1
                and x.dtype == torch.float32):
            return torch._C._nn.thnn_conv2d(x, self.weight, self.kernel_size, self.bias,
                                            self.stride, self.padding)
        return self._conv_forward(x, self.weight, self.bias)


class SpecModel(nn.Module):
    """A ckpt model spec as a torch module with ckpt's state_dict names."""

    def __init__(self, layers, input_shape=(1, 28, 28)):
        super().__init__()
        self.kinds = []
        shape = list(input_shape)
        counters = {}
        for layer in layers:
            kind = layer["type"]
            name = ""
            if kind in ("conv2d", "linear", "batchnorm2d"):
                prefix = {"conv2d": "conv", "linear": "fc", "batchnorm2d": "bn"}[kind]
                counters[kind] = counters.get(kind, 0) + 1
                name = layer.get("name", prefix + str(counters[kind]))
            if kind == "conv2d":
                k, s, p = layer["kernel"], layer.get("stride", 1), layer.get("padding", 0)
                conv = OneChannelConv2d if shape[0] == 1 else nn.Conv2d
                mod = conv(shape[0], layer["out"], k, s, p, bias=layer.get("bias", True))
                shape = [layer["out"], (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
            elif kind == "linear":
                mod = nn.Linear(shape[0], layer["out"], bias=layer.get("bias", True))
                shape = [layer["out"]]
            elif kind == "batchnorm2d":
                mod = nn.BatchNorm2d(shape[0], eps=layer.get("eps", 1e-5), momentum=layer.get("momentum", 0.1))
            elif kind in ("maxpool2d", "avgpool2d"):
                k = layer["kernel"]
                s, p = layer.get("stride", k), layer.get("padding", 0)
                mod = (nn.MaxPool2d if kind == "maxpool2d" else nn.AvgPool2d)(k, s, p)
                shape = [shape[0], (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
                name = "pool%d" % len(self.kinds)
            elif kind == "flatten":
                mod = nn.Flatten()
                shape = [shape[0] * shape[1] * shape[2]]
                name = "flatten%d" % len(self.kinds)
            elif kind == "relu":
                mod, name = nn.ReLU(), "relu%d" % len(self.kinds)
            elif kind == "tanh":
                mod, name = nn.Tanh(), "tanh%d" % len(self.kinds)
            else:
                raise SystemExit("reference: layer %s not supported" % kind)
            self.add_module(name, mod)
            self.kinds.append(name)

    def forward(self, x):
        for name in self.kinds:
            x = getattr(self, name)(x)
        return x


class LeNet5(ckpt_models.LeNet5):
    """LeNet-5 written as one would in Python (ckpt_client.models.LeNet5);
    TorchScript-able. Its conv1 computes as ckpt's built-in lenet5 does
    (OneChannelConv2d: the same kernels on the same CPU), so the two train
    bit-close; with nn.Conv2d the runs differ by float rounding on CPUs
    without AVX-512 (1.1e-6 after eight steps under LibTorch 2.11)."""

    def __init__(self):
        super().__init__()
        # conv1 in place, with the weights the base class drew for it: the same
        # state_dict, and under one seed the same initial state as the base.
        conv1 = OneChannelConv2d(1, 6, 5, padding=2)
        conv1.load_state_dict(self.conv1.state_dict())
        self.conv1 = conv1


def parse_spec(text):
    if text == "lenet5":
        return LENET5
    doc = json.loads(text)
    return doc["layers"] if isinstance(doc, dict) else doc


def train_reference(args):
    """Trains args.steps from args.init as ckpt did; the state it ends with
    (ckpt's names)."""
    torch.set_num_threads(1)
    meta, init = read_blob(args.init)
    layers = parse_spec(args.spec)
    model = SpecModel(layers)
    sd = {k: v for k, v in init.items() if not k.startswith("optim.")}
    missing = set(model.state_dict().keys()) ^ set(sd.keys())
    if missing:
        raise SystemExit("reference: state names differ: %s" % sorted(missing))
    model.load_state_dict(sd)
    h = json.loads(args.hparams)
    params = dict(model.named_parameters())
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=h.get("lr", 0.01), momentum=h.get("momentum", 0),
                              weight_decay=h.get("weight_decay", 0), nesterov=bool(h.get("nesterov", 0)))
        for name, p in params.items():
            opt.state[p]["momentum_buffer"] = init["optim.%s.momentum_buffer" % name].clone()
    else:
        cls = torch.optim.Adam if args.optimizer == "adam" else torch.optim.AdamW
        opt = cls(model.parameters(), lr=h.get("lr", 0.001), betas=(h.get("beta1", 0.9), h.get("beta2", 0.999)),
                  eps=h.get("eps", 1e-8),
                  weight_decay=h.get("weight_decay", 0.0 if args.optimizer == "adam" else 0.01))
        for name, p in params.items():
            opt.state[p]["step"] = init["optim.%s.step" % name].clone()
            opt.state[p]["exp_avg"] = init["optim.%s.exp_avg" % name].clone()
            opt.state[p]["exp_avg_sq"] = init["optim.%s.exp_avg_sq" % name].clone()

    images = read_idx(args.dataset + "/train-images-idx3-ubyte.gz")
    labels = read_idx(args.dataset + "/train-labels-idx1-ubyte.gz")
    n = images.shape[0] - 10000
    images = images[:n].reshape(n, 1, 28, 28)
    labels = labels[:n].long()
    total = images.numel()
    s = int(images.sum(dtype=torch.int64))
    sq = int((images.long() * images.long()).sum())
    mean = float(s) / (total * 255.0)
    mean_sq = float(sq) / (total * 255.0 * 255.0)
    std = math.sqrt(max(mean_sq - mean * mean, 1e-12))
    scale, shift = 1.0 / (255.0 * std), -mean / std

    seed = int(meta["ckpt.data_seed"])
    cursor = int(meta["ckpt.data_cursor"])
    perms = {}
    model.train()
    for _ in range(args.steps):
        idx = []
        for i in range(args.batch):
            pos = cursor + i
            e = pos // n
            if e not in perms:
                perms[e] = epoch_permutation(seed, e, n)
            idx.append(perms[e][pos % n])
        idx_t = torch.tensor(idx, dtype=torch.int64)
        x = images.index_select(0, idx_t).float().mul_(scale).add_(shift)
        y = labels.index_select(0, idx_t)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        cursor += args.batch

    got = dict(model.state_dict())
    for name, p in params.items():
        st = opt.state[p]
        for slot in ("momentum_buffer", "exp_avg", "exp_avg_sq", "step"):
            if slot in st and st[slot] is not None:
                got["optim.%s.%s" % (name, slot)] = st[slot]
    got["ckpt.step"] = int(meta.get("ckpt.step", "0")) + args.steps
    return got


def relative(a, b):
    """max |a - b| over max |b| (the difference itself where b is all 0)."""
    a, b = a.detach().double(), b.detach().double()
    if not b.numel():
        return 0.0
    scale_b = b.abs().max().item()
    diff = (a - b).abs().max().item()
    return diff / scale_b if scale_b > 0 else diff


def train(args):
    """ckpt's result against the reference: every tensor within --tolerance
    relative; with --spread-factor F, within F times the distance between
    the results of PyTorch's own two convolution kernels (oneDNN's and
    im2col's, for every convolution) where that is larger (ckpt's own
    convolution kernels sum in a third order)."""
    global CONV1_KERNEL
    result_meta, expected = read_blob(args.result)
    spread = {}
    if args.spread_factor > 0:
        # Every convolution through im2col (oneDNN off): ckpt's own kernels
        # replace conv2's too.
        CONV1_KERNEL = "thnn"
        with torch.backends.mkldnn.flags(enabled=False):
            alternative = train_reference(args)
        CONV1_KERNEL = "onednn"
    got = train_reference(args)
    if args.spread_factor > 0:
        spread = {name: relative(alternative[name], got[name]) for name in expected if name in got}
    if got["ckpt.step"] != int(result_meta["ckpt.step"]):
        print("reference: step mismatch")
        return 1
    worst, worst_name, failed = 0.0, "", []
    worst_ratio = (0.0, "")  # over PyTorch's own spread, of the tensors past --tolerance
    for name, want in expected.items():
        if name not in got:
            print("reference: tensor %s missing on the Python side" % name)
            return 1
        if got[name].shape != want.shape:
            print("reference: %s shape %s vs %s" % (name, list(got[name].shape), list(want.shape)))
            return 1
        rel = relative(got[name], want)
        limit = max(args.tolerance, args.spread_factor * spread.get(name, 0.0))
        if rel > args.tolerance and spread:
            ratio = rel / spread[name] if spread[name] > 0 else float("inf")
            if ratio > worst_ratio[0]:
                worst_ratio = (ratio, name)
        if rel > limit:
            failed.append("%s %.3g > %.3g (PyTorch's own convolution kernels: %.3g)"
                          % (name, rel, limit, spread.get(name, 0.0)))
        if rel > worst:
            worst, worst_name = rel, name
    print("reference: %d tensors, worst relative difference %.3g (%s)" % (len(expected), worst, worst_name))
    if spread:
        name = max(spread, key=spread.get)
        print("reference: PyTorch's two convolution kernels' results apart by up to %.3g (%s); "
              "past the tolerance, ckpt is at most %.3g times that spread (%s)"
              % (spread[name], name, worst_ratio[0], worst_ratio[1] or "none"))
    for line in failed:
        print("reference: over the limit: " + line)
    return 1 if failed else 0


def script(args):
    model = LeNet5() if args.spec == "lenet5" else SpecModel(parse_spec(args.spec))
    torch.jit.save(torch.jit.script(model), args.out)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["train", "script"])
    ap.add_argument("--init")
    ap.add_argument("--result")
    ap.add_argument("--spec", default="lenet5")
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--hparams", default="{}")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--dataset", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--tolerance", type=float, default=1e-6)
    ap.add_argument("--spread-factor", type=float, default=0.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    return train(args) if args.command == "train" else script(args)


if __name__ == "__main__":
    sys.exit(main())
