"""Drive a running ckpt-scheduler service from Python, notebook style.

    pip install ./python                       # into the project venv (.venv)
    python3 examples/service_client.py [--socket /run/ckpt/control.sock] [examples/demo.toml]

Submits the demo experiment to the service, watches its progress line until
it ends, lists the members as a table (a pandas DataFrame when pandas is
installed), loads the best member into LeNet-5 (examples/export_example.py)
and scores it on the Fashion-MNIST test split, normalized exactly as ckpt's
workers do.
"""
import argparse
import json
import os
import sys

import torch

from ckpt_client import Client, load_state_dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_example import LeNet5, read_idx  # noqa: E402


def score(model, meta, data_dir):
    def idx(name):
        p = os.path.join(data_dir, name)
        return read_idx(p if os.path.exists(p) else p + ".gz")

    images, labels = idx("t10k-images-idx3-ubyte"), idx("t10k-labels-idx1-ubyte").long()
    # Per channel, as JSON lists: what ckpt's workers feed is x * scale + shift.
    scale = torch.tensor(json.loads(meta["ckpt.input_scale"])).view(1, -1, 1, 1)
    shift = torch.tensor(json.loads(meta["ckpt.input_shift"])).view(1, -1, 1, 1)
    correct = 0
    with torch.no_grad():
        for b in range(0, len(images), 1000):
            x = images[b:b + 1000].unsqueeze(1).float().mul_(scale).add_(shift)
            correct += int((model(x).argmax(1) == labels[b:b + 1000]).sum())
    return correct / len(images)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("experiment", nargs="?", default=os.path.join(here, "demo.toml"))
    ap.add_argument("--socket", default=None, help="default: $CKPT_SOCKET or /run/ckpt/control.sock")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()

    with Client(args.socket) as client:
        name = client.submit(args.experiment)
        print(f"submitted {name}")
        for progress in client.watch(name):
            print(progress["progress"], flush=True)

        table = client.results(name)
        print(table)
        best = table.iloc[0] if hasattr(table, "iloc") else table[0]
        ref = f"{name}/{best['member']}@{best['version']}"
        state, meta = load_state_dict(ref, client=client, metadata=True)

    model = LeNet5(int(meta["ckpt.num_classes"]))
    model.load_state_dict(state)
    model.eval()
    accuracy = score(model, meta, args.data)
    print(f"{ref}: hyperparameters {json.loads(meta['ckpt.hparams'])}, "
          f"val_accuracy {best['val_accuracy']:.4f}, test accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
