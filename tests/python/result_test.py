"""ckpt_client.Result on the store of a real run, and find_binary.

setUpClass runs a tiny PBT experiment with the real ckpt-scheduler (4
members, 4 synchronous generations of 10 steps on scikit-learn's digits,
written by examples/make_dataset.py) into a temporary store; every check
compares what Result says with what ckpt-tool and the scheduler's summary say
of the same store, and loads the states into a real PyTorch module.

    CKPT_BIN=build/bin PYTHONPATH=python .venv/bin/python tests/python/result_test.py -v
"""
import json
import os
import stat
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CKPT_SOURCE_DIR") or os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SOURCE, "tests"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch import nn  # noqa: E402

from ckpt_client import CkptError  # noqa: E402
from ckpt_client import binaries  # noqa: E402
from ckpt_client.binaries import find_binary  # noqa: E402
from ckpt_client.result import Result  # noqa: E402

POPULATION, INTERVALS, STEPS = 4, 4, 10
SPEC = ('[{"type": "conv2d", "out": 8, "kernel": 3, "padding": 1, "name": "conv1"}, '
        '{"type": "relu"}, {"type": "maxpool2d", "kernel": 2}, {"type": "flatten"}, '
        '{"type": "linear", "out": 10, "name": "fc"}]')
CONFIG = """
name = "tiny"
seed = 7
[model]
spec = '{SPEC}'
optimizer = "sgd"
[data]
format = "npz"
path = "{DATA}"
batch_size = 32
eval_size = 250
[population]
size = {POPULATION}
steps_per_interval = {STEPS}
intervals = {INTERVALS}
[search_space.lr]
type = "log_uniform"
min = 0.01
max = 0.3
[search_space.momentum]
type = "uniform"
min = 0.5
max = 0.95
[policy]
kind = "pbt"
mode = "sync"
quantile = 0.25
perturb = [0.8, 1.2]
ready_intervals = 1
[[devices]]
device = "cpu"
slots = 2
fusion = "plain"
intra_op_threads = 1
"""


