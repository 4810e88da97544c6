"""ckpt from Python: define a population, run it, watch it and read it.

An experiment from Python values, run on an embedded store or submitted to
a running service, ending in a Result::

    from ckpt_client import Experiment, loguniform, uniform
    exp = Experiment(LeNet5(), {"train": (x, y), "test": (xt, yt)},
                     {"lr": loguniform(1e-3, 0.3), "momentum": uniform(0.8, 0.99)},
                     population=30, intervals=4, steps_per_interval=100)
    result = exp.run()              # ckpt-scheduler run; Ctrl-C stops, run() again resumes
    result.members                  # a DataFrame, best first
    model = result.best_module()    # your LeNet5 with the best member's weights

``exp.submit(socket)`` sends the same object to ``ckpt-scheduler serve``;
``exp.to_toml()`` and ``Experiment.from_toml(path)`` give and read the
experiment file. The service's control-socket client (standard library
only) is here too::

    from ckpt_client import Client, load_state_dict
    c = Client("/run/ckpt/control.sock")
    name = c.submit("examples/demo.toml")
    for progress in c.watch(name):
        print(progress["line"])
    best = c.results(name)          # a DataFrame when pandas is importable
    state = load_state_dict(f"{name}/m003", client=c)

``import ckpt_client`` imports neither torch nor NumPy: the Python API's
names load on first use (NumPy then), ``ckpt_client.convert`` and
``ckpt_client.models`` (ckpt's built-in models as modules) need torch.

What it does not do: ckpt trains supervised models with its own training
loop (its optimizers, losses and metrics on ckpt's own kernels or your
module as TorchScript); a Python training function is not run.
"""

from .client import CkptError, Client, DEFAULT_SOCKET, load_state_dict, results

# Name -> the submodule defining it, imported on first access (PEP 562), so
# that the protocol client stays importable with the standard library alone.
_LAZY = {
    "ArgumentError": "experiment", "Dim": "experiment", "Experiment": "experiment",
    "Policy": "experiment", "choice": "experiment", "default_store": "experiment",
    "loguniform": "experiment", "pbt": "experiment", "random_search": "experiment",
    "successive_halving": "experiment", "uniform": "experiment",
    "DataFile": "data", "write_tensor_file": "data",
    "parse_progress": "run",
    "Result": "result",
    "find_binary": "binaries",
}

__all__ = ["CkptError", "Client", "DEFAULT_SOCKET", "load_state_dict", "results"] + sorted(_LAZY)


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ckpt_client' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.2.0"
