"""ckpt_client.convert: a user's nn.Module as a ckpt layer list, or TorchScript.

ConvertTest converts the models of the issue (the seed user's LeNet-5, a CIFAR
residual net, an MLP, BatchNorm and Dropout, an unsupported op) and checks the
layer lists against an independent reading of ckpt's model spec; RoundTripTest
trains converted models with the real binaries (`ckpt-scheduler run`), exports
the best member (`ckpt-tool export`), loads it into the user's module and
scores the module in PyTorch: its test accuracy equals the one ckpt reported,
which holds only if ckpt computed the module's function.

    CKPT_BIN=build/bin PYTHONPATH=python .venv/bin/python tests/python/convert_test.py -v
"""
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import warnings

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))  # tests/unittest_exit.py
sys.path.insert(0, os.path.join(ROOT, "examples"))  # make_dataset.py

from ckpt_client.convert import (ConversionWarning, ConvertedModel,  # noqa: E402
                                 convert_module, load_state)
from unittest_exit import main  # noqa: E402

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


# ---------------------------------------------------------------------------
# The users' models.

class LeNet5(nn.Module):
    """The seed user's class, as they wrote it."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.view(x.size(0), -1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class BasicBlock(nn.Module):
    """He et al.'s basic block; `ckpt_names` names the projection shortcut as ckpt's
    parser does (shortcut.conv1 / shortcut.bn1), else as most CIFAR code does
    (shortcut.0 / shortcut.1)."""

    def __init__(self, cin, cout, stride, ckpt_names=True):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            conv, bn = nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            if ckpt_names:
                self.shortcut = nn.Sequential(collections.OrderedDict(conv1=conv, bn1=bn))
            else:
                self.shortcut = nn.Sequential(conv, bn)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        return F.relu(out)


class CifarResNet(nn.Module):
    """A small CIFAR ResNet: a stem, two stages (the second halves the size), pooling."""

    def __init__(self, channels=3, width=8, classes=10, ckpt_names=True):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = nn.Sequential(BasicBlock(width, width, 1, ckpt_names),
                                    BasicBlock(width, width, 1, ckpt_names))
        self.layer2 = nn.Sequential(BasicBlock(width, 2 * width, 2, ckpt_names))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.pool(x), 1))


class DownsampleBlock(nn.Module):
    """torchvision's BasicBlock as users copy it: one ReLU module called twice, and a
    projection shortcut passed in as `downsample` (nn.Sequential(conv1x1, bn))."""

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet20(nn.Module):
    """A user-written CIFAR ResNet-(6n+2) (n = 3: ResNet-20) in torchvision's shape:
    three stages of `n` blocks, the second and third halving the size through a
    `downsample` shortcut."""

    def __init__(self, channels=3, width=16, classes=10, n=3, downsample_bias=False):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample_bias = downsample_bias
        self.layer1 = self._make_layer(width, n, 1)
        self.layer2 = self._make_layer(2 * width, n, 2)
        self.layer3 = self._make_layer(4 * width, n, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(4 * width, classes)

    def _make_layer(self, planes, blocks, stride):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, 1, stride, bias=self.downsample_bias),
                nn.BatchNorm2d(planes))
        layers = [DownsampleBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [DownsampleBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class MLP(nn.Module):
    def __init__(self, features=64, classes=10):
        super().__init__()
        self.hidden = nn.Linear(features, 32)
        self.act = nn.Tanh()
        self.block = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
        self.mid = nn.Linear(32, 16, bias=False)
        self.out = nn.Linear(16, classes)

    def forward(self, x):
        h = self.act(self.hidden(x))
        h = h + self.block(h)  # a residual on features
        return self.out(torch.relu(self.mid(h)))


class ConvBnDropout(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8, eps=1e-3, momentum=0.2),
            nn.ReLU(inplace=True), nn.AvgPool2d(2), nn.Dropout(0.25))
        self.flatten = nn.Flatten()
        self.head = nn.Sequential(nn.Linear(8 * 4 * 4, 32), nn.ReLU(), nn.Dropout(p=0.1),
                                  nn.Linear(32, classes))

    def forward(self, x):
        return self.head(self.flatten(self.features(x)))


class SigmoidNet(nn.Module):
    """LeNet-like on 8x8 inputs with a sigmoid: ckpt's layer list has none."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, classes)

    def forward(self, x):
        x = F.max_pool2d(torch.sigmoid(self.bn(self.conv(x))), 2)
        return self.fc(torch.flatten(x, 1))


