"""An experiment defined from Python values: ``Experiment(model, data,
search_space, ...)``, written as ckpt's experiment TOML (``to_toml()``) and
read back from one (``Experiment.from_toml(path)``).

Every argument is a key of the experiment file (README "Running your own
experiment", ``records/include/ckpt/records/config.h``); None leaves the key
out, so the scheduler's default holds. The file is checked by the scheduler
itself (``ckpt-scheduler check``), and its error, naming the key and line, is
raised as an ArgumentError naming the Python argument and its value
(``search_space['lr'] = loguniform(0.1, 0.001): max must not be below min``).
Only what the file cannot hold is checked here: argument types that have no
TOML form, and the arrays (rows of x and y, dtypes, labels).

What it does not do: ckpt trains supervised models with its own training
loop (its optimizers, losses and metrics); a Python training function is not
run.
"""

import copy
import hashlib
import json
import numbers
import os
import re
import shutil
import sys

from .client import CkptError
from .data import IDX_DATASETS, DataFile, TensorFile, as_splits

__all__ = ["ArgumentError", "Dim", "Experiment", "Policy", "choice", "loguniform",
           "pbt", "random_search", "successive_halving", "uniform", "default_store"]

BUILTIN_MODELS = ("lenet5", "resnet20")
_TORCHSCRIPT = "torchscript:"


class ArgumentError(CkptError, ValueError):
    """Bad input: ``argument`` (the Python argument, e.g. "search_space['lr']"),
    ``value`` (what was given) and ``why``. A ValueError and a CkptError with
    code "InvalidArgument"."""

    def __init__(self, argument, value, why):
        self.argument = argument
        self.value = value
        self.why = why
        super().__init__("InvalidArgument", f"{argument} = {_short(value)}: {why}")


