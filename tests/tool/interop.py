"""Python side of ckpt-tool's interop tests, with real PyTorch.

  interop.py check-export --pt F.pt --pt-opt G.pt --safetensors H.safetensors
                          --blob B --dataset DIR --test-acc A
      F.pt (a bare state_dict) and G.pt (model + torch.optim state + ckpt
      metadata) load with torch.load(weights_only=True) into LeNet5 (ckpt's
      lenet5 written as one would in Python: ckpt_client.models) with load_state_dict(strict);
      H.safetensors loads with the safetensors package and equals B (the blob
      as ckpt stores it, read here with json + struct, no ckpt code) tensor by
      tensor; logits of all three on a fixed batch agree to 1e-5; the model
      evaluated on the test split with the exported normalization has test
      accuracy A (ckpt's own final evaluation). Prints one JSON line.
  interop.py train-further --pt-opt G.pt --dataset DIR --steps N --out W.pt
                          [--out-safetensors W.safetensors] [--out-state-dict S.pt]
      Loads model and optimizer from G.pt, trains N steps of torch.optim.SGD on
      the train split, saves {"model": dict(state_dict), "optimizer":
      opt.state_dict()} with torch.save (and the model tensors plus
      optim.<param>.momentum_buffer with safetensors; and torch.save of the
      bare model.state_dict(), an OrderedDict). Prints one JSON line.
  interop.py bad-shape --out X.safetensors
      A LeNet5 state whose conv1.weight is [6, 1, 3, 3].
  interop.py pickled-code --out X.pt --marker PATH
      A torch.save file whose unpickling would run os.system("touch PATH").
"""
import argparse
import gzip
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

# ckpt's built-in "lenet5" (worker/spec/src/model_spec.cc), in plain PyTorch.
try:
    from ckpt_client.models import LeNet5
except ImportError:
    # ckpt_client not installed in this python (or installed without models):
    # this checkout's python/.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "..", "python"))
    sys.modules.pop("ckpt_client", None)
    from ckpt_client.models import LeNet5


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    rank = data[3]
    dims = struct.unpack(">" + "I" * rank, data[4:4 + 4 * rank])
    return torch.frombuffer(bytearray(data[4 + 4 * rank:]), dtype=torch.uint8).reshape(dims)


def dataset_file(directory, name):
    plain = os.path.join(directory, name)
    return plain if os.path.exists(plain) else plain + ".gz"


def normalize(images_u8, mean, std):
    # ckpt feeds x = u8 * scale + shift in float32 with these two constants.
    scale = 1.0 / (255.0 * std)
    shift = -mean / std
    return images_u8.unsqueeze(1).to(torch.float32).mul_(scale).add_(shift)


def read_blob(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    dtypes = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64}
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        buf = bytearray(data[8 + n + b:8 + n + e])
        out[name] = torch.frombuffer(buf, dtype=dtypes[t["dtype"]]).reshape(t["shape"]).clone() \
            if buf else torch.zeros(t["shape"], dtype=dtypes[t["dtype"]])
    return meta, out


def model_from(state):
    m = LeNet5()
    m.load_state_dict(state, strict=True)
    m.eval()
    return m


def accuracy(model, images, labels, mean, std):
    correct = 0
    with torch.no_grad():
        for b in range(0, images.shape[0], 1000):
            x = normalize(images[b:b + 1000], mean, std)
            correct += int((model(x).argmax(1) == labels[b:b + 1000]).sum())
    return correct / images.shape[0]


