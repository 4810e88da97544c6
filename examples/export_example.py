"""Load a model exported by ckpt-tool in plain PyTorch and reproduce ckpt's accuracy.

    ckpt-tool export demo/m003 -o m003.pt                 # a state_dict
    ckpt-tool export demo/m003 -o m003.safetensors        # the blob as stored
    python3 examples/export_example.py m003.pt
    python3 examples/export_example.py m003.safetensors   # needs `pip install safetensors`

Both files carry what is needed to use the model: the model spec, the input
normalization ckpt trained with (mean and std of the training split's pixels
/ 255), the number of classes, the hyperparameters and the step. A .pt keeps
them in the archive record ckpt.json (torch.load ignores it; a .pt written
with --optimizer also has them under its "ckpt" key); a .safetensors in its
__metadata__ ("ckpt.input_mean", ...).

The script takes ckpt's "lenet5" as an nn.Module (ckpt_client.models.LeNet5:
`pip install ./python`, else this checkout's python/), loads the weights with
load_state_dict, normalizes the Fashion-MNIST test split exactly as ckpt's
workers do (x = u8 * scale + shift in float32) and prints the test accuracy,
which equals the one in `ckpt-tool events EXPERIMENT --type final_eval`.
"""
import gzip
import json
import os
import struct
import sys
import zipfile

import torch

# ckpt's built-in model spec "lenet5" as an nn.Module, with ckpt's state_dict names.
try:
    from ckpt_client.models import LeNet5
except ImportError:
    # ckpt_client not installed in this python (or installed without models):
    # this checkout's python/.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "python"))
    sys.modules.pop("ckpt_client", None)
    from ckpt_client.models import LeNet5


def load_export(path):
    """Returns (model state_dict, metadata dict) of a ckpt-tool export."""
    if path.endswith(".safetensors"):
        from safetensors import safe_open
        from safetensors.torch import load_file

        tensors = load_file(path)
        with safe_open(path, "pt") as f:
            raw = f.metadata()
        meta = {
            "model_spec": raw["ckpt.model_spec"],
            # Per channel, as JSON lists: x' = x * input_scale[c] + input_shift[c].
            "input_scale": json.loads(raw["ckpt.input_scale"]),
            "input_shift": json.loads(raw["ckpt.input_shift"]),
            "num_classes": int(raw["ckpt.num_classes"]),
            "step": int(raw["ckpt.step"]),
            "hparams": json.loads(raw["ckpt.hparams"]),
        }
        # Optimizer state travels as optim.<param>.<slot>; the model needs the rest.
        return {k: v for k, v in tensors.items() if not k.startswith("optim.")}, meta
    state = torch.load(path, weights_only=True)
    if "model" in state:  # exported with --optimizer
        state = state["model"]
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/ckpt.json"))
        meta = json.loads(z.read(name))
    return state, meta


def read_idx(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    rank = data[3]
    dims = struct.unpack(">" + "I" * rank, data[4:4 + 4 * rank])
    return torch.frombuffer(bytearray(data[4 + 4 * rank:]), dtype=torch.uint8).reshape(dims)


def main():
    path = sys.argv[1]
    data_dir = sys.argv[2] if len(sys.argv) > 2 else "/usr/share/datasets/fashion-mnist"
    state, meta = load_export(path)
    assert meta["model_spec"] == "lenet5", "this example builds lenet5 only"
    model = LeNet5(meta["num_classes"])
    model.load_state_dict(state)
    model.eval()

    def idx(name):
        p = os.path.join(data_dir, name)
        return read_idx(p if os.path.exists(p) else p + ".gz")

    images, labels = idx("t10k-images-idx3-ubyte"), idx("t10k-labels-idx1-ubyte").long()
    # What ckpt's workers feed: x * scale + shift per channel, on the raw
    # uint8 values (one channel here).
    scale = torch.tensor(meta["input_scale"]).view(1, -1, 1, 1)
    shift = torch.tensor(meta["input_shift"]).view(1, -1, 1, 1)
    correct = 0
    with torch.no_grad():
        for b in range(0, len(images), 1000):
            x = images[b:b + 1000].unsqueeze(1).float().mul_(scale).add_(shift)
            correct += int((model(x).argmax(1) == labels[b:b + 1000]).sum())
    print(f"{path}: step {meta['step']}, hyperparameters {meta['hparams']}, "
          f"test accuracy {correct / len(images):.4f}")


if __name__ == "__main__":
    main()