def _brief(value):
    """repr, with modules and arrays described rather than printed."""
    if "torch" in sys.modules and isinstance(value, sys.modules["torch"].nn.Module):
        return f"<{type(value).__name__} module>"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        shape = "x".join(str(d) for d in value.shape) or "scalar"
        return f"<{type(value).__module__.split('.')[0]} array {shape} {value.dtype}>"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_brief(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_brief(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list) and len(value) <= 16:
        return "[" + ", ".join(_brief(v) for v in value) + "]"
    return repr(value)


def _short(value, limit=160):
    text = _brief(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def default_store():
    """``$CKPT_STORE``, else ``ckpt-store`` in the working directory."""
    return os.path.abspath(os.environ.get("CKPT_STORE") or "ckpt-store")


# ---- search-space kinds ------------------------------------------------------


class Dim:
    """One hyperparameter's range: ``[search_space.NAME]`` of the file.
    ``kind``: "log_uniform", "uniform" or "choice"."""

    def __init__(self, kind, low=None, high=None, values=None):
        self.kind = kind
        self.low = low
        self.high = high
        self.values = values

    def table(self):
        if self.kind == "choice":
            return {"type": "choice", "values": self.values}
        return {"type": self.kind, "min": self.low, "max": self.high}

    def __eq__(self, other):
        return isinstance(other, Dim) and self.table() == other.table()

    def __repr__(self):
        if self.kind == "choice":
            return f"choice({self.values!r})"
        name = {"log_uniform": "loguniform"}.get(self.kind, self.kind)
        return f"{name}({self.low!r}, {self.high!r})"


def loguniform(low, high):
    """Drawn uniformly in log space from [low, high] (0 < low <= high)."""
    return Dim("log_uniform", low, high)


def uniform(low, high):
    """Drawn uniformly from [low, high]."""
    return Dim("uniform", low, high)


def choice(values):
    """One of ``values`` (numbers)."""
    return Dim("choice", values=list(values) if isinstance(values, (list, tuple)) else values)


# ---- policies ----------------------------------------------------------------

_POLICY_KEYS = ("kind", "mode", "quantile", "perturb", "resample_probability",
                "ready_intervals", "eta", "min_intervals")
_POLICY_NAMES = {"pbt": {"kind": "pbt"}, "pbt_sync": {"kind": "pbt", "mode": "sync"},
                 "pbt_async": {"kind": "pbt", "mode": "async"}, "random": {"kind": "random"},
                 "random_search": {"kind": "random"},
                 "successive_halving": {"kind": "successive_halving"},
                 "halving": {"kind": "successive_halving"}}


class Policy:
    """The ``[policy]`` table: ``kind`` ("pbt", "random",
    "successive_halving") and its settings (None: the scheduler's default)."""

    def __init__(self, kind, **settings):
        self.settings = {"kind": kind}
        self.settings.update({k: v for k, v in settings.items() if v is not None})

    def table(self):
        order = [k for k in _POLICY_KEYS if k in self.settings]
        order += [k for k in self.settings if k not in _POLICY_KEYS]
        return {k: self.settings[k] for k in order}

    def __eq__(self, other):
        return isinstance(other, Policy) and self.table() == other.table()

    def __repr__(self):
        return "Policy(" + ", ".join(f"{k}={v!r}" for k, v in self.table().items()) + ")"


def pbt(mode=None, quantile=None, perturb=None, resample_probability=None, ready_intervals=None):
    """Population-based training; ``mode`` "sync" (generations) or "async"."""
    return Policy("pbt", mode=mode, quantile=quantile,
                  perturb=list(perturb) if perturb is not None else None,
                  resample_probability=resample_probability, ready_intervals=ready_intervals)


def random_search(mode=None):
    """Every member keeps its sampled hyperparameters; no exploit."""
    return Policy("random", mode=mode)


def successive_halving(eta=None, min_intervals=None, mode=None):
    """Keep the top 1/eta at each rung, the first after ``min_intervals``."""
    return Policy("successive_halving", eta=eta, min_intervals=min_intervals, mode=mode)


def _as_policy(policy):
    if policy is None or isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        return Policy(**_POLICY_NAMES.get(policy, {"kind": policy}))
    if isinstance(policy, dict):
        settings = dict(policy)
        kind = settings.pop("kind", "pbt")
        return Policy(kind, **settings)
    raise ArgumentError("policy", policy, "must be 'pbt', 'pbt_async', 'random', "
                        "'successive_halving', a Policy (pbt(...), ...) or a dict")


# ---- the TOML text -----------------------------------------------------------

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k):
    return k if _BARE_KEY.match(k) else json.dumps(k)


def _value(v):
    """A Python value as TOML; what has no TOML form raises TypeError."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if hasattr(v, "item") and not isinstance(v, (list, tuple, dict, str)):
        v = v.item()  # NumPy and torch scalars
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"{type(v).__name__} has no TOML form")


def _table_lines(header, table):
    lines = [header] if header else []
    for k, v in table.items():
        lines.append(f"{_key(k)} = {_value(v)}")
    return lines


# TOML key -> the Python argument it comes from.
_ARGUMENT_OF_KEY = {
    "name": "name", "seed": "seed", "store": "store", "metrics": "metrics",
    "model": "model", "model.spec": "model", "model.optimizer": "optimizer",
    "data": "data", "data.format": "data", "data.dataset": "data", "data.path": "data",
    "data.val_size": "val_size", "data.classes": "classes", "data.mean": "mean",
    "data.std": "std", "data.augment": "augment", "data.batch_size": "batch_size",
    "data.eval_size": "eval_size", "task": "loss", "task.loss": "loss", "task.metric": "metric",
    "population": "population", "population.size": "population",
    "population.steps_per_interval": "steps_per_interval",
    "population.intervals": "intervals", "population.target_metric": "target_metric",
    "population.max_wall_s": "max_wall_s", "search_space": "search_space",
    "hparams": "hparams", "policy": "policy", "devices": "devices",
    "supervision": "supervision", "workers": "workers",
}
_MESSAGE = re.compile(r"(?P<key>[A-Za-z_][\w\-]*(?:\[\d+\])?(?:\.[\w\-\[\]/]+)*) "
                      r"\((?P<origin>[^()]*?)(?: line (?P<line>\d+))?\): (?P<what>.*)", re.S)
_TENSOR = re.compile(r"^(?P<file>.+?\.(?:safetensors|npz)): "
                     r"(?P<split>train|val|test)\.(?P<xy>[xy]): ")


class Experiment:
    """An experiment from Python values (see the module's doc).

    model: an ``nn.Module`` (converted to a layer list when every op has
        one, else saved as TorchScript; ``ckpt_client.convert``), a built-in
        name ("lenet5", "resnet20"), a layer list (list of dicts, or its JSON
        text), or a TorchScript file (a path, or "torchscript:PATH").
    data: ``(x, y)`` (the train split), ``{"train": (x, y), "val": ...,
        "test": ...}`` (NumPy or torch arrays), a tensor file's path
        (.safetensors, .npz), an IDX dataset name ("fashion-mnist",
        "mnist") or directory, or a DataFile.
    search_space: {name: loguniform(a, b) | uniform(a, b) | choice([...])}.
    hparams: {name: value}, fixed hyperparameters.
    policy: "pbt" (sync), "pbt_async", "random", "successive_halving", or
        pbt(...), random_search(...), successive_halving(...).
    population (default 8), intervals, steps_per_interval, target_metric,
        max_wall_s: ``[population]``. batch_size, eval_size, augment (["random_crop:4",
        "hflip"]), val_size, classes, mean, std: ``[data]``. optimizer
        ("sgd", "adam", "adamw"), loss, metric: ``[model]`` and ``[task]``.
    devices: "cpu", "auto", "cuda:N", a dict of ``[[devices]]`` keys
        ({"device": "cpu", "slots": 2}), or a list of those.
    supervision, workers: dicts of ``[supervision]`` and ``[workers]`` keys.
    name: the experiment's name; default: the model's and a hash of the
        file, so the same definition finds its own run again in a store.
    seed: default 0. metrics: the scheduler's Prometheus address; default
        "" (none). store: the default store of run() and of the file.

    Construction checks what the file cannot hold (types, the arrays); the
    rest is the scheduler's (``check()``, ``run()``, ``submit()``).
    """

    def __init__(self, model, data, search_space=None, *, name=None, hparams=None,
                 policy=None, population=8, intervals=None, steps_per_interval=None,
                 batch_size=None, eval_size=None, optimizer=None, loss=None, metric=None,
                 augment=None, val_size=None, classes=None, mean=None, std=None,
                 target_metric=None, max_wall_s=None, devices=None, supervision=None,
                 workers=None, seed=0, metrics="", store=None):
        self.model = model
        self.search_space = dict(search_space or {})
        for k, v in self.search_space.items():
            if not isinstance(k, str):
                raise ArgumentError("search_space", k, "names must be strings")
            if not isinstance(v, Dim):
                raise ArgumentError(f"search_space[{k!r}]", v,
                                    "is not a range: give loguniform(a, b), uniform(a, b) or "
                                    "choice([...]); a fixed value goes in hparams=")
        self.hparams = dict(hparams or {})
        self.policy = _as_policy(policy)
        self.devices = devices
        self.supervision = dict(supervision) if supervision is not None else None
        self.workers = dict(workers) if workers is not None else None
        self.name, self.seed, self.metrics, self.store = name, seed, metrics, store
        self.population, self.intervals = population, intervals
        self.steps_per_interval, self.target_metric = steps_per_interval, target_metric
        self.max_wall_s, self.batch_size, self.eval_size = max_wall_s, batch_size, eval_size
        self.optimizer, self.loss, self.metric = optimizer, loss, metric
        self.augment = list(augment) if isinstance(augment, (list, tuple)) else augment
        self.val_size, self.classes, self.mean, self.std = val_size, classes, mean, std
        self.converted = None  # convert.ConvertedModel of an nn.Module, once written
        self._data = None  # TensorFile or DataFile
        self.data = data
        splits = self._splits = as_splits(data)
        if splits is not None:
            known = int(classes) if isinstance(classes, numbers.Integral) else None
            self._data = TensorFile(splits, "data", known)
        elif isinstance(data, DataFile):
            self._data = data
        elif isinstance(data, (str, os.PathLike)):
            self._data = DataFile.of(data)
        else:
            raise ArgumentError("data", data, "must be (x, y), a dict of splits {'train': (x, y), "
                                "...}, a tensor file's path, or an IDX dataset name "
                                f"({', '.join(IDX_DATASETS)})")
        self._device_tables()  # types only; the values are the scheduler's to check
        if not self.is_module() and not isinstance(model, (str, os.PathLike, list, dict)):
            raise ArgumentError("model", model, "must be an nn.Module, a built-in name "
                                f"({', '.join(BUILTIN_MODELS)}), a layer list, or a TorchScript "
                                "file's path")

    # ---- the model ----

    def is_module(self):
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(self.model, torch.nn.Module)

    def module(self):
        """The user's nn.Module, or None."""
        return self.model if self.is_module() else None

    def input_shape(self):
        if isinstance(self._data, TensorFile):
            for name, a, _ in self._data.tensors:
                if name == "train.x":
                    return tuple(a.shape[1:])
        shape = self._data.input_shape()
        if shape is None:
            raise ArgumentError("data", self.data, "its train.x could not be read to learn the "
                                "input shape the model is converted for")
        return shape

    def _model_spec(self, model_dir):
        m = self.model
        if self.is_module():
            from .convert import convert_module
            shape = self.input_shape()
            try:
                self.converted = convert_module(m, shape, model_dir)
            except ValueError as e:
                raise ArgumentError("model", m, f"{e} (the data's samples are "
                                    f"{list(shape)})") from None
            self._check_outputs(shape)
            return self.converted.spec
        if isinstance(m, (list, dict)):
            return json.dumps(m, separators=(",", ":"))
        text = os.fspath(m)
        if text in BUILTIN_MODELS or text.startswith(_TORCHSCRIPT) or text.lstrip()[:1] in "[{":
            return text
        if text.endswith((".pt", ".pth", ".ts", ".zip")) or os.sep in text:
            return _TORCHSCRIPT + os.path.abspath(os.path.expanduser(text))
        return text  # the scheduler names the built-ins it knows

    def _outputs_wanted(self):
        """The outputs the data asks of the model: its classes, or the width
        of its float targets; None when only the scheduler can tell."""
        if isinstance(self._data, DataFile):
            return 10 if self._data.format in (None, "idx") else None
        ys = [a for name, a, dtype in self._data.tensors if name.endswith(".y")]
        if ys[0].dtype.kind == "f":
            return 1 if ys[0].ndim == 1 else int(ys[0].shape[1])
        if isinstance(self.classes, numbers.Integral) and self.classes > 0:
            return int(self.classes)
        return 1 + max(int(y.max()) for y in ys if y.size)

    def _check_outputs(self, shape):
        """The user's module, run once on zeros: its output size against the
        data's classes or targets (the module is a Python object, which the
        file cannot hold; the scheduler would learn it only when a worker
        builds the model, after the experiment was created)."""
        import torch
        wanted = self._outputs_wanted()
        if wanted is None:
            return
        was_training = self.model.training
        try:
            self.model.eval()
            with torch.no_grad():
                out = self.model(torch.zeros(2, *shape))
        except Exception:
            return  # convert_module ran it: a failure here is the worker's to report
        finally:
            self.model.train(was_training)
        got = int(out.shape[-1]) if out.dim() > 1 else 1
        if got != wanted:
            raise ArgumentError("model", self.model, f"outputs {got} values a sample, but the "
                                f"data has {wanted} {self._outputs_kind()}")

    def _outputs_kind(self):
        if isinstance(self._data, DataFile):
            return "classes"
        ys = [a for name, a, dtype in self._data.tensors if name.endswith(".y")]
        return "targets" if ys[0].dtype.kind == "f" else "classes"

    def _model_label(self):
        if self.is_module():
            return type(self.model).__name__.lower()
        if isinstance(self.model, str) and self.model in BUILTIN_MODELS:
            return self.model
        return "model"

    def _device_tables(self):
        d = self.devices
        if d is None:
            return None
        items = d if isinstance(d, (list, tuple)) else [d]
        out = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                out.append({"device": item})
            elif isinstance(item, dict):
                out.append(dict(item))
            else:
                raise ArgumentError("devices", d, f"entry {i} must be a device name ('cpu', "
                                    "'auto', 'cuda:N') or a dict of [[devices]] keys")
        return out

    # ---- the file ----

    def _tables(self, model_spec, data_table):
        """The file's tables in the scheduler's order: (header, {key: value})."""
        def keep(pairs):
            return {k: v for k, v in pairs if v is not None}
        data = dict(data_table)
        data.update(keep([("val_size", self.val_size), ("classes", self.classes),
                          ("mean", self.mean), ("std", self.std), ("augment", self.augment),
                          ("batch_size", self.batch_size), ("eval_size", self.eval_size)]))
        tables = [
            ("", keep([("seed", self.seed), ("store", self.store), ("metrics", self.metrics)])),
            ("[model]", keep([("spec", model_spec), ("optimizer", self.optimizer)])),
            ("[data]", data),
            ("[task]", keep([("loss", self.loss), ("metric", self.metric)])),
            ("[population]", keep([("size", self.population),
                                   ("steps_per_interval", self.steps_per_interval),
                                   ("intervals", self.intervals),
                                   ("target_metric", self.target_metric),
                                   ("max_wall_s", self.max_wall_s)])),
        ]
        for name, dim in self.search_space.items():
            tables.append((f"[search_space.{_key(name)}]", dim.table()))
        tables.append(("[hparams]", self.hparams))
        tables.append(("[policy]", self.policy.table() if self.policy else {}))
        for d in self._device_tables() or []:
            first = ["device", "count", "slots", "fusion", "fusion_width", "intra_op_threads"]
            tables.append(("[[devices]]", {k: d[k] for k in first + sorted(d) if k in d}))
        tables.append(("[supervision]", self.supervision or {}))
        tables.append(("[workers]", self.workers or {}))
        return tables

    def _render(self, model_spec, data_table):
        lines = []
        for header, table in self._tables(model_spec, data_table):
            if header and not table and header != "[[devices]]":
                continue
            try:
                body = _table_lines(header, table)
            except TypeError as e:
                raise self._type_error(header, table, e) from None
            lines.extend(body)
            if header:
                lines.append("")
        body = "\n".join(lines).rstrip("\n") + "\n"
        name = self.name
        if name is None:
            digest = hashlib.sha256(body.encode()).hexdigest()[:10]
            name = f"{self._model_label()}-{digest}"
        try:
            return f"name = {_value(name)}\n" + body
        except TypeError as e:
            raise ArgumentError("name", name, str(e)) from None

    def _type_error(self, header, table, e):
        for k, v in table.items():
            try:
                _value(v)
            except TypeError:
                key = header.strip("[]")
                full = f"{key}.{k}" if key else k
                argument, value = self._argument_of(full)
                return ArgumentError(argument, value, f"{e} (the experiment file's {full})")
        return ArgumentError(header, table, str(e))

    def _materialize(self, data_dir, model_dir):
        """The file's text, with the arrays written into ``data_dir`` and a
        TorchScript fallback into ``model_dir``; returns (text, paths this
        call created, for undoing)."""
        created = []
        if isinstance(self._data, TensorFile):
            created += _make_dirs(data_dir)
            path, new = self._data.write(data_dir)
            if new:
                created.append(path)
            data_table = {"format": "safetensors", "path": path}
        else:
            data_table = self._data.table()
        try:
            if self.is_module():
                created += _make_dirs(model_dir)
                before = set(os.listdir(model_dir))
                spec = self._model_spec(model_dir)
                created += [os.path.join(model_dir, f) for f in os.listdir(model_dir)
                            if f not in before]
            else:
                spec = self._model_spec(model_dir)
            return self._render(spec, data_table), created
        except BaseException:
            _undo(created)
            raise

    def to_toml(self, store=None):
        """The experiment file's text. Arrays are written into
        ``<store>/data`` and an nn.Module that needs TorchScript into
        ``<store>/models`` (default store: default_store())."""
        store = os.path.abspath(store or self.store or default_store())
        return self._materialize(os.path.join(store, "data"), os.path.join(store, "models"))[0]

    @classmethod
    def from_toml(cls, path):
        """An Experiment of an experiment file; ``to_toml()`` gives its keys
        back. The model stays as the file names it (a built-in name,
        "torchscript:PATH" or the layer list's JSON text)."""
        import tomllib
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ArgumentError("path", path, str(e)) from None
        doc = copy.deepcopy(doc)
        model = doc.pop("model", {})
        spec = model.pop("spec", "lenet5")
        data = doc.pop("data", {})
        task = doc.pop("task", {})
        population = doc.pop("population", {})
        kwargs = {k: doc.pop(k) for k in ("name", "seed", "store") if k in doc}
        kwargs["metrics"] = doc.pop("metrics", None)
        kwargs["seed"] = kwargs.get("seed")
        file = DataFile(data.pop("path", None), data.pop("format", None), data.pop("dataset", None))
        for k in ("val_size", "classes", "mean", "std", "augment", "batch_size", "eval_size"):
            kwargs[k] = data.pop(k, None)
        kwargs.update(optimizer=model.pop("optimizer", None), loss=task.pop("loss", None),
                      metric=task.pop("metric", None), population=population.pop("size", None))
        for k in ("steps_per_interval", "intervals", "target_metric", "max_wall_s"):
            kwargs[k] = population.pop(k, None)
        space = {}
        for name, t in doc.pop("search_space", {}).items():
            space[name] = (Dim("choice", values=t.get("values")) if t.get("type") == "choice"
                           else Dim(t.get("type"), t.get("min"), t.get("max")))
        kwargs["hparams"] = doc.pop("hparams", None)
        policy = doc.pop("policy", None)
        kwargs["policy"] = Policy(policy.pop("kind", "pbt"), **policy) if policy else None
        kwargs["devices"] = doc.pop("devices", None)
        kwargs["supervision"] = doc.pop("supervision", None)
        kwargs["workers"] = doc.pop("workers", None)
        left = [k for k in doc] + [f"model.{k}" for k in model] + [f"data.{k}" for k in data]
        left += [f"task.{k}" for k in task] + [f"population.{k}" for k in population]
        if left:
            raise ArgumentError("path", path, f"key {left[0]} is not an experiment file's key")
        return cls(spec, file, space, **kwargs)

    # ---- the scheduler's check ----

    def _argument_of(self, key):
        """(Python argument, value) for a key of the file."""
        if key.startswith("search_space."):
            rest = key[len("search_space."):]
            head, _, tail = rest.rpartition(".")
            name = head if tail in ("type", "min", "max", "min/max", "values") and head else rest
            name = name.strip('"')
            return f"search_space[{name!r}]", self.search_space.get(name)
        if key.startswith("hparams."):
            name = key[len("hparams."):]
            return f"hparams[{name!r}]", self.hparams.get(name)
        if key.startswith("devices["):
            return "devices", self.devices
        for table, attr in (("supervision", self.supervision), ("workers", self.workers)):
            if key.startswith(table + "."):
                name = key[len(table) + 1:]
                return f"{table}[{name!r}]", (attr or {}).get(name)
        if key.startswith("policy."):
            return "policy", self.policy
        argument = _ARGUMENT_OF_KEY.get(key, key.split(".")[0])
        value = self.data if argument == "data" else getattr(self, argument, None)
        if argument == "model" and self.is_module() and self.converted is not None:
            value = self.model
        return argument, value

    def error_of(self, message):
        """The scheduler's error ``message`` (from ``check``, ``run`` or a
        service's submit) as an ArgumentError naming the Python argument;
        a CkptError when no key is named."""
        text = message.strip()
        m = _MESSAGE.search(text)
        if m is None:
            return CkptError("InvalidArgument", text)
        key, what = m.group("key"), m.group("what").strip()
        argument, value = self._argument_of(key)
        if argument == "data" and isinstance(self._data, TensorFile):
            t = _TENSOR.match(what)
            if t is not None:
                argument = f"data[{t.group('split')!r}]"
                value = self._splits.get(t.group("split"), value)
                what = f"{t.group('xy')}: {what[t.end():]}"
            else:  # the file is ours, not the user's: not named
                what = re.sub(r"^\S+\.safetensors: ", "", what)
        line = f" line {m.group('line')}" if m.group("line") else ""
        return ArgumentError(argument, value, f"{what} (the experiment file's {key}{line})")

    def check(self, store=None):
        """Asks ``ckpt-scheduler check`` about this experiment, as run()
        would start it in ``store``; raises ArgumentError naming the argument,
        else returns the file's text. Writes what to_toml() writes (kept: a
        later run reuses it) unless the check fails, when it is removed."""
        from .run import prepare
        return prepare(self, store)[0]

    def run(self, store=None, **options):
        """See ``ckpt_client.run.run``."""
        from .run import run
        return run(self, store=store, **options)

    def submit(self, client=None, **options):
        """See ``ckpt_client.run.submit``."""
        from .run import submit
        return submit(self, client=client, **options)

    def __repr__(self):
        model = _short(self.model, 60)
        return (f"Experiment(model={model}, data={_short(self.data, 60)}, "
                f"search_space={self.search_space!r}, population={self.population!r})")


def _make_dirs(path):
    """Creates ``path`` and its missing parents; returns those created."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.exists(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        os.mkdir(d)
    return list(reversed(missing))


def _undo(created):
    """Removes what a failed call created: files, then directories (deepest first)."""
    for p in reversed(created):
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)
        except OSError:
            pass