def check_export(a):
    from safetensors import safe_open
    from safetensors.torch import load_file

    sd = torch.load(a.pt, weights_only=True)
    assert type(sd) is dict, type(sd)
    full = torch.load(a.pt_opt, weights_only=True)
    assert set(full.keys()) == {"model", "optimizer", "ckpt"}, full.keys()
    meta = full["ckpt"]
    # Per channel: one channel here.
    assert len(meta["input_mean"]) == 1 and len(meta["input_std"]) == 1, meta
    mean, std = meta["input_mean"][0], meta["input_std"][0]
    assert meta["model_spec"] == "lenet5" and int(meta["num_classes"]) == 10, meta
    assert meta["input_dtype"] == "uint8" and meta["input_shape"] == [1, 28, 28], meta
    assert meta["input_scale"] == [1 / (255 * std)] and meta["input_shift"] == [-mean / std], meta
    # The optimizer part is torch.optim's own layout.
    model_opt = LeNet5()
    model_opt.load_state_dict(full["model"], strict=True)
    opt = torch.optim.SGD(model_opt.parameters(), lr=0.1, momentum=0.5)
    opt.load_state_dict(full["optimizer"])
    assert len(opt.state) == len(list(model_opt.parameters()))

    st = load_file(a.safetensors)
    with safe_open(a.safetensors, "pt") as f:
        st_meta = f.metadata()
    assert json.loads(st_meta["ckpt.input_mean"]) == [mean], st_meta
    assert json.loads(st_meta["ckpt.input_std"]) == [std], st_meta
    _, blob = read_blob(a.blob)
    assert set(st.keys()) == set(blob.keys()), (sorted(st.keys()), sorted(blob.keys()))
    for k in blob:
        assert torch.equal(st[k], blob[k]), k
    for k in sd:
        assert torch.equal(sd[k], blob[k]), k
        assert torch.equal(full["model"][k], blob[k]), k
    for i, (name, _) in enumerate(model_opt.named_parameters()):
        assert torch.equal(full["optimizer"]["state"][i]["momentum_buffer"],
                           blob["optim." + name + ".momentum_buffer"]), name

    test_x = read_idx(dataset_file(a.dataset, "t10k-images-idx3-ubyte"))
    test_y = read_idx(dataset_file(a.dataset, "t10k-labels-idx1-ubyte")).to(torch.int64)
    m_pt = model_from(sd)
    m_st = model_from({k: v for k, v in st.items() if not k.startswith("optim.")})
    m_blob = model_from({k: v for k, v in blob.items() if not k.startswith("optim.")})
    batch = normalize(test_x[:64], mean, std)
    with torch.no_grad():
        l_pt, l_st, l_blob = m_pt(batch), m_st(batch), m_blob(batch)
    diff = max(float((l_pt - l_blob).abs().max()), float((l_st - l_blob).abs().max()))
    assert diff <= 1e-5, diff
    acc = accuracy(m_pt, test_x, test_y, mean, std)
    wrong = round(abs(acc - a.test_acc) * test_x.shape[0])
    print(json.dumps({"logits_max_diff": diff, "test_acc": acc, "ckpt_test_acc": a.test_acc,
                      "samples_differing": wrong, "torch": torch.__version__}))
    # ckpt's workers evaluate with their own kernels and batch sizes: logits
    # agree to about 1e-6, so an argmax tie may, rarely, fall the other way.
    assert wrong <= 2, (acc, a.test_acc)


def train_further(a):
    full = torch.load(a.pt_opt, weights_only=True)
    meta = full["ckpt"]
    mean, std = meta["input_mean"][0], meta["input_std"][0]
    model = LeNet5()
    model.load_state_dict(full["model"])
    hp = meta["hparams"]
    opt = torch.optim.SGD(model.parameters(), lr=float(hp["lr"]), momentum=float(hp["momentum"]))
    opt.load_state_dict(full["optimizer"])
    for g in opt.param_groups:  # plain Python numbers again, as a user would have them
        for k in ("lr", "momentum", "weight_decay"):
            g[k] = float(g[k])
    images = read_idx(dataset_file(a.dataset, "train-images-idx3-ubyte"))[:50000]
    labels = read_idx(dataset_file(a.dataset, "train-labels-idx1-ubyte"))[:50000].to(torch.int64)
    gen = torch.Generator().manual_seed(1234)
    model.train()
    losses = []
    for _ in range(a.steps):
        idx = torch.randint(0, images.shape[0], (32,), generator=gen)
        loss = F.cross_entropy(model(normalize(images[idx], mean, std)), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    torch.save({"model": dict(model.state_dict()), "optimizer": opt.state_dict()}, a.out)
    if a.out_state_dict:  # the usual torch.save(model.state_dict()): an OrderedDict
        torch.save(model.state_dict(), a.out_state_dict)
    if a.out_safetensors:
        from safetensors.torch import save_file
        tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
        for i, (name, _) in enumerate(model.named_parameters()):
            tensors["optim." + name + ".momentum_buffer"] = opt.state_dict()["state"][i]["momentum_buffer"]
        save_file(tensors, a.out_safetensors, metadata={"ckpt.step": str(int(meta["step"]) + a.steps)})
    print(json.dumps({"steps": a.steps, "first_loss": losses[0], "last_loss": losses[-1],
                      "conv1_weight_sum": float(model.conv1.weight.sum())}))


def bad_shape(a):
    from safetensors.torch import save_file
    m = LeNet5()
    sd = {k: v.contiguous() for k, v in m.state_dict().items()}
    sd["conv1.weight"] = torch.zeros(6, 1, 3, 3)
    save_file(sd, a.out)


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch " + self.marker,))


def pickled_code(a):
    torch.save({"conv1.weight": torch.zeros(6, 1, 5, 5), "payload": RunsCode(a.marker)}, a.out)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check-export")
    c.add_argument("--pt", required=True)
    c.add_argument("--pt-opt", required=True)
    c.add_argument("--safetensors", required=True)
    c.add_argument("--blob", required=True)
    c.add_argument("--dataset", required=True)
    c.add_argument("--test-acc", type=float, required=True)
    t = sub.add_parser("train-further")
    t.add_argument("--pt-opt", required=True)
    t.add_argument("--dataset", required=True)
    t.add_argument("--steps", type=int, default=20)
    t.add_argument("--out", required=True)
    t.add_argument("--out-safetensors", default="")
    t.add_argument("--out-state-dict", default="")
    b = sub.add_parser("bad-shape")
    b.add_argument("--out", required=True)
    k = sub.add_parser("pickled-code")
    k.add_argument("--out", required=True)
    k.add_argument("--marker", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    {"check-export": check_export, "train-further": train_further, "bad-shape": bad_shape,
     "pickled-code": pickled_code}[a.cmd](a)


if __name__ == "__main__":
    main()