class DigitsNet(nn.Module):
    """The layer list above as the user's own module (same parameter names)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc(torch.flatten(F.max_pool2d(F.relu(self.conv1(x)), 2), 1))


def tool(store, *args):
    p = subprocess.run([find_binary("ckpt-tool"), "--store", store, "--json", *args],
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout)


class ResultTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="ckpt-result-test-")
        d = cls.tmp.name
        cls.store = os.path.join(d, "store")
        subprocess.run([sys.executable, os.path.join(SOURCE, "examples", "make_dataset.py"),
                        "digits", os.path.join(d, "digits.npz")], check=True,
                       capture_output=True)
        with open(os.path.join(d, "tiny.toml"), "w") as f:
            # The data's absolute path: ckpt-tool export finds it from anywhere.
            f.write(CONFIG.format(SPEC=SPEC, DATA=os.path.join(d, "digits.npz"),
                                  POPULATION=POPULATION, STEPS=STEPS, INTERVALS=INTERVALS))
        summary = os.path.join(d, "summary.json")
        subprocess.run([find_binary("ckpt-scheduler"), "run", "tiny.toml", "--store", cls.store,
                        "--summary-json", summary, "--quiet"], cwd=d, check=True,
                       capture_output=True, timeout=600)
        with open(summary) as f:
            cls.summary = json.load(f)
        cls.ls = tool(cls.store, "ls", "tiny", "--sort", "score")
        cls.events = tool(cls.store, "events", "tiny")["events"]
        cls.exploits = [e for e in cls.events if e["type"] == "exploit"]
        cls.result = Result(cls.store, "tiny", module=DigitsNet())

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_the_run_exploited(self):
        # Every later check of exploits needs some; 4 members, quantile 0.25:
        # one per generation unless the scores tie.
        self.assertGreaterEqual(len(self.exploits), 1, self.events)

    def test_members_best_first_as_the_tool_and_the_summary_say(self):
        m = self.result.members
        self.assertEqual(list(m["member"]), [x["member"] for x in self.ls["members"]])
        self.assertEqual(list(m["member"]), [x["member"] for x in self.summary["members"]])
        for col in ("member", "status", "step", "version", "intervals_done", "val_accuracy",
                    "test_accuracy", "config/lr", "config/momentum"):
            self.assertIn(col, m.columns)
        for row, ls, s in zip(m.to_dict("records"), self.ls["members"], self.summary["members"]):
            self.assertEqual(row["val_accuracy"], ls["score"])
            self.assertEqual(row["test_accuracy"], s["test_score"])
            self.assertEqual(row["status"], ls["state"])
            self.assertEqual(row["step"], ls["step"])
            self.assertEqual(row["version"], ls["version"])
            self.assertEqual(row["config/lr"], ls["hparams"]["lr"])
            self.assertEqual(row["config/momentum"], ls["hparams"]["momentum"])
        self.assertEqual(self.result.metric, "accuracy")
        scores = list(m["val_accuracy"])
        self.assertEqual(scores, sorted(scores, reverse=True))

    def test_history_one_row_per_member_interval(self):
        h = self.result.history
        self.assertEqual(len(h), POPULATION * INTERVALS)
        self.assertEqual(sorted(set(zip(h["member"], h["interval"]))),
                         sorted((m, i) for m in self.result.members["member"]
                                for i in range(1, INTERVALS + 1)))
        trained = {(e["member"], e["interval"]): e for e in self.events if e["type"] == "trained"}
        for row in h.to_dict("records"):
            e = trained[(row["member"], row["interval"])]
            self.assertEqual(row["val_accuracy"], e["val_accuracy"])
            self.assertEqual(row["step"], e["step"])
            self.assertEqual(row["version"], e["version"])

    def test_history_exploit_rows_name_their_donor_and_new_hyperparameters(self):
        h = self.result.history
        ex = h[h["exploited"]]
        # Each exploit before the last generation starts the member's next interval.
        followed = [e for e in self.exploits if e["interval"] < INTERVALS]
        self.assertEqual(len(ex), len(followed))
        self.assertTrue(ex["donor"].notna().all())
        self.assertTrue(h[~h["exploited"]]["donor"].isna().all())
        by_next = {(e["member"], e["interval"] + 1): e for e in followed}
        for row in ex.to_dict("records"):
            e = by_next[(row["member"], row["interval"])]
            self.assertEqual(row["donor"], e["donor"])
            self.assertEqual(row["donor_version"], e["donor_version"])
            self.assertEqual(row["config/lr"], e["hparams"]["lr"])
            self.assertEqual(row["config/momentum"], e["hparams"]["momentum"])
        # A member never exploited trains with its head's values throughout.
        heads = {m["member"]: m["hparams"] for m in self.ls["members"]}
        for member in set(heads) - {e["member"] for e in self.exploits}:
            rows = h[h["member"] == member]
            self.assertTrue((rows["config/lr"] == heads[member]["lr"]).all(), rows)

    def test_best(self):
        self.assertEqual(list(self.result.best()["member"]), [self.ls["members"][0]["member"]])
        self.assertEqual(list(self.result.best(3)["member"]),
                         [m["member"] for m in self.ls["members"][:3]])
        for bad in (0, -1, 1.5, "2"):
            with self.assertRaises(ValueError) as c:
                self.result.best(bad)
            self.assertIn(repr(bad), str(c.exception))

    def test_state_dict_round_trips_bit_exact_into_the_users_module(self):
        best = self.ls["members"][0]["member"]
        state = self.result.state_dict()
        self.assertFalse(any(k.startswith("optim.") for k in state))
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "best.safetensors")
            subprocess.run([find_binary("ckpt-tool"), "--store", self.store, "export",
                            f"tiny/{best}", "-o", out], check=True, capture_output=True)
            exported = {k: v for k, v in load_file(out).items() if not k.startswith("optim.")}
        self.assertEqual(sorted(state), sorted(exported))
        model = DigitsNet()
        model.load_state_dict(state, strict=True)
        for k, v in model.state_dict().items():
            self.assertTrue(torch.equal(v, exported[k]), k)
        other = self.ls["members"][-1]["member"]
        self.assertFalse(all(torch.equal(self.result.state_dict(other)[k], exported[k])
                             for k in exported))

    def test_best_module_scores_what_ckpt_scored(self):
        template = DigitsNet()
        before = {k: v.clone() for k, v in template.state_dict().items()}
        result = Result(self.store, "tiny", module=template)
        model = result.best_module()
        self.assertIsNot(model, template)
        self.assertFalse(model.training)
        for k, v in template.state_dict().items():
            self.assertTrue(torch.equal(v, before[k]), f"the template's {k} changed")
        # ckpt's workers feed x * input_scale[c] + input_shift[c]: the
        # validation split through the loaded module scores what ckpt scored.
        best = self.ls["members"][0]
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "best.safetensors")
            subprocess.run([find_binary("ckpt-tool"), "--store", self.store, "export",
                            f"tiny/{best['member']}", "-o", out], check=True, capture_output=True)
            with safe_open(out, "pt") as f:
                meta = f.metadata()
        import numpy as np
        data = np.load(os.path.join(self.tmp.name, "digits.npz"))
        x = torch.from_numpy(data["val.x"])
        scale = torch.tensor(json.loads(meta["ckpt.input_scale"])).view(1, -1, 1, 1)
        shift = torch.tensor(json.loads(meta["ckpt.input_shift"])).view(1, -1, 1, 1)
        self.assertTrue(torch.equal(result.normalize(data["val.x"]), x * scale + shift))
        with torch.no_grad():
            predicted = model(result.normalize(x)).argmax(1).numpy()
        accuracy = float((predicted == data["val.y"]).mean())
        self.assertAlmostEqual(accuracy, best["score"], delta=2 / len(x))
        with self.assertRaises(ValueError) as c:
            result.normalize(x.reshape(len(x), 64))
        self.assertIn("[250, 64]", str(c.exception))

    def test_best_module_loads_strictly(self):
        class Renamed(DigitsNet):
            def __init__(self):
                super().__init__()
                self.head = self.fc
                del self.fc

        with self.assertRaises(Exception) as c:
            Result(self.store, "tiny", module=Renamed()).best_module()
        self.assertIn("head", str(c.exception))
        with self.assertRaises(ValueError) as c:
            Result(self.store, "tiny").best_module()
        self.assertIn("module", str(c.exception))

    def test_plot_has_an_axes_per_quantity_and_marks_exploits(self):
        from matplotlib.figure import Figure

        fig = self.result.plot()
        self.assertIsInstance(fig, Figure)
        self.assertEqual(len(fig.axes), 3)  # val_accuracy, lr, momentum
        self.assertEqual([a.get_ylabel() for a in fig.axes], ["val_accuracy", "lr", "momentum"])
        h = self.result.history
        n_exploited = int(h["exploited"].sum())
        for ax in fig.axes:
            self.assertEqual(len(ax.get_lines()), POPULATION, ax.get_ylabel())
            marks = [c for c in ax.collections if c.get_gid() == "exploits"]
            self.assertEqual(len(marks), 1, ax.get_ylabel())
            self.assertEqual(len(marks[0].get_offsets()), n_exploited)
        # The score axes marks each exploit at its donor's score.
        donor_scores = sorted(
            float(h[(h["member"] == r["donor"]) & (h["version"] == r["donor_version"])]
                  ["val_accuracy"].iloc[0]) for r in h[h["exploited"]].to_dict("records"))
        marks = [c for c in fig.axes[0].collections if c.get_gid() == "exploits"][0]
        self.assertEqual(sorted(float(y) for _, y in marks.get_offsets()), donor_scores)
        with tempfile.TemporaryDirectory() as d:
            fig.savefig(os.path.join(d, "pbt.png"))
            with open(os.path.join(d, "pbt.png"), "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_lineage_of_an_exploited_member_names_its_donor(self):
        h = self.result.history
        row = h[h["exploited"]].iloc[0]
        lineage = self.result.lineage(f"{row['member']}@{row['version']}")
        self.assertEqual(lineage["member"].iloc[0], row["member"])
        self.assertEqual(lineage["version"].iloc[0], row["version"])
        exploit = lineage[lineage["reason"] == "exploit"].iloc[0]
        self.assertEqual(exploit["member"], row["member"])
        self.assertEqual(exploit["parent_member"], row["donor"])
        self.assertEqual(exploit["parent_version"], row["donor_version"])
        self.assertIn(row["donor"], list(lineage["member"]))
        for col in ("step", "val_accuracy", "config/lr", "config/momentum"):
            self.assertIn(col, lineage.columns)

    def test_unknown_names_raise_naming_them(self):
        with self.assertRaises(CkptError) as c:
            Result(self.store, "nope")
        self.assertEqual(c.exception.code, "NotFound")
        self.assertIn("nope", str(c.exception))
        missing = os.path.join(self.tmp.name, "no-store")
        with self.assertRaises(CkptError) as c:
            Result(missing, "tiny")
        self.assertIn("no-store", str(c.exception))
        with self.assertRaises(CkptError) as c:
            self.result.state_dict("m099")
        self.assertIn("m099", str(c.exception))
        with self.assertRaises(CkptError) as c:
            self.result.lineage("m099")
        self.assertIn("m099", str(c.exception))


REGRESSION_SPEC = ('[{"type": "linear", "out": 16, "name": "fc1"}, {"type": "tanh"}, '
                   '{"type": "linear", "out": 1, "name": "fc2"}]')
REGRESSION = """
name = "reg"
seed = 3
[model]
spec = '{SPEC}'
optimizer = "sgd"
[data]
format = "safetensors"
path = "{DATA}"
batch_size = 16
[population]
size = 3
steps_per_interval = 5
intervals = 2
[search_space.lr]
type = "log_uniform"
min = 0.001
max = 0.05
[policy]
kind = "random"
[[devices]]
device = "cpu"
slots = 1
"""


class RegressionResultTest(unittest.TestCase):
    """A regression (neg_mse) under random search: no exploit, scores under
    the metric's own name everywhere."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="ckpt-result-test-")
        d = cls.tmp.name
        cls.store = os.path.join(d, "store")
        data = os.path.join(d, "diabetes.safetensors")
        subprocess.run([sys.executable, os.path.join(SOURCE, "examples", "make_dataset.py"),
                        "diabetes", data], check=True, capture_output=True)
        with open(os.path.join(d, "reg.toml"), "w") as f:
            f.write(REGRESSION.format(SPEC=REGRESSION_SPEC, DATA=data))
        summary = os.path.join(d, "summary.json")
        subprocess.run([find_binary("ckpt-scheduler"), "run", "reg.toml", "--store", cls.store,
                        "--summary-json", summary, "--quiet"], cwd=d, check=True,
                       capture_output=True, timeout=600)
        with open(summary) as f:
            cls.summary = json.load(f)
        cls.result = Result(cls.store, "reg")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_scores_are_named_by_the_metric(self):
        self.assertEqual(self.summary["metric"], "neg_mse")
        self.assertEqual(self.result.metric, "neg_mse")
        m = self.result.members
        self.assertNotIn("val_accuracy", m.columns)
        self.assertEqual(list(m["member"]), [x["member"] for x in self.summary["members"]])
        self.assertEqual(list(m["val_neg_mse"]), [x["val_score"] for x in self.summary["members"]])
        self.assertEqual(list(m["test_neg_mse"]),
                         [x["test_score"] for x in self.summary["members"]])

    def test_history_without_exploits(self):
        h = self.result.history
        self.assertEqual(len(h), 3 * 2)
        self.assertFalse(h["exploited"].any())
        self.assertTrue(h["val_neg_mse"].notna().all(), h)
        # The last interval's score is the head's, member by member.
        last = h[h["interval"] == 2].set_index("member")["val_neg_mse"]
        for row in self.summary["members"]:
            self.assertEqual(last[row["member"]], row["val_score"])
        fig = self.result.plot()
        self.assertEqual([a.get_ylabel() for a in fig.axes], ["val_neg_mse", "lr"])
        self.assertEqual([c for a in fig.axes for c in a.collections], [])


class FindBinaryTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ckpt-find-binary-")
        self.env = dict(os.environ)
        self.checkout_bin = binaries._checkout_bin

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self.env)
        binaries._checkout_bin = self.checkout_bin
        self.tmp.cleanup()

    def fake(self, directory, name):
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(path, stat.S_IRWXU)
        return path

    def test_ckpt_bin_then_path_then_the_checkout(self):
        d = self.tmp.name
        in_env = self.fake(os.path.join(d, "env"), "ckpt-tool")
        on_path = self.fake(os.path.join(d, "path"), "ckpt-tool")
        in_checkout = self.fake(os.path.join(d, "checkout"), "ckpt-tool")
        binaries._checkout_bin = lambda: os.path.join(d, "checkout")
        os.environ["CKPT_BIN"] = os.path.join(d, "env")
        os.environ["PATH"] = os.path.join(d, "path")
        self.assertEqual(find_binary("ckpt-tool"), in_env)
        os.environ["CKPT_BIN"] = os.path.join(d, "empty")
        self.assertEqual(find_binary("ckpt-tool"), on_path)
        del os.environ["CKPT_BIN"]
        os.environ["PATH"] = os.path.join(d, "empty")
        self.assertEqual(find_binary("ckpt-tool"), in_checkout)

    def test_missing_names_the_binary_and_the_three_remedies(self):
        d = self.tmp.name
        binaries._checkout_bin = lambda: os.path.join(d, "checkout")
        os.environ["CKPT_BIN"] = os.path.join(d, "empty")
        os.environ["PATH"] = os.path.join(d, "empty")
        with self.assertRaises(CkptError) as c:
            find_binary("ckpt-worker")
        self.assertEqual(c.exception.code, "NotFound")
        for needle in ("ckpt-worker", "CKPT_BIN=<dir>", "PATH", "make build",
                       os.path.join(d, "checkout")):
            self.assertIn(needle, str(c.exception))
        with self.assertRaises(ValueError) as c:
            find_binary("ckpt-nothing")
        self.assertIn("ckpt-nothing", str(c.exception))

    def test_the_checkout_build_is_found_from_the_package_source(self):
        # python/ckpt_client/binaries.py -> <checkout>/build/bin
        self.assertEqual(binaries._checkout_bin(),
                         os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
                             os.path.abspath(binaries.__file__)))), "build", "bin"))


if __name__ == "__main__":
    from unittest_exit import main
    main()
