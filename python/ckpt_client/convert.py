"""A user's ``nn.Module`` as a ckpt model spec: a layer list when it has one.

``convert_module(module, input_shape, model_dir)`` traces the module with
``torch.fx``. When every op has a layer-list equivalent (ckpt's model spec,
``worker/spec/include/ckpt/model/model_spec.h``) it returns that layer list, each
layer with state named by the module's own parameter prefix (``"conv1"``,
``"layer1.0.bn2"``), so that ckpt trains it fused on its own kernels and a
state it exports loads into the module with ``load_state_dict(strict=True)``.
The equivalents:

- ``Conv2d``, ``Linear``, ``BatchNorm2d``, ``Dropout``;
- ReLU and Tanh as modules or functions (``F.relu``, ``torch.relu``,
  ``torch.tanh``, ``x.relu()``);
- ``MaxPool2d`` / ``F.max_pool2d``, ``AvgPool2d`` / ``F.avg_pool2d``;
- ``torch.flatten(x, 1)`` / ``Flatten()`` / ``x.view(x.size(0), -1)``;
- ``AdaptiveAvgPool2d(1)`` / ``F.adaptive_avg_pool2d(x, 1)`` /
  ``x.mean((2, 3))`` as ``globalavgpool``;
- ``x + f(x)`` as ``residual``: an identity shortcut, or a 1x1 convolution
  without bias and a ``BatchNorm2d`` (a projection shortcut, torchvision's
  ``downsample``), which keep the module's names: ckpt's default
  ``<block>.shortcut.conv1`` / ``<block>.shortcut.bn1``, else given as the
  residual's ``"shortcut_names"`` (e.g. ``layer2.0.downsample.0`` / ``.1``).

The conversion is then checked: the layer list, run by a small PyTorch
interpreter of its semantics on the module's own weights, must compute what
``module(x)`` computes on a random batch, in eval mode and (dropout off) in
training mode, within float rounding (in float64). When an op has no
equivalent, or the check disagrees, the module is saved as TorchScript
(``torch.jit.script``, else ``torch.jit.trace`` on an example batch) under
``model_dir`` with the file's content hash in its name, and one
``ConversionWarning`` names the first op that kept it off the fused path.

``load_state(module, state)`` loads a state ckpt exported, of either kind,
into the module (strict), leaving out the optimizer's ``optim.*`` tensors.
"""

import copy
import hashlib
import io
import json
import math
import operator
import os
import tempfile
import warnings
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

try:
    import torch
    import torch.fx
    import torch.nn.functional as F
    from torch import nn
except ImportError as e:  # the package itself is stdlib-only
    raise ImportError("ckpt_client.convert needs PyTorch: pip install 'ckpt-client[torch]'") from e

__all__ = ["ConversionWarning", "ConvertedModel", "convert_module", "load_state"]

# ckpt's batchnorm2d defaults, which its conv1x1 shortcut's batchnorm always has.
_BN_EPS = 1e-5
_BN_MOMENTUM = 0.1
# The batch the module is traced and recorded on, and the one the check runs:
# different sizes, so that a batch size written into the module shows.
_RECORD_BATCH = 3
_CHECK_BATCH = 4


class ConversionWarning(UserWarning):
    """The module was not converted to a layer list: ckpt trains it as TorchScript."""


@dataclass
class ConvertedModel:
    """What ``convert_module`` made of a module.

    spec: the experiment TOML's ``[model] spec`` value: a JSON object text
        ``{"input": [C, H, W] or [F], "layers": [...]}``, or
        ``"torchscript:/abs/path.pt"``.
    fused: True when ``spec`` is a layer list (trains on ckpt's own kernels).
    reason: None when fused, else the first op that kept it off the fused path,
        e.g. ``"call_function torch.sigmoid at node 'sigmoid'"``.
    """

    spec: str
    fused: bool
    reason: Optional[str]


class _Unsupported(Exception):
    """An op (or a check) that keeps the module off the fused path; str() is the reason."""


class _Flow:
    """A tensor of the traced graph as ckpt sees it: the layers from the input to it.

    layers: a tuple of layer dicts; a node's layers extend its input's, sharing
        the dicts (by identity), so that two branches' common part is found.
    shape: PyTorch's shape without the batch dimension.
    flat: ckpt's view of it is [F] (after a flatten or a globalavgpool),
        even where PyTorch still has [C, 1, 1].
    """

    __slots__ = ("layers", "shape", "flat")

    def __init__(self, layers, shape, flat):
        self.layers = tuple(layers)
        self.shape = tuple(shape)
        self.flat = flat

    def then(self, layer: dict, shape, flat: Optional[bool] = None) -> "_Flow":
        """This tensor after `layer`, of PyTorch shape `shape`.

        The layer dict keeps ckpt's shape after it in private keys (_shape,
        _flat), so that a residual knows the shape its branches start from.
        """
        flat = self.flat if flat is None else flat
        layer["_shape"] = (math.prod(shape),) if flat else tuple(shape)
        layer["_flat"] = flat
        return _Flow(self.layers + (layer,), shape, flat)