class EvalOnlyScale(nn.Module):
    """Computes another function in eval mode than the one fx traces (in training mode)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        x = self.fc(x)
        if not self.training:
            x = x * 2
        return x


# ---------------------------------------------------------------------------
# An independent reading of ckpt's layer-list semantics (model_spec.h), for
# the checks: the state names a spec gives, and its forward pass.

def spec_layers(converted):
    doc = json.loads(converted.spec)
    return doc["input"], doc["layers"]


def spec_shortcut(l):
    """A conv1x1 residual's shortcut conv2d and batchnorm2d names (ckpt's default, or
    "shortcut_names")."""
    return l.get("shortcut_names", [l["name"] + ".shortcut.conv1", l["name"] + ".shortcut.bn1"])


def spec_state_names(layers):
    names = []
    for l in layers:
        if l["type"] in ("conv2d", "linear"):
            names.append(l["name"] + ".weight")
            if l.get("bias", True):
                names.append(l["name"] + ".bias")
        elif l["type"] == "batchnorm2d":
            names += [l["name"] + "." + s for s in
                      ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")]
        elif l["type"] == "residual":
            names += spec_state_names(l["layers"])
            if l.get("shortcut") == "conv1x1":
                conv, bn = spec_shortcut(l)
                names.append(conv + ".weight")
                names += [bn + "." + s for s in
                          ("weight", "bias", "running_mean", "running_var",
                           "num_batches_tracked")]
    return names


def spec_forward(layers, state, x):
    """Eval-mode forward of a layer list on a state dict."""
    for l in layers:
        t = l["type"]
        if t == "conv2d":
            x = F.conv2d(x, state[l["name"] + ".weight"], state.get(l["name"] + ".bias"),
                         l.get("stride", 1), l.get("padding", 0))
        elif t == "linear":
            x = F.linear(x, state[l["name"] + ".weight"], state.get(l["name"] + ".bias"))
        elif t == "batchnorm2d":
            n = l["name"]
            x = F.batch_norm(x, state[n + ".running_mean"], state[n + ".running_var"],
                             state[n + ".weight"], state[n + ".bias"], False, 0.0,
                             l.get("eps", 1e-5))
        elif t == "relu":
            x = F.relu(x)
        elif t == "tanh":
            x = torch.tanh(x)
        elif t == "maxpool2d":
            x = F.max_pool2d(x, l["kernel"], l.get("stride", l["kernel"]), l.get("padding", 0))
        elif t == "avgpool2d":
            x = F.avg_pool2d(x, l["kernel"], l.get("stride", l["kernel"]), l.get("padding", 0))
        elif t == "flatten":
            x = x.flatten(1)
        elif t == "globalavgpool":
            x = x.mean((2, 3))
        elif t == "residual":
            body = spec_forward(l["layers"], state, x)
            if l.get("shortcut") == "conv1x1":
                stride = x.shape[2] // body.shape[2]
                conv, n = spec_shortcut(l)
                sc = F.conv2d(x, state[conv + ".weight"], None, stride)
                sc = F.batch_norm(sc, state[n + ".running_mean"], state[n + ".running_var"],
                                  state[n + ".weight"], state[n + ".bias"], False, 0.0, 1e-5)
            else:
                sc = x
            x = body + sc
    return x


def randomize_batchnorm(module, seed=1):
    """Running statistics away from their initial 0 / 1, so that a wrong eps or
    a dropped batch norm shows in eval mode."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g))
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
            with torch.no_grad():
                m.weight.copy_(torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(torch.randn(m.bias.shape, generator=g))


class ConvertTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ckpt-convert-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        torch.manual_seed(0)

    def convert(self, module, shape):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = convert_module(module, shape, os.path.join(self.dir, "models"))
        return out, [w for w in caught if issubclass(w.category, ConversionWarning)]

    def assert_fused(self, module, shape):
        """Converts, checks the layer list's names and function; returns the layers."""
        out, caught = self.convert(module, shape)
        self.assertIsInstance(out, ConvertedModel)
        self.assertTrue(out.fused, out.reason)
        self.assertIsNone(out.reason)
        self.assertEqual(caught, [])
        self.assertFalse(os.path.exists(os.path.join(self.dir, "models")))
        input_shape, layers = spec_layers(out)
        self.assertEqual(input_shape, list(shape))
        # The module's own state_dict names, every one of them.
        self.assertEqual(sorted(spec_state_names(layers)), sorted(module.state_dict()))
        module.eval()
        x = torch.randn((5,) + tuple(shape), dtype=torch.float64)
        work = module.double()
        with torch.no_grad():
            want = work(x)
            got = spec_forward(layers, work.state_dict(), x)
        module.float()
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
        return layers

    def test_lenet5_is_the_builtin_layer_list_with_its_names(self):
        layers = self.assert_fused(LeNet5(), [1, 28, 28])
        self.assertEqual(layers, [
            {"type": "conv2d", "name": "conv1", "in": 1, "out": 6, "kernel": 5, "stride": 1,
             "padding": 2, "bias": True},
            {"type": "relu"},
            {"type": "maxpool2d", "kernel": 2, "stride": 2, "padding": 0},
            {"type": "conv2d", "name": "conv2", "in": 6, "out": 16, "kernel": 5, "stride": 1,
             "padding": 0, "bias": True},
            {"type": "relu"},
            {"type": "maxpool2d", "kernel": 2, "stride": 2, "padding": 0},
            {"type": "flatten"},
            {"type": "linear", "name": "fc1", "in": 400, "out": 120, "bias": True},
            {"type": "relu"},
            {"type": "linear", "name": "fc2", "in": 120, "out": 84, "bias": True},
            {"type": "relu"},
            {"type": "linear", "name": "fc3", "in": 84, "out": 10, "bias": True},
        ])

    def test_cifar_residual_net(self):
        module = CifarResNet()
        randomize_batchnorm(module)
        layers = self.assert_fused(module, [3, 16, 16])
        blocks = [l for l in layers if l["type"] == "residual"]
        self.assertEqual([(b["name"], b["shortcut"]) for b in blocks],
                         [("layer1.0", "identity"), ("layer1.1", "identity"),
                          ("layer2.0", "conv1x1")])
        self.assertEqual([l["name"] for l in blocks[2]["layers"] if "name" in l],
                         ["layer2.0.conv1", "layer2.0.bn1", "layer2.0.conv2", "layer2.0.bn2"])
        self.assertEqual(blocks[2]["layers"][0]["stride"], 2)
        self.assertEqual([l["type"] for l in layers[-3:]], ["relu", "globalavgpool", "linear"])

    def test_cifar_residual_net_with_its_own_shortcut_names(self):
        # nn.Sequential(conv, bn): shortcut.0 / shortcut.1, given as "shortcut_names".
        module = CifarResNet(ckpt_names=False)
        randomize_batchnorm(module)
        layers = self.assert_fused(module, [3, 16, 16])
        block = [l for l in layers if l["type"] == "residual"][2]
        self.assertEqual((block["name"], block["shortcut"], block["shortcut_names"]),
                         ("layer2.0", "conv1x1", ["layer2.0.shortcut.0", "layer2.0.shortcut.1"]))

    def test_resnet20_with_downsample_shortcuts(self):
        module = ResNet20()
        randomize_batchnorm(module)
        layers = self.assert_fused(module, [3, 32, 32])
        blocks = [l for l in layers if l["type"] == "residual"]
        self.assertEqual([b["name"] for b in blocks],
                         [f"layer{s}.{i}" for s in (1, 2, 3) for i in range(3)])
        self.assertEqual([(b["name"], b.get("shortcut_names")) for b in blocks
                          if b["shortcut"] == "conv1x1"],
                         [("layer2.0", ["layer2.0.downsample.0", "layer2.0.downsample.1"]),
                          ("layer3.0", ["layer3.0.downsample.0", "layer3.0.downsample.1"])])
        self.assertNotIn("shortcut_names", blocks[0])
        # The layer list's state, named as ckpt names it, loads into a fresh
        # module strictly and computes the same function there.
        state = {n: module.state_dict()[n] for n in spec_state_names(layers)}
        fresh = load_state(ResNet20(), state).eval()
        module.eval()
        x = torch.randn(2, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(fresh(x), module(x), rtol=0, atol=0)

    def test_a_downsample_with_a_bias_falls_back(self):
        # ckpt's conv1x1 shortcut has no bias: the name alone does not make it fuse.
        out, caught = self.convert(ResNet20(n=1, downsample_bias=True), [3, 16, 16])
        self.assertFalse(out.fused)
        self.assertEqual(len(caught), 1)
        self.assertIn("the shortcut is not ckpt's conv1x1", out.reason)
        self.assertTrue(os.path.isfile(out.spec[len("torchscript:"):]))

    def test_mlp(self):
        layers = self.assert_fused(MLP(), [64])
        self.assertEqual([(l["type"], l.get("name")) for l in layers],
                         [("linear", "hidden"), ("tanh", None), ("residual", "block"),
                          ("linear", "mid"), ("relu", None), ("linear", "out")])
        self.assertEqual(layers[2]["shortcut"], "identity")
        self.assertEqual([l.get("name") for l in layers[2]["layers"]],
                         ["block.0", None, "block.2"])
        self.assertFalse(layers[3]["bias"])

    def test_batchnorm_and_dropout(self):
        module = ConvBnDropout()
        randomize_batchnorm(module)
        module.train()
        layers = self.assert_fused(module, [1, 8, 8])
        self.assertEqual([l["type"] for l in layers],
                         ["conv2d", "batchnorm2d", "relu", "avgpool2d", "dropout", "flatten",
                          "linear", "relu", "dropout", "linear"])
        self.assertEqual((layers[1]["name"], layers[1]["eps"], layers[1]["momentum"]),
                         ("features.1", 1e-3, 0.2))
        self.assertEqual([l["p"] for l in layers if l["type"] == "dropout"], [0.25, 0.1])
        self.assertEqual(layers[-1]["name"], "head.3")

    def test_module_is_left_as_it_was(self):
        # The check runs the module in training mode (batch norm updates its
        # statistics, dropout is set to 0): on copies, never on the module.
        module = ConvBnDropout().eval()
        before = {k: v.clone() for k, v in module.state_dict().items()}
        self.convert(module, [1, 8, 8])
        self.assertFalse(module.training)
        self.assertEqual([m.p for m in module.modules() if isinstance(m, nn.Dropout)],
                         [0.25, 0.1])
        for k, v in module.state_dict().items():
            self.assertTrue(torch.equal(v, before[k]), k)

    def test_unsupported_op_falls_back_to_torchscript_and_warns_once(self):
        module = SigmoidNet()
        out, caught = self.convert(module, [1, 8, 8])
        self.assertFalse(out.fused)
        self.assertEqual(out.reason, "call_function torch.sigmoid at node 'sigmoid'")
        self.assertEqual(len(caught), 1)
        self.assertIn("torch.sigmoid", str(caught[0].message))
        path = out.spec[len("torchscript:"):]
        self.assertTrue(out.spec.startswith("torchscript:/"), out.spec)
        self.assertTrue(os.path.isfile(path))
        self.assertEqual(os.path.dirname(path), os.path.realpath(os.path.join(self.dir, "models")))
        self.assertRegex(os.path.basename(path), r"^SigmoidNet-[0-9a-f]{16}\.pt$")
        scripted = torch.jit.load(path)
        self.assertEqual(sorted(scripted.state_dict()), sorted(module.state_dict()))
        module.eval()
        scripted.eval()
        x = torch.randn(4, 1, 8, 8)
        with torch.no_grad():
            torch.testing.assert_close(scripted(x), module(x))
        # A rerun of the same module reuses the file its content hash names.
        again, _ = self.convert(module, [1, 8, 8])
        self.assertEqual(again.spec, out.spec)
        self.assertEqual(os.listdir(os.path.dirname(path)), [os.path.basename(path)])

    def test_a_model_dir_that_cannot_be_written(self):
        blocker = os.path.join(self.dir, "a-file")
        open(blocker, "w").close()
        with self.assertRaises(ValueError) as e:
            convert_module(SigmoidNet(), [1, 8, 8], os.path.join(blocker, "models"))
        self.assertIn("model_dir", str(e.exception))
        self.assertIn("a-file", str(e.exception))
        # A module that fuses needs no file there.
        self.assertTrue(convert_module(MLP(), [64], os.path.join(blocker, "models")).fused)

    def test_a_layer_list_that_computes_another_function_falls_back(self):
        # fx traces in training mode, where the scaling is absent: the layer
        # list has one linear layer, and only the check in eval mode shows it.
        out, caught = self.convert(EvalOnlyScale(), [4])
        self.assertFalse(out.fused)
        self.assertIn("another function than the module in eval mode", out.reason)
        self.assertEqual(len(caught), 1)

    def test_unused_parameters_fall_back(self):
        module = MLP()
        module.spare = nn.Linear(3, 3)  # state the layer list would not carry
        out, _ = self.convert(module, [64])
        self.assertFalse(out.fused)
        self.assertIn("spare.weight", out.reason)

    def test_shared_weights_fall_back(self):
        class Twice(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(5, 5)

            def forward(self, x):
                return self.fc(F.relu(self.fc(x)))

        out, _ = self.convert(Twice(), [5])
        self.assertFalse(out.fused)
        self.assertIn("called twice", out.reason)

    def test_bad_input_shape(self):
        for bad in ([1, 28], [0, 28, 28], "1,28,28", [1.0, 28, 28], [True, 28, 28], []):
            with self.assertRaises(ValueError) as e:
                convert_module(LeNet5(), bad, self.dir)
            self.assertIn("input_shape", str(e.exception))
        import numpy as np

        self.assertTrue(convert_module(MLP(), (np.int64(64),), self.dir).fused)
        with self.assertRaises(ValueError) as e:  # LeNet-5's fc1 takes 400 features, not 64
            convert_module(LeNet5(), [1, 8, 8], self.dir)
        self.assertIn("input_shape = [1, 8, 8]", str(e.exception))
        self.assertEqual(os.listdir(self.dir), [])

    def test_load_state_drops_optimizer_and_is_strict(self):
        src, dst = MLP(), MLP()
        state = dict(src.state_dict())
        state["optim.hidden.weight.momentum_buffer"] = torch.zeros(32, 64)
        self.assertIs(load_state(dst, state), dst)
        for k, v in src.state_dict().items():
            self.assertTrue(torch.equal(dst.state_dict()[k], v), k)
        del state["out.bias"]
        with self.assertRaises(RuntimeError) as e:
            load_state(dst, state)
        self.assertIn("out.bias", str(e.exception))


# ---------------------------------------------------------------------------
# The round trip through the real binaries.

def binaries():
    d = os.environ.get("CKPT_BIN") or os.path.join(ROOT, "build", "bin")
    tools = {t: os.path.join(d, t) for t in ("ckpt-scheduler", "ckpt-worker", "ckpt-tool")}
    return tools if all(os.access(p, os.X_OK) for p in tools.values()) else None


def toml_string(s):
    return json.dumps(s)  # a JSON string is a TOML basic string


class RoundTripTest(unittest.TestCase):
    """Train, export, load into the user's module, score in PyTorch."""

    @classmethod
    def setUpClass(cls):
        cls.bin = binaries()
        if cls.bin is None:
            raise unittest.SkipTest("no ckpt binaries: set CKPT_BIN to the build's bin folder")
        cls.dir = tempfile.mkdtemp(prefix="ckpt-convert-e2e-")
        from make_dataset import digits, write

        cls.digits = os.path.join(cls.dir, "digits.safetensors")
        arrays = digits(2026)
        write(arrays, cls.digits)
        # The same images as 64 features, for the MLP.
        cls.digits_flat = os.path.join(cls.dir, "digits-flat.safetensors")
        write({k: v.reshape(len(v), -1) if k.endswith(".x") else v for k, v in arrays.items()},
              cls.digits_flat)

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "dir", None):
            shutil.rmtree(cls.dir, ignore_errors=True)

    def run_experiment(self, name, spec, data_toml, members=2, lr=(0.02, 0.1)):
        """Runs a short experiment; returns (exported state, metadata, ckpt's test accuracy)."""
        store = os.path.join(self.dir, name + "-store")
        path = os.path.join(self.dir, name + ".toml")
        with open(path, "w") as f:
            f.write(f"""name = "{name}"
seed = 11
store = {toml_string(store)}
metrics = ""
[model]
spec = {toml_string(spec)}
optimizer = "sgd"
{data_toml}
[population]
size = {members}
steps_per_interval = 30
intervals = 2
[search_space.lr]
type = "log_uniform"
min = {lr[0]}
max = {lr[1]}
[policy]
kind = "pbt"
mode = "sync"
quantile = 0.5
[[devices]]
device = "cpu"
slots = 2
""")
        p = subprocess.run([self.bin["ckpt-scheduler"], "run", path], capture_output=True,
                           text=True, timeout=600)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        tool = [self.bin["ckpt-tool"], "--store", store]
        # The scores ckpt reported at the end: the final evaluation's event.
        p = subprocess.run(tool + ["--json", "events", name, "--type", "final_eval"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        (event,) = json.loads(p.stdout)["events"]
        self.assertEqual(len(event["results"]), members)
        best = max(event["results"], key=lambda r: r["val_accuracy"])
        out = os.path.join(self.dir, f"{name}-best.safetensors")
        ref = f"{name}/{best['member']}@{best['version']}"
        p = subprocess.run(tool + ["export", ref, "-o", out],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(out, "pt") as f:
            meta = f.metadata()
        return load_file(out), meta, best

    def check_round_trip(self, module, state, meta, best, x, y):
        """Loads the export into `module` bit-exactly and scores it on (x, y) as ckpt does."""
        # The export carries the optimizer's state; load_state leaves it out.
        self.assertIn("optim.", " ".join(state))
        load_state(module, state)
        mine = module.state_dict()
        for k, v in state.items():
            if k.startswith("optim."):
                continue
            self.assertEqual(mine[k].dtype, v.dtype, k)
            self.assertTrue(torch.equal(mine[k], v), k)
        scale = torch.tensor(json.loads(meta["ckpt.input_scale"]), dtype=torch.float32)
        shift = torch.tensor(json.loads(meta["ckpt.input_shift"]), dtype=torch.float32)
        view = (1, -1) + (1,) * (x.dim() - 2)
        module.eval()
        correct = 0
        with torch.no_grad():
            for b in range(0, len(x), 1000):
                xb = x[b:b + 1000].float() * scale.view(view) + shift.view(view)
                correct += int((module(xb).argmax(1) == y[b:b + 1000]).sum())
        reported = best["test_accuracy"]
        self.assertIsNotNone(reported)
        self.assertLessEqual(abs(correct - reported * len(x)), 1.0,
                             f"PyTorch: {correct}/{len(x)}, ckpt: {reported}")
        # Above chance: the check would not notice a model that learned nothing.
        self.assertGreater(correct / len(x), 0.3)

    def digits_test_split(self, path=None):
        from safetensors.torch import load_file

        t = load_file(path or self.digits)
        return t["test.x"], t["test.y"]

    def digits_toml(self, path=None):
        return f"""[data]
format = "safetensors"
path = {toml_string(path or self.digits)}
batch_size = 32
eval_size = 250"""

    def test_lenet5_on_fashion_mnist(self):
        if not os.path.isdir(FASHION_MNIST):
            self.skipTest(f"no Fashion-MNIST at {FASHION_MNIST} (Debian's dataset-fashion-mnist)")
        torch.manual_seed(3)
        converted = convert_module(LeNet5(), [1, 28, 28], os.path.join(self.dir, "models"))
        self.assertTrue(converted.fused, converted.reason)
        state, meta, best = self.run_experiment("cvt-lenet5", converted.spec, f"""[data]
dataset = "fashion-mnist"
path = {toml_string(FASHION_MNIST)}
batch_size = 64
eval_size = 1000""")
        from make_dataset import fashion_mnist

        arrays = fashion_mnist(FASHION_MNIST)
        x = torch.from_numpy(arrays["test.x"].copy())
        y = torch.from_numpy(arrays["test.y"].copy())
        self.check_round_trip(LeNet5(), state, meta, best, x, y)

    def test_residual_net_on_digits(self):
        torch.manual_seed(4)
        converted = convert_module(CifarResNet(channels=1, width=8),
                                   [1, 8, 8], os.path.join(self.dir, "models"))
        self.assertTrue(converted.fused, converted.reason)
        state, meta, best = self.run_experiment("cvt-resnet", converted.spec, self.digits_toml())
        self.assertIn("layer2.0.shortcut.bn1.num_batches_tracked", state)
        x, y = self.digits_test_split()
        self.check_round_trip(CifarResNet(channels=1, width=8), state, meta, best, x, y)

    def test_resnet20_with_downsample_shortcuts_on_digits(self):
        torch.manual_seed(7)
        converted = convert_module(ResNet20(channels=1, width=8), [1, 8, 8],
                                   os.path.join(self.dir, "models"))
        self.assertTrue(converted.fused, converted.reason)
        state, meta, best = self.run_experiment("cvt-resnet20", converted.spec,
                                                self.digits_toml())
        self.assertIn("layer3.0.downsample.1.num_batches_tracked", state)
        self.assertEqual([k for k in state if ".shortcut." in k], [])
        x, y = self.digits_test_split()
        self.check_round_trip(ResNet20(channels=1, width=8), state, meta, best, x, y)

    def test_mlp_with_a_residual_on_digit_features(self):
        torch.manual_seed(6)
        converted = convert_module(MLP(), [64], os.path.join(self.dir, "models"))
        self.assertTrue(converted.fused, converted.reason)
        state, meta, best = self.run_experiment("cvt-mlp", converted.spec,
                                                self.digits_toml(self.digits_flat))
        x, y = self.digits_test_split(self.digits_flat)
        self.check_round_trip(MLP(), state, meta, best, x, y)

    def test_torchscript_fallback_on_digits(self):
        torch.manual_seed(5)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            converted = convert_module(SigmoidNet(), [1, 8, 8], os.path.join(self.dir, "models"))
        self.assertFalse(converted.fused)
        self.assertEqual(len([w for w in caught if w.category is ConversionWarning]), 1)
        state, meta, best = self.run_experiment("cvt-script", converted.spec, self.digits_toml(),
                                                lr=(0.2, 0.5))
        x, y = self.digits_test_split()
        self.check_round_trip(SigmoidNet(), state, meta, best, x, y)


if __name__ == "__main__":
    main()
