# %% [markdown]
# # Population-based training from Python
#
# A population of your own PyTorch `LeNet5` on Fashion-MNIST, trained by ckpt
# with population-based training (PBT), then read back as a pandas DataFrame,
# a matplotlib figure, and your own module with the best member's weights.
#
# ckpt trains supervised models with its own training loop (SGD, Adam or
# AdamW; cross-entropy or MSE): your module gives the network, not a training
# function. A module whose every op has a ckpt layer (`Conv2d`, `Linear`,
# `BatchNorm2d`, `Dropout`, ReLU/Tanh, max/avg pooling, `flatten`, residual
# additions, ...) trains on ckpt's own fused kernels, as the built-in models
# do; any other falls back to TorchScript, with a warning naming the op.
#
# Run it as a script (`python examples/pbt_from_python.py`) or as the notebook
# beside it (`examples/pbt_from_python.ipynb`); ckpt's binaries are found
# through `CKPT_BIN`, `PATH` or the checkout's `build/bin`. The
# `CKPT_EXAMPLE_*` environment variables make the run smaller (CI runs it with
# 4 members and a few dozen steps).

# %%
import gzip
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import ckpt_client as ckpt

# %% [markdown]
# ## Your model
#
# An ordinary `nn.Module`. ckpt traces it with `torch.fx` and trains the same
# function under the module's own parameter names, so the states it keeps
# load back into this class with `load_state_dict(strict=True)`.

# %%
class LeNet5(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)

# %% [markdown]
# ## Your data, as NumPy arrays
#
# Fashion-MNIST read from its IDX files (Debian's `dataset-fashion-mnist`
# installs them in `/usr/share/datasets/fashion-mnist`): uint8 images
# `[N, 1, 28, 28]` and int64 labels. The last 10,000 training images are the
# validation split PBT ranks members on; the test split is scored once at the
# end. ckpt writes the arrays once into its store (the file is named by their
# content hash, so a rerun reuses it) and normalizes the inputs with the
# training split's mean and standard deviation.

# %%
FASHION_MNIST = os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist")


def read_idx(name):
    with gzip.open(os.path.join(FASHION_MNIST, name), "rb") as f:
        data = f.read()
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


images = read_idx("train-images-idx3-ubyte.gz")[:, None]  # [60000, 1, 28, 28] uint8
labels = read_idx("train-labels-idx1-ubyte.gz").astype(np.int64)
x_test = read_idx("t10k-images-idx3-ubyte.gz")[:, None]
y_test = read_idx("t10k-labels-idx1-ubyte.gz").astype(np.int64)
x_train, y_train = images[:-10000], labels[:-10000]
x_val, y_val = images[-10000:], labels[-10000:]
print(f"train {x_train.shape}, val {x_val.shape}, test {x_test.shape}, {x_train.dtype}")

# %% [markdown]
# ## The population
#
# The seed workload: 30 members, 4 intervals of 100 steps of batch 64, PBT
# between intervals (the bottom quarter copy a top-quarter member's weights
# and hyperparameters, then perturb them), each member scored on 2,000
# validation images after every interval.

# %%
POPULATION = int(os.environ.get("CKPT_EXAMPLE_POPULATION", 30))
INTERVALS = int(os.environ.get("CKPT_EXAMPLE_INTERVALS", 4))
STEPS = int(os.environ.get("CKPT_EXAMPLE_STEPS", 100))

experiment = ckpt.Experiment(
    model=LeNet5(),
    data={"train": (x_train, y_train), "val": (x_val, y_val), "test": (x_test, y_test)},
    search_space={
        "lr": ckpt.loguniform(1e-3, 0.2),
        "momentum": ckpt.uniform(0.5, 0.99),
        "weight_decay": ckpt.loguniform(1e-6, 1e-2),
    },
    policy="pbt",
    population=POPULATION,
    intervals=INTERVALS,
    steps_per_interval=STEPS,
    batch_size=64,
    eval_size=2000,
)

# %% [markdown]
# `run()` starts `ckpt-scheduler run` on a local store (`$CKPT_STORE`, else
# `./ckpt-store`) and shows its progress. Interrupt it (Ctrl-C, or the
# notebook's stop button) and run the cell again: it resumes where it stopped.
# Running it again after it finished just reads the result.

# %%
result = experiment.run()

# %% [markdown]
# ## The result
#
# One row per member, best validation accuracy first, hyperparameters as
# `config/<name>` columns (the head's values: PBT changed them as it went).

# %%
result.members

# %% [markdown]
# Every member's validation accuracy and hyperparameters over the training
# steps; an `x` marks where a member was replaced by a copy of a better one
# (on the donor's score and the new hyperparameters).

# %%
result.plot()

# %% [markdown]
# The best member's ancestry: which members it was copied from, at which step.

# %%
result.lineage(result.best()["member"].iloc[0])

# %% [markdown]
# ## The best member as your own module
#
# `best_module()` is a copy of the module you gave, with the best member's
# weights loaded strictly. `result.normalize` feeds it the raw images as ckpt
# did in training (the training split's mean and standard deviation), so the
# accuracy PyTorch computes here is the one ckpt reported.

# %%
model = result.best_module()
with torch.no_grad():
    predicted = model(result.normalize(x_test)).argmax(1).numpy()
test_accuracy = float((predicted == y_test).mean())
best = result.best().iloc[0]
print(f"test accuracy of {best['member']} in PyTorch: {test_accuracy:.4f} "
      f"(ckpt's own evaluation: {best['test_accuracy']:.4f})")

# %% [markdown]
# Run as a script, the table and the figure the notebook shows inline go to
# the terminal and to `pbt.png`.

# %%
if "get_ipython" not in globals():
    print(result.members.to_string())
    result.plot().savefig("pbt.png")
    print("wrote pbt.png")