class _Const:
    """A value computed from shapes and constants only (x.size(0), x.shape[1] * 2)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _qualified(target) -> str:
    try:
        name = torch.fx.node._get_qualified_name(target)
    except Exception:  # noqa: BLE001  (an odd callable: its repr names it)
        name = getattr(target, "__name__", repr(target))
    return name.replace("_operator.", "operator.")


def _describe(node: "torch.fx.Node", module: Optional[nn.Module] = None) -> str:
    if node.op == "call_function":
        return f"call_function {_qualified(node.target)} at node '{node.name}'"
    if node.op == "call_module":
        kind = type(module).__name__ if module is not None else "?"
        return f"call_module {kind} '{node.target}' at node '{node.name}'"
    if node.op == "call_method":
        return f"call_method {node.target} at node '{node.name}'"
    return f"{node.op} {node.target} at node '{node.name}'"


def _pair(value, what: str) -> int:
    """An int, or a pair of equal ints (ckpt's windows are square)."""
    if isinstance(value, (tuple, list)):
        if len(value) == 1:
            value = value[0]
        elif len(value) == 2 and value[0] == value[1]:
            value = value[0]
        else:
            raise _Unsupported(f"{what} = {tuple(value)} is not square")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Unsupported(f"{what} = {value!r} is not an integer")
    return value


def _window_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _shortcut_stride(shape, body_shape) -> int:
    """The 1x1 stride ckpt's parser gives a conv1x1 shortcut (ParseConv1x1Shortcut); 0 if none."""
    for s in range(1, shape[1] + 1):
        if (_window_out(shape[1], 1, s, 0) == body_shape[1]
                and _window_out(shape[2], 1, s, 0) == body_shape[2]):
            return s
    return 0


def _check_name(name: str) -> None:
    """ckpt's rule for a layer name (LayerReader::Name in worker/spec/src/model_spec.cc)."""
    ok = all(c.isascii() and (c.isalnum() or c in "_.") for c in name)
    if not name or not ok or name[0] == "." or name[-1] == "." or name.startswith("optim"):
        raise _Unsupported(f"the parameter prefix '{name}' is not a ckpt layer name "
                           "(letters, digits, '_' and '.', not starting with 'optim')")


def _shortcut_names(layer) -> Tuple[str, str]:
    """A conv1x1 residual's shortcut conv2d and batchnorm2d names, as ckpt's parser gives them."""
    return tuple(layer.get("shortcut_names") or
                 (layer["name"] + ".shortcut.conv1", layer["name"] + ".shortcut.bn1"))


def _state_names(layers) -> List[str]:
    """The state_dict names ckpt gives a layer list (ModelSpec::ModelTensors)."""
    out = []
    for layer in layers:
        kind, name = layer["type"], layer.get("name")
        if kind in ("conv2d", "linear"):
            out.append(name + ".weight")
            if layer.get("bias", True):
                out.append(name + ".bias")
        elif kind == "batchnorm2d":
            out += [name + s for s in (".weight", ".bias", ".running_mean", ".running_var",
                                       ".num_batches_tracked")]
        elif kind == "residual":
            out += _state_names(layer["layers"])
            if layer.get("shortcut") == "conv1x1":
                conv, bn = _shortcut_names(layer)
                out += [conv + ".weight"]
                out += [bn + s for s in (".weight", ".bias", ".running_mean", ".running_var",
                                         ".num_batches_tracked")]
    return out


def _layer_names(layers) -> List[str]:
    """Every name a layer list takes (stateful layers, residuals), as ckpt's parser counts them."""
    out = []
    for layer in layers:
        if "name" in layer:
            out.append(layer["name"])
        if layer["type"] == "residual":
            out += _layer_names(layer["layers"])
            if layer.get("shortcut") == "conv1x1":
                out += list(_shortcut_names(layer))
    return out


# ---------------------------------------------------------------------------
# Recording: every node's shape (tensors) or value (everything else) on a batch.

class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.seen: Dict["torch.fx.Node", object] = {}

    def run_node(self, n):
        out = super().run_node(n)
        # A tensor's shape now: an in-place op later may change its values, never its shape.
        self.seen[n] = ("tensor", tuple(out.shape)) if isinstance(out, torch.Tensor) else out
        return out


# ---------------------------------------------------------------------------
# The graph walk: each node becomes a _Flow (a tensor), a _Const, or an error.

_RELU_FUNCTIONS = {F.relu, torch.relu, torch.relu_, F.relu_}
_TANH_FUNCTIONS = {torch.tanh, F.tanh}
_ADD_FUNCTIONS = {operator.add, operator.iadd, torch.add}
_SHAPE_METHODS = {"size", "dim"}
_CONST_FUNCTIONS = {operator.getitem, operator.mul, operator.floordiv, operator.add,
                    operator.sub, operator.neg, getattr, int}


class _Converter:
    def __init__(self, gm: "torch.fx.GraphModule", seen, input_shape):
        self.gm = gm
        self.modules = dict(gm.named_modules())
        self.seen = seen
        self.input_shape = tuple(input_shape)
        self.env: Dict["torch.fx.Node", object] = {}
        self.called_stateful = set()
        # Names a residual may not take: those of the modules with state of their own
        # (the layers' names) and every name given so far.
        self.taken = {n for n, m in self.modules.items()
                      if any(True for _ in m.named_parameters(recurse=False))
                      or any(True for _ in m.named_buffers(recurse=False))}
        self.residuals = 0

    def run(self) -> List[dict]:
        result = None
        for node in self.gm.graph.nodes:
            if node.op == "output":
                result = self.output(node)
            else:
                self.env[node] = self.visit(node)
        return result

    # -- helpers --------------------------------------------------------------

    def arg(self, a):
        """A node's argument as a _Flow, or a plain Python value."""
        if isinstance(a, torch.fx.Node):
            v = self.env[a]
            return v.value if isinstance(v, _Const) else v
        if isinstance(a, (tuple, list)):
            return type(a)(self.arg(x) for x in a)
        return a

    def out_shape(self, node) -> Tuple[int, ...]:
        kind, shape = self.seen[node]
        return tuple(shape[1:])

    def flow_args(self, node) -> Tuple[list, dict]:
        args = [self.arg(a) for a in node.args]
        kwargs = {k: self.arg(v) for k, v in node.kwargs.items()}
        return args, kwargs

    def data_input(self, node, args) -> _Flow:
        """The op's tensor input (its first argument); no other argument may be a tensor."""
        if not args or not isinstance(args[0], _Flow):
            raise _Unsupported(_describe(node) + ": its first argument is not the data")
        for a in list(args[1:]) + list(node.kwargs.values()):
            if isinstance(a, torch.fx.Node) and isinstance(self.env[a], _Flow):
                raise _Unsupported(_describe(node) + ": takes two tensors")
        return args[0]

    @staticmethod
    def bind(args, kwargs, names, defaults):
        """Positional and keyword arguments onto `names` (after the data), with `defaults`."""
        out = dict(defaults)
        for name, value in zip(names, args[1:]):
            out[name] = value
        for k, v in kwargs.items():
            if k in ("input", "inplace"):
                continue
            if k not in names:
                raise _Unsupported(f"argument {k}")
            out[k] = v
        return out

    def spatial(self, node, flow: _Flow, what: str) -> None:
        if flow.flat or len(flow.shape) != 3:
            raise _Unsupported(f"{what} needs [C, H, W] input but its input is "
                               f"{list(flow.shape)} after a flatten")

    def stateful(self, node, name):
        if name in self.called_stateful:
            raise _Unsupported(_describe(node, self.modules.get(name)) +
                               ": the module is called twice (shared weights have no layer-list "
                               "equivalent)")
        self.called_stateful.add(name)
        _check_name(name)

    # -- nodes ----------------------------------------------------------------

    def visit(self, node):
        if node.op == "placeholder":
            if any(isinstance(v, _Flow) for v in self.env.values()):
                raise _Unsupported(f"forward takes a second input '{node.name}'")
            shape = self.out_shape(node)
            return _Flow((), shape, flat=len(shape) == 1)
        recorded = self.seen.get(node)
        is_tensor = isinstance(recorded, tuple) and len(recorded) == 2 and recorded[0] == "tensor"
        if not is_tensor:
            return self.const(node, recorded)
        if node.op == "call_module":
            return self.call_module(node)
        if node.op == "call_function":
            return self.call_function(node)
        if node.op == "call_method":
            return self.call_method(node)
        raise _Unsupported(_describe(node))

    def const(self, node, recorded):
        """A non-tensor node: a shape, or arithmetic on shapes and constants."""
        inputs = [a for a in node.all_input_nodes]
        flows = [a for a in inputs if isinstance(self.env[a], _Flow)]
        if node.op == "call_method" and node.target in _SHAPE_METHODS and len(flows) == 1:
            return _Const(recorded)
        if node.op == "call_function" and node.target is getattr and flows and \
                len(node.args) > 1 and node.args[1] == "shape":
            return _Const(recorded)
        if not flows and (node.op == "get_attr" or
                          (node.op == "call_function" and node.target in _CONST_FUNCTIONS)):
            return _Const(recorded)
        raise _Unsupported(_describe(node, self.modules.get(node.target)
                                     if node.op == "call_module" else None))

    def call_module(self, node) -> _Flow:
        m = self.modules[node.target]
        where = _describe(node, m)
        args, kwargs = self.flow_args(node)
        x = self.data_input(node, args)
        if len(args) != 1 or kwargs:
            raise _Unsupported(where + ": takes more than the data")
        shape = self.out_shape(node)
        try:
            if isinstance(m, nn.Conv2d) and type(m) in (nn.Conv2d,):
                return x.then(self.conv2d(node, m, x), shape)
            if type(m) is nn.Linear:
                return x.then(self.linear(node, m, x), shape)
            if type(m) is nn.BatchNorm2d:
                return x.then(self.batchnorm2d(node, m, x), shape)
            if type(m) is nn.Dropout:
                if not 0.0 <= m.p <= 0.999:
                    raise _Unsupported(f"p = {m.p} is outside ckpt's [0, 0.999]")
                return x.then({"type": "dropout", "p": float(m.p)}, shape)
            if type(m) is nn.ReLU:
                return x.then({"type": "relu"}, shape)
            if type(m) is nn.Tanh:
                return x.then({"type": "tanh"}, shape)
            if type(m) is nn.MaxPool2d:
                return self.maxpool2d(node, x, m.kernel_size, m.stride, m.padding, m.dilation,
                                      m.ceil_mode, m.return_indices)
            if type(m) is nn.AvgPool2d:
                return self.avgpool2d(node, x, m.kernel_size, m.stride, m.padding, m.ceil_mode,
                                      m.count_include_pad, m.divisor_override)
            if type(m) is nn.Flatten:
                return self.flatten(node, x, m.start_dim, m.end_dim)
            if type(m) is nn.AdaptiveAvgPool2d:
                return self.global_avg_pool(node, x, m.output_size)
            if type(m) is nn.Identity:
                return x
        except _Unsupported as e:
            raise _Unsupported(f"{where}: {e}") from None
        raise _Unsupported(where)

    def conv2d(self, node, m: nn.Conv2d, x: _Flow) -> dict:
        self.spatial(node, x, "conv2d")
        if m.groups != 1:
            raise _Unsupported(f"groups = {m.groups}")
        if _pair(m.dilation, "dilation") != 1:
            raise _Unsupported(f"dilation = {m.dilation}")
        if m.padding_mode != "zeros":
            raise _Unsupported(f"padding_mode = '{m.padding_mode}'")
        kernel = _pair(m.kernel_size, "kernel_size")
        stride = _pair(m.stride, "stride")
        padding = m.padding
        if padding == "valid":
            padding = 0
        elif padding == "same":
            if stride != 1 or kernel % 2 != 1:
                raise _Unsupported("padding = 'same' with an even kernel or a stride")
            padding = kernel // 2
        padding = _pair(padding, "padding")
        self.stateful(node, node.target)
        return {"type": "conv2d", "name": node.target, "in": m.in_channels,
                "out": m.out_channels, "kernel": kernel, "stride": stride, "padding": padding,
                "bias": m.bias is not None}

    def linear(self, node, m: nn.Linear, x: _Flow) -> dict:
        if len(x.shape) != 1:
            raise _Unsupported(f"a linear layer on a {list(x.shape)} activation (ckpt's acts on "
                               "[F], after a flatten)")
        self.stateful(node, node.target)
        return {"type": "linear", "name": node.target, "in": m.in_features,
                "out": m.out_features, "bias": m.bias is not None}

    def batchnorm2d(self, node, m: nn.BatchNorm2d, x: _Flow) -> dict:
        self.spatial(node, x, "batchnorm2d")
        if not m.affine:
            raise _Unsupported("affine = False")
        if not m.track_running_stats:
            raise _Unsupported("track_running_stats = False")
        if m.momentum is None:
            raise _Unsupported("momentum = None (a cumulative average)")
        if not (1e-30 <= m.eps <= 1.0) or not (0.0 <= m.momentum <= 1.0):
            raise _Unsupported(f"eps = {m.eps}, momentum = {m.momentum} out of ckpt's range")
        self.stateful(node, node.target)
        return {"type": "batchnorm2d", "name": node.target, "features": m.num_features,
                "eps": float(m.eps), "momentum": float(m.momentum)}

    def maxpool2d(self, node, x, kernel, stride, padding, dilation, ceil_mode, return_indices):
        self.spatial(node, x, "maxpool2d")
        if return_indices:
            raise _Unsupported("return_indices = True")
        return self.pool("maxpool2d", node, x, kernel, stride, padding, dilation, ceil_mode)

    def avgpool2d(self, node, x, kernel, stride, padding, ceil_mode, count_include_pad,
                  divisor_override):
        self.spatial(node, x, "avgpool2d")
        if not count_include_pad:
            raise _Unsupported("count_include_pad = False")
        if divisor_override is not None:
            raise _Unsupported(f"divisor_override = {divisor_override}")
        return self.pool("avgpool2d", node, x, kernel, stride, padding, 1, ceil_mode)

    def pool(self, kind, node, x, kernel, stride, padding, dilation, ceil_mode) -> _Flow:
        if ceil_mode:
            raise _Unsupported("ceil_mode = True")
        if _pair(dilation, "dilation") != 1:
            raise _Unsupported(f"dilation = {dilation}")
        k = _pair(kernel, "kernel_size")
        s = k if stride is None or (isinstance(stride, (list, tuple)) and not stride) \
            else _pair(stride, "stride")
        p = _pair(padding, "padding")
        return x.then({"type": kind, "kernel": k, "stride": s, "padding": p},
                      self.out_shape(node))

    def flatten(self, node, x: _Flow, start_dim, end_dim) -> _Flow:
        if start_dim != 1 or end_dim not in (-1, len(x.shape)):
            raise _Unsupported(f"flattens dimensions {start_dim}..{end_dim} (ckpt's flatten "
                               "keeps the batch: start_dim = 1)")
        return self.to_flat(node, x)

    def to_flat(self, node, x: _Flow) -> _Flow:
        n = math.prod(x.shape)
        if self.out_shape(node) != (n,):
            raise _Unsupported(f"reshapes {list(x.shape)} to {list(self.out_shape(node))}, "
                               "not a flatten that keeps the batch")
        if x.flat:  # already [F] to ckpt (a globalavgpool's [C, 1, 1]): nothing to do
            return _Flow(x.layers, (n,), True)
        return x.then({"type": "flatten"}, (n,), flat=True)

    def global_avg_pool(self, node, x: _Flow, output_size) -> _Flow:
        self.spatial(node, x, "globalavgpool")
        if output_size not in (1, (1, 1), [1, 1], (1,), [1]):
            raise _Unsupported(f"output_size = {output_size} (only 1 is globalavgpool)")
        return x.then({"type": "globalavgpool"}, self.out_shape(node), flat=True)

    def call_function(self, node) -> _Flow:
        f = node.target
        where = _describe(node)
        args, kwargs = self.flow_args(node)
        if f in _ADD_FUNCTIONS:
            return self.residual(node, args, kwargs)
        x = self.data_input(node, args)
        shape = self.out_shape(node)
        try:
            if f in _RELU_FUNCTIONS:
                self.bind(args, kwargs, ["inplace"], {})
                return x.then({"type": "relu"}, shape)
            if f in _TANH_FUNCTIONS:
                self.bind(args, kwargs, [], {})
                return x.then({"type": "tanh"}, shape)
            if f in (F.max_pool2d, torch.max_pool2d):
                a = self.bind(args, kwargs,
                              ["kernel_size", "stride", "padding", "dilation", "ceil_mode",
                               "return_indices"],
                              {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False,
                               "return_indices": False})
                return self.maxpool2d(node, x, a["kernel_size"], a["stride"], a["padding"],
                                      a["dilation"], a["ceil_mode"], a["return_indices"])
            if f in (F.avg_pool2d, torch._C._nn.avg_pool2d):
                a = self.bind(args, kwargs,
                              ["kernel_size", "stride", "padding", "ceil_mode",
                               "count_include_pad", "divisor_override"],
                              {"stride": None, "padding": 0, "ceil_mode": False,
                               "count_include_pad": True, "divisor_override": None})
                return self.avgpool2d(node, x, a["kernel_size"], a["stride"], a["padding"],
                                      a["ceil_mode"], a["count_include_pad"],
                                      a["divisor_override"])
            if f is torch.flatten:
                a = self.bind(args, kwargs, ["start_dim", "end_dim"],
                              {"start_dim": 0, "end_dim": -1})
                return self.flatten(node, x, a["start_dim"], a["end_dim"])
            if f is F.adaptive_avg_pool2d:
                a = self.bind(args, kwargs, ["output_size"], {})
                return self.global_avg_pool(node, x, a["output_size"])
            if f is torch.mean:
                a = self.bind(args, kwargs, ["dim", "keepdim"], {"dim": None, "keepdim": False})
                return self.mean(node, x, a["dim"], a["keepdim"])
        except _Unsupported as e:
            raise _Unsupported(f"{where}: {e}") from None
        raise _Unsupported(where)

    def call_method(self, node) -> _Flow:
        name = node.target
        where = _describe(node)
        args, kwargs = self.flow_args(node)
        if name in ("add", "add_", "__add__", "__iadd__"):
            return self.residual(node, args, kwargs)
        x = self.data_input(node, args)
        shape = self.out_shape(node)
        try:
            if name in ("relu", "relu_") and len(args) == 1 and not kwargs:
                return x.then({"type": "relu"}, shape)
            if name in ("tanh", "tanh_") and len(args) == 1 and not kwargs:
                return x.then({"type": "tanh"}, shape)
            if name in ("view", "reshape"):
                return self.to_flat(node, x)
            if name == "flatten":
                a = self.bind(args, kwargs, ["start_dim", "end_dim"],
                              {"start_dim": 0, "end_dim": -1})
                return self.flatten(node, x, a["start_dim"], a["end_dim"])
            if name == "mean":
                a = self.bind(args, kwargs, ["dim", "keepdim"], {"dim": None, "keepdim": False})
                return self.mean(node, x, a["dim"], a["keepdim"])
            if name == "contiguous" and len(args) == 1 and not kwargs:
                return x
        except _Unsupported as e:
            raise _Unsupported(f"{where}: {e}") from None
        raise _Unsupported(where)

    def mean(self, node, x: _Flow, dim, keepdim) -> _Flow:
        if isinstance(dim, int):
            dim = [dim]
        dims = sorted(d % 4 for d in dim) if isinstance(dim, (list, tuple)) else None
        if dims != [2, 3] or keepdim:
            raise _Unsupported(f"a mean over dim = {dim}, keepdim = {keepdim} (only the mean "
                               "over height and width is globalavgpool)")
        self.spatial(node, x, "globalavgpool")
        return x.then({"type": "globalavgpool"}, self.out_shape(node), flat=True)

    # -- residual -------------------------------------------------------------

    def residual(self, node, args, kwargs) -> _Flow:
        where = _describe(node)
        if len(args) != 2 or kwargs or not all(isinstance(a, _Flow) for a in args):
            raise _Unsupported(where + ": an addition that is not x + f(x)")
        a, b = args
        if a.shape != b.shape or a.flat != b.flat:
            raise _Unsupported(f"{where}: adds {list(a.shape)} and {list(b.shape)}")
        common = 0
        while (common < min(len(a.layers), len(b.layers))
               and a.layers[common] is b.layers[common]):
            common += 1
        base = _Flow(a.layers[:common], (), False)
        rest_a, rest_b = list(a.layers[common:]), list(b.layers[common:])
        if not rest_a and not rest_b:
            raise _Unsupported(f"{where}: adds a tensor to itself")
        # The shape the residual reads: the shape after the common layers.
        in_shape, in_flat = self.shape_after(base.layers)
        if in_flat and len(a.shape) != 1:
            raise _Unsupported(f"{where}: adds two [{', '.join(map(str, a.shape))}] activations "
                               "after a globalavgpool")
        if not rest_b or not rest_a:
            body = rest_a or rest_b
            name = self.residual_name(body)
            block = {"type": "residual", "name": name, "layers": body, "shortcut": "identity"}
        elif in_flat:
            raise _Unsupported(f"{where}: a residual after the flatten takes an identity "
                               "shortcut only")
        else:
            block = self.conv1x1_residual(where, in_shape, rest_a, rest_b)
        self.taken.update(_layer_names([block]))
        return base.then(block, a.shape, in_flat)

    def shape_after(self, layers) -> Tuple[Tuple[int, ...], bool]:
        """ckpt's activation shape after `layers` from the input (flat: [F])."""
        shape, flat = self.input_shape, len(self.input_shape) == 1
        for layer in layers:
            shape, flat = layer["_shape"], layer["_flat"]
        return shape, flat

    def residual_name(self, body) -> str:
        """The common module path of the body's layers when free, else res1, res2, ..."""
        names = [n for n in _layer_names(body)]
        prefix = os.path.commonprefix([n.split(".") for n in names]) if names else []
        candidate = ".".join(prefix)
        if candidate and candidate not in self.taken and not candidate.startswith("optim"):
            return candidate
        while True:
            self.residuals += 1
            candidate = f"res{self.residuals}"
            if candidate not in self.taken:
                return candidate

    def conv1x1_residual(self, where, in_shape, rest_a, rest_b) -> dict:
        for body, shortcut in ((rest_a, rest_b), (rest_b, rest_a)):
            if len(shortcut) != 2 or shortcut[0]["type"] != "conv2d" or \
                    shortcut[1]["type"] != "batchnorm2d":
                continue
            conv, bn = shortcut
            body_shape = body[-1]["_shape"]
            stride = _shortcut_stride(in_shape, body_shape)
            if (conv["kernel"], conv["padding"], conv["bias"]) != (1, 0, False) or \
                    conv["stride"] != stride or bn["eps"] != _BN_EPS or \
                    bn["momentum"] != _BN_MOMENTUM:
                raise _Unsupported(
                    f"{where}: the shortcut is not ckpt's conv1x1 (a 1x1 convolution without "
                    f"bias, stride {stride}, then a batchnorm2d with eps 1e-5, momentum 0.1)")
            conv_name, bn_name = conv["name"], bn["name"]
            block = conv_name[:-len(".shortcut.conv1")]
            if conv_name.endswith(".shortcut.conv1") and bn_name == block + ".shortcut.bn1" \
                    and block and block not in self.taken:
                # ckpt's default names for the shortcut: the block is all it needs.
                return {"type": "residual", "name": block, "layers": body,
                        "shortcut": "conv1x1"}
            # The module's own names (torchvision's downsample.0 / .1, a CIFAR
            # shortcut.0 / .1), given to the parser as "shortcut_names".
            return {"type": "residual", "name": self.residual_name(body + shortcut),
                    "layers": body, "shortcut": "conv1x1",
                    "shortcut_names": [conv_name, bn_name]}
        raise _Unsupported(f"{where}: neither branch is an identity or a conv1x1 + batchnorm2d "
                           "shortcut")

    def output(self, node) -> List[dict]:
        (value,) = node.args
        v = self.env.get(value) if isinstance(value, torch.fx.Node) else None
        if not isinstance(v, _Flow):
            raise _Unsupported("the module's output is not one tensor")
        if len(v.shape) != 1:
            raise _Unsupported(f"the module's output is [N, {', '.join(map(str, v.shape))}]; "
                               "ckpt's models end flat ([N, outputs])")
        if not v.layers:
            raise _Unsupported("the module returns its input")
        return list(v.layers)


def _clean(layers) -> List[dict]:
    """The layer list as JSON: private keys dropped, residual bodies cleaned."""
    out = []
    for layer in layers:
        d = {k: v for k, v in layer.items() if not k.startswith("_")}
        if d["type"] == "residual":
            d["layers"] = _clean(d["layers"])
        out.append(d)
    return out


# ---------------------------------------------------------------------------
# The layer list's semantics in PyTorch (worker/src/forward.cc, RunLayers).

def _batchnorm(x, state, name, eps, momentum, train):
    return F.batch_norm(x, state[name + ".running_mean"].clone(),
                        state[name + ".running_var"].clone(), state[name + ".weight"],
                        state[name + ".bias"], training=train, momentum=momentum, eps=eps)


def _run_layers(layers, state, x, train: bool):
    """What ckpt computes with `layers` on `state` (dropout as in eval: none)."""
    for layer in layers:
        kind, name = layer["type"], layer.get("name")
        if kind == "conv2d":
            x = F.conv2d(x, state[name + ".weight"],
                         state[name + ".bias"] if layer["bias"] else None,
                         stride=layer["stride"], padding=layer["padding"])
        elif kind == "linear":
            x = F.linear(x, state[name + ".weight"],
                         state[name + ".bias"] if layer["bias"] else None)
        elif kind == "relu":
            x = torch.relu(x)
        elif kind == "tanh":
            x = torch.tanh(x)
        elif kind == "maxpool2d":
            x = F.max_pool2d(x, layer["kernel"], layer["stride"], layer["padding"])
        elif kind == "avgpool2d":
            x = F.avg_pool2d(x, layer["kernel"], layer["stride"], layer["padding"])
        elif kind == "batchnorm2d":
            x = _batchnorm(x, state, name, layer["eps"], layer["momentum"], train)
        elif kind == "dropout":
            pass
        elif kind == "flatten":
            x = x.flatten(1)
        elif kind == "globalavgpool":
            x = x.mean((2, 3))
        elif kind == "residual":
            body = _run_layers(layer["layers"], state, x, train)
            if layer["shortcut"] == "conv1x1":
                stride = _shortcut_stride(tuple(x.shape[1:]), tuple(body.shape[1:]))
                conv, bn = _shortcut_names(layer)
                sc = F.conv2d(x, state[conv + ".weight"], None, stride=stride)
                sc = _batchnorm(sc, state, bn, _BN_EPS, _BN_MOMENTUM, train)
            else:
                sc = x
            x = body + sc
        else:
            raise AssertionError(kind)
    return x


def _agree(module: nn.Module, layers, x, train: bool) -> Optional[str]:
    """None when `layers` on the module's state computes module(x); else how they differ."""
    module.train(train)
    if train:  # dropout draws differ; with p = 0 both compute the same function
        for m in module.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
    state = module.state_dict()
    with torch.no_grad():
        ref = module(x)
        try:
            got = _run_layers(layers, state, x, train)
        except (KeyError, RuntimeError) as e:
            return f"the layer list does not run on the module's state: {e}"
    mode = "training" if train else "eval"
    if not isinstance(ref, torch.Tensor) or ref.shape != got.shape:
        return (f"the module's output in {mode} mode is not the layer list's "
                f"{list(got.shape)}")
    scale = max(1.0, float(ref.abs().max()))
    tol = (1e-9 if x.dtype == torch.float64 else 1e-4) * scale
    diff = float((ref - got).abs().max())
    if not diff <= tol:
        return (f"the layer list computes another function than the module in {mode} mode "
                f"(largest difference {diff:.3g} on a random batch)")
    return None


def _to_layers(module: nn.Module, input_shape) -> List[dict]:
    """The layer list of `module`, checked; raises _Unsupported with the reason."""
    params = list(module.parameters()) + list(module.buffers())
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        if t.is_floating_point() and t.dtype != torch.float32:
            raise _Unsupported(f"tensor {name} is {t.dtype}; ckpt trains float32")
    if not params:
        raise _Unsupported("the module has no parameters")
    work = copy.deepcopy(module).cpu()
    work.train()
    try:
        gm = torch.fx.symbolic_trace(work)
    except Exception as e:  # noqa: BLE001  (fx raises many kinds; the message says which)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _Unsupported(f"torch.fx cannot trace the module: {first}") from None
    gen = torch.Generator().manual_seed(0)
    recorder = _Recorder(gm)
    gm.eval()
    with torch.no_grad():
        try:
            recorder.run(torch.randn((_RECORD_BATCH,) + tuple(input_shape), generator=gen))
        except Exception as e:  # noqa: BLE001  (the user's forward: any error)
            raise ValueError(f"input_shape = {list(input_shape)}: {type(module).__name__} does "
                             f"not run on a batch of that shape: {e}") from None
    conv = _Converter(gm, recorder.seen, input_shape)
    layers = conv.run()
    expected = sorted(work.state_dict().keys())
    named = sorted(_state_names(layers))
    if named != expected:
        unused = sorted(set(expected) - set(named))
        raise _Unsupported(f"the module holds state its forward does not use through a layer: "
                           f"{', '.join(unused[:5])}" if unused else
                           f"the layer list's state names differ from the module's: {named}")
    names = _layer_names(layers)
    if len(names) != len(set(names)):
        raise _Unsupported("two layers would take the same name")
    # The check: the same function, in float64 (so float rounding is far below any real
    # difference), in eval mode and in training mode without dropout.
    x = torch.randn((_CHECK_BATCH,) + tuple(input_shape), generator=gen, dtype=torch.float64)
    for train in (False, True):
        try:
            why = _agree(copy.deepcopy(work).double(), layers, x, train)
        except Exception:  # noqa: BLE001  (a forward that needs float32: check in float32)
            try:
                why = _agree(copy.deepcopy(work), layers, x.float(), train)
            except Exception as e:  # noqa: BLE001
                why = f"the module fails on a random batch in the check: {e}"
        if why is not None:
            raise _Unsupported(why)
    return _clean(layers)


# ---------------------------------------------------------------------------
# TorchScript fallback.

def _save_torchscript(module: nn.Module, input_shape, model_dir: str) -> str:
    """Saves `module` as TorchScript in `model_dir`, named by its content hash; its path."""
    work = copy.deepcopy(module).cpu()
    work.train()
    try:
        scripted = torch.jit.script(work)
    except Exception as script_error:  # noqa: BLE001  (script raises many kinds)
        example = torch.randn((2,) + tuple(input_shape), generator=torch.Generator().manual_seed(0))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                scripted = torch.jit.trace(work, example, check_trace=False)
        except Exception as trace_error:  # noqa: BLE001
            raise ValueError(f"module {type(module).__name__}: neither torch.jit.script "
                             f"({script_error}) nor torch.jit.trace ({trace_error}) can save it "
                             "for ckpt") from None
        # A trace records the mode it ran in (batch norm, dropout): it must still compute
        # the module's function in eval mode, where ckpt scores it.
        with torch.no_grad():
            work.eval()
            scripted.eval()
            if not torch.allclose(work(example), scripted(example), rtol=1e-5, atol=1e-6):
                raise ValueError(
                    f"module {type(module).__name__}: torch.jit.script cannot compile it "
                    f"({str(script_error).strip().splitlines()[0]}) and its torch.jit.trace "
                    "computes another function in eval mode (a training-mode branch, batch "
                    "norm or dropout frozen into the trace); make it scriptable")
            scripted.train()
    # Saved to memory first: the archive's folder name inside the zip follows
    # the file's name, so the bytes hashed must not depend on a temporary name.
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    data = buffer.getvalue()
    model_dir = os.path.realpath(model_dir)
    path = os.path.join(model_dir,
                        f"{type(module).__name__}-{hashlib.sha256(data).hexdigest()[:16]}.pt")
    if os.path.isfile(path):
        return path  # the same bytes are there already: a rerun reuses them
    try:
        os.makedirs(model_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".convert-", suffix=".pt", dir=model_dir)
    except OSError as e:
        raise ValueError(f"model_dir {model_dir!r}: cannot write a model file there: {e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


# ---------------------------------------------------------------------------
# The interface.

def convert_module(module: nn.Module, input_shape: Sequence[int], model_dir: str) -> ConvertedModel:
    """The ckpt model spec of `module` for inputs of `input_shape` ([C, H, W] or [F]).

    A layer list when every op has an equivalent and the check agrees (``fused``
    True); else a TorchScript file saved under `model_dir` (created if needed;
    the name carries the content hash, so a rerun reuses the file), with one
    ConversionWarning naming the first op that kept it off the fused path
    (``reason``). The module itself is left as it was (mode and state).

    Raises ValueError naming the argument for a bad `input_shape` (also one the
    module does not run on), a `model_dir` that cannot be written (only when a
    file is needed), or a module that neither converts nor saves as TorchScript.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    shape = None
    if isinstance(input_shape, (list, tuple, torch.Size)) and \
            not any(isinstance(d, bool) for d in input_shape):
        try:
            shape = [operator.index(d) for d in input_shape]  # ints, NumPy's included
        except TypeError:
            pass
    if shape is None or len(shape) not in (1, 3) or min(shape) < 1:
        raise ValueError(f"input_shape = {input_shape!r}: must be [channels, height, width] or "
                         "[features], positive integers")
    try:
        layers = _to_layers(module, shape)
    except _Unsupported as e:
        reason = str(e)
    else:
        return ConvertedModel(json.dumps({"input": shape, "layers": layers}), True, None)
    path = _save_torchscript(module, shape, model_dir)
    warnings.warn(f"{type(module).__name__} is trained as TorchScript ({path}), not fused on "
                  f"ckpt's kernels: {reason}", ConversionWarning, stacklevel=2)
    return ConvertedModel("torchscript:" + path, False, reason)


def load_state(module: nn.Module, state: Mapping[str, "torch.Tensor"]) -> nn.Module:
    """Loads a state ckpt exported (a layer list's or a TorchScript model's) into `module`.

    `state` is a name -> tensor mapping (``safetensors.torch.load_file`` of a
    ``ckpt-tool export``, or ``ckpt_client.load_state_dict``). The optimizer's
    ``optim.*`` tensors are left out; the rest must match the module's
    ``state_dict`` exactly (``load_state_dict(strict=True)``: a missing or
    unexpected name, or a shape that differs, raises RuntimeError naming it).
    Returns `module`.
    """
    model_state = {k: v for k, v in state.items() if not k.startswith("optim.")}
    module.load_state_dict(model_state, strict=True)
    return module
