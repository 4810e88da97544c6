"""ckpt_client.Experiment: the experiment file from Python values and back
(to_toml / from_toml, every key), checked by the real scheduler
(`ckpt-scheduler check`), and each bad input raising an exception that names
the Python argument and its value, leaving nothing behind.

    CKPT_BIN=build/bin PYTHONPATH=python .venv/bin/python tests/python/experiment_test.py -v
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))
from unittest_exit import main  # noqa: E402  (tests/unittest_exit.py)

from ckpt_client import (ArgumentError, CkptError, DataFile, Experiment, Policy,  # noqa: E402
                         choice, find_binary, loguniform, pbt, random_search,
                         successive_halving, uniform)

LAYERS = [{"type": "linear", "out": 16}, {"type": "relu"}, {"type": "linear", "out": 3}]


def arrays(n=90, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    y = rng.integers(0, classes, size=n)
    return x, y


class ExperimentTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scheduler = find_binary("ckpt-scheduler")
        # The API checks through the scheduler's `check` verb: a build without
        # it is not the build these tests are for.
        p = subprocess.run([cls.scheduler, "--help"], capture_output=True, text=True)
        if not any(line.split()[:1] == ["check"] for line in p.stdout.splitlines()):
            raise AssertionError(f"{cls.scheduler} has no `check` verb:\n{p.stdout}")

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ckpt-exp-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.store = os.path.join(self.dir, "store")

    def experiment(self, **overrides):
        kwargs = dict(population=4, intervals=2, steps_per_interval=5, batch_size=16,
                      eval_size=30, val_size=30, devices={"device": "cpu", "slots": 1})
        kwargs.update(overrides)
        model = kwargs.pop("model", LAYERS)
        data = kwargs.pop("data", arrays())
        space = kwargs.pop("search_space", {"lr": loguniform(0.01, 0.3)})
        return Experiment(model, data, space, **kwargs)

    def file(self, text, name="e.toml"):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    # ---- the file ----

    def test_every_key_round_trips(self):
        x, y = arrays()
        data_path = os.path.join(self.dir, "given.safetensors")
        from ckpt_client import write_tensor_file
        data_path = write_tensor_file((x, y), self.dir)
        exp = Experiment(
            LAYERS, data_path,
            {"lr": loguniform(1e-3, 0.3), "momentum": uniform(0.5, 0.99),
             "weight_decay": choice([0.0, 1e-4, 5e-4])},
            name="every-key", seed=11, metrics="127.0.0.1:9464", hparams={"dropout": 0.25},
            policy=pbt(mode="async", quantile=0.25, perturb=(0.7, 1.3),
                       resample_probability=0.1, ready_intervals=2),
            population=6, intervals=3, steps_per_interval=7, target_metric=0.99, max_wall_s=600,
            batch_size=32, eval_size=20, val_size=20, classes=3, mean=[0.1] * 6, std=[0.9] * 6,
            optimizer="sgd", loss="cross_entropy", metric="accuracy",
            devices=[{"device": "cpu", "slots": 2, "fusion": "plain", "fusion_width": 4,
                      "intra_op_threads": 1, "count": 1}, "cpu"],
            supervision={"restart_backoff_s": 1, "max_restart_backoff_s": 2,
                         "healthy_reset_s": 60, "max_restarts": 3, "max_member_failures": 2,
                         "grace_s": 5, "heartbeat_timeout_s": 30},
            workers={"local": True, "max_remote": 4})
        text = exp.to_toml(self.store)
        doc = tomllib.loads(text)
        self.assertEqual(doc["name"], "every-key")
        self.assertEqual(doc["data"], {"format": "safetensors", "path": data_path,
                                       "val_size": 20, "classes": 3, "mean": [0.1] * 6,
                                       "std": [0.9] * 6, "batch_size": 32, "eval_size": 20})
        self.assertEqual(doc["search_space"]["weight_decay"],
                         {"type": "choice", "values": [0.0, 1e-4, 5e-4]})
        self.assertEqual(doc["search_space"]["lr"], {"type": "log_uniform", "min": 1e-3,
                                                     "max": 0.3})
        self.assertEqual(doc["policy"]["perturb"], [0.7, 1.3])
        self.assertEqual(len(doc["devices"]), 2)
        self.assertEqual(doc["population"]["target_metric"], 0.99)
        # The scheduler reads it as written: every key known, every value in range.
        p = subprocess.run([self.scheduler, "check", self.file(text)], capture_output=True,
                           text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        back = Experiment.from_toml(self.file(text))
        self.assertEqual(back.to_toml(self.store), text)
        self.assertEqual(back.search_space["momentum"], uniform(0.5, 0.99))
        self.assertEqual(back.policy, exp.policy)
        self.assertEqual(back.data, DataFile(data_path, "safetensors"))

    def test_the_examples_read_back_key_for_key(self):
        for name in ("demo.toml", "fashion-mnist-pbt.toml", "cifar10-resnet20-pbt.toml"):
            with self.subTest(example=name):
                path = os.path.join(ROOT, "examples", name)
                with open(path, "rb") as f:
                    original = tomllib.load(f)
                text = Experiment.from_toml(path).to_toml(self.store)
                self.assertEqual(tomllib.loads(text), original)
                self.assertEqual(Experiment.from_toml(self.file(text)).to_toml(self.store), text)

    def test_arrays_are_written_once_into_the_store(self):
        exp = self.experiment()
        text = exp.to_toml(self.store)
        path = tomllib.loads(text)["data"]["path"]
        self.assertEqual(os.path.dirname(path), os.path.join(self.store, "data"))
        self.assertTrue(path.endswith(".safetensors"))
        # The same definition, made again from equal arrays: the same file and name.
        again = self.experiment().to_toml(self.store)
        self.assertEqual(again, text)
        self.assertEqual(os.listdir(os.path.join(self.store, "data")), [os.path.basename(path)])
        # Another search space is another experiment (its name says so).
        other = self.experiment(search_space={"lr": loguniform(0.01, 0.2)}).to_toml(self.store)
        self.assertNotEqual(tomllib.loads(other)["name"], tomllib.loads(text)["name"])
        self.assertEqual(tomllib.loads(other)["data"]["path"], path)

    def test_every_policy_and_kind_is_accepted_by_the_scheduler(self):
        policies = ["pbt", "pbt_async", "random", "successive_halving", pbt(quantile=0.5),
                    random_search(mode="async"), successive_halving(eta=2, min_intervals=1),
                    Policy("pbt", mode="sync"), {"kind": "random"}]
        for policy in policies:
            with self.subTest(policy=policy):
                exp = self.experiment(policy=policy, search_space={
                    "lr": choice([0.05, 0.1]), "momentum": uniform(0.0, 0.9)})
                text = exp.check(self.store)
                self.assertIn("[policy]", text)

    # ---- bad input ----

    def assert_refused(self, make, argument, *fragments, store=None):
        """make() raises ArgumentError naming `argument`, its value and the
        fragments; nothing is left in the store folder."""
        store = store or self.store
        with self.assertRaises(ArgumentError) as e:
            make(store)
        message = str(e.exception)
        self.assertEqual(e.exception.argument, argument, message)
        self.assertTrue(message.startswith(f"{argument} = "), message)
        for f in fragments:
            self.assertIn(f, message)
        self.assertFalse(os.path.exists(store), f"{store} was created: {message}")
        return message

    def test_search_space_ranges_empty_or_of_the_wrong_kind(self):
        m = self.assert_refused(
            lambda s: self.experiment(search_space={"lr": loguniform(0.1, 0.001)}).check(s),
            "search_space['lr']", "loguniform(0.1, 0.001)", "must not be below min",
            "search_space.lr.max")
        self.assertIn("line", m)
        self.assert_refused(
            lambda s: self.experiment(search_space={"lr": loguniform(0, 1)}).check(s),
            "search_space['lr']", "loguniform(0, 1)", "1e-300")
        self.assert_refused(
            lambda s: self.experiment(search_space={"lr": uniform("low", 1)}).check(s),
            "search_space['lr']", "uniform('low', 1)", "number")
        self.assert_refused(
            lambda s: self.experiment(search_space={"momentum": choice([])}).run(s),
            "search_space['momentum']", "choice([])", "at least one value")
        self.assert_refused(
            lambda s: self.experiment(search_space={"dropout": uniform(0.2, 1.5)}).check(s),
            "search_space['dropout']", "1.5", "dropout probability")
        for wrong in (0.1, (0.01, 0.1), "loguniform(0.01, 0.1)"):
            self.assert_refused(
                lambda s: self.experiment(search_space={"lr": wrong}).check(s),
                "search_space['lr']", repr(wrong), "loguniform(a, b)")

    def test_other_keys_name_their_argument(self):
        cases = [
            (dict(population=0), "population", "population = 0", "[1, 10000]"),
            (dict(intervals=-1), "intervals", "intervals = -1", "population.intervals"),
            (dict(batch_size="64"), "batch_size", "'64'", "integer"),
            (dict(optimizer="rmsprop"), "optimizer", "'rmsprop'", "model.optimizer"),
            (dict(policy="bogus"), "policy", "bogus", "policy.kind"),
            (dict(devices="gpu0"), "devices", "'gpu0'", "cpu, auto or cuda:N"),
            (dict(supervision={"max_restarts": -1}), "supervision['max_restarts']", "-1", ""),
            (dict(hparams={"lr": 0.1}), "hparams['lr']", "0.1", "also in search_space"),
            (dict(metric="neg_mse"), "metric", "'neg_mse'", "does not fit"),
            (dict(augment=["rotate:5"]), "augment", "rotate:5", ""),
            (dict(name="has space"), "name", "'has space'", "letters, digits"),
            (dict(data="no-such-dataset.safetensors"), "data", "no-such-dataset", ""),
            (dict(model="lenet6"), "model", "'lenet6'", "built-in"),
        ]
        for kwargs, argument, value, why in cases:
            with self.subTest(argument=argument):
                self.assert_refused(lambda s: self.experiment(**kwargs).check(s), argument,
                                    value, why)

    def test_arrays_rows_and_labels(self):
        x, y = arrays()
        self.assert_refused(lambda s: self.experiment(data=(x, y[:-1])).run(s),
                            "data['train']", "x has 90 rows but y has 89")
        self.assert_refused(
            lambda s: self.experiment(data={"train": (x, y), "test": (x[:10], y[:11])}).run(s),
            "data['test']", "x has 10 rows but y has 11")
        bad = y.copy()
        bad[17] = 7
        self.assert_refused(lambda s: self.experiment(data=(x, bad), classes=3).run(s),
                            "data['train']", "label 7 at row 17 is outside [0, 3)")
        bad[17] = -2
        self.assert_refused(lambda s: self.experiment(data=(x, bad)).run(s),
                            "data['train']", "label -2 at row 17")
        # What only the file check sees, named by the split all the same.
        xf = x.copy()
        xf[5, 2] = np.inf
        self.assert_refused(lambda s: self.experiment(data={"train": (x, y), "val": (xf, y)},
                                                      val_size=None).run(s),
                            "data['val']", "x:", "row 5")

    def test_model_output_size_against_the_classes(self):
        from torch import nn

        x, y = arrays(classes=5)
        mlp = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
        self.assert_refused(lambda s: self.experiment(model=mlp, data=(x, y)).run(s), "model",
                            "<Sequential module>", "outputs 3 values a sample",
                            "the data has 5 classes")
        self.assert_refused(lambda s: self.experiment(model=mlp, data=(x, y), classes=7).run(s),
                            "model", "the data has 7 classes")
        targets = x[:, :2].copy()
        self.assert_refused(lambda s: self.experiment(model=mlp, data=(x, targets)).run(s),
                            "model", "the data has 2 targets")
        spec = json.loads(tomllib.loads(self.experiment(model=mlp).check(self.store))["model"]
                          ["spec"])
        self.assertEqual(spec["layers"][-1]["out"], 3)  # 3 classes: accepted

    def test_a_module_kept_as_torchscript_against_the_classes(self):
        import torch
        from torch import nn

        from ckpt_client.convert import ConversionWarning

        class Gated(nn.Module):  # torch.sigmoid has no layer: TorchScript
            def __init__(self, outputs):
                super().__init__()
                self.fc1 = nn.Linear(6, 8)
                self.fc2 = nn.Linear(8, outputs)

            def forward(self, x):
                return self.fc2(torch.sigmoid(self.fc1(x)))

        x, y = arrays(classes=5)
        with self.assertWarns(ConversionWarning):
            self.assert_refused(lambda s: self.experiment(model=Gated(3), data=(x, y)).run(s),
                                "model", "<Gated module>", "outputs 3 values a sample",
                                "5 classes")
        with self.assertWarns(ConversionWarning):
            text = self.experiment(model=Gated(5), data=(x, y)).check(self.store)
        spec = tomllib.loads(text)["model"]["spec"]
        self.assertTrue(spec.startswith("torchscript:" + os.path.join(self.store, "models")), spec)
        # A module that does not run on the data's samples: named, nothing left.
        shutil.rmtree(self.store)
        self.assert_refused(lambda s: self.experiment(model=nn.Conv2d(3, 4, 3), data=(x, y)).run(s),
                            "model", "<Conv2d module>", "[6]")

    def test_missing_binaries(self):
        # A copy of the package outside the checkout (so its build/bin is not
        # found), with CKPT_BIN and PATH leading nowhere.
        pkg = os.path.join(self.dir, "pkg")
        shutil.copytree(os.path.join(ROOT, "python", "ckpt_client"),
                        os.path.join(pkg, "ckpt_client"))
        empty = os.path.join(self.dir, "empty")
        os.mkdir(empty)
        script = ("import numpy as np\n"
                  "from ckpt_client import Experiment, loguniform, CkptError\n"
                  "x = np.zeros((20, 4), np.float32); y = np.arange(20) % 2\n"
                  "e = Experiment('lenet5', (x, y), {'lr': loguniform(0.01, 0.1)})\n"
                  "try:\n"
                  f"    e.run({self.store!r})\n"
                  "except CkptError as err:\n"
                  "    print(err.code); print(err)\n")
        env = dict(os.environ, CKPT_BIN=empty, PATH=empty, PYTHONPATH=pkg)
        p = subprocess.run([sys.executable, "-c", script], env=env, cwd=self.dir,
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.startswith("NotFound\nckpt-scheduler not found"), p.stdout)
        for way in ("CKPT_BIN", "PATH", "build"):
            self.assertIn(way, p.stdout)
        self.assertFalse(os.path.exists(self.store))

    def test_a_store_that_cannot_be_written(self):
        a_file = os.path.join(self.dir, "a-file")
        with open(a_file, "w") as f:
            f.write("not a folder")
        for store, why in ((os.path.join(a_file, "store"), "is not a folder"),
                           ("/proc/ckpt-store", "cannot write in /proc")):
            with self.subTest(store=store):
                self.assert_refused(lambda s: self.experiment().run(s), "store", repr(store),
                                    why, store=store)
        if os.geteuid() != 0:  # root writes in a folder of mode 0500 all the same
            locked = os.path.join(self.dir, "locked")
            os.mkdir(locked, 0o500)
            self.assert_refused(lambda s: self.experiment().run(s), "store", "cannot write",
                                store=os.path.join(locked, "store"))

    def test_wrong_argument_types(self):
        x, y = arrays()
        for kwargs, argument in ((dict(model=3.5), "model"), (dict(data=42), "data"),
                                 (dict(policy=7), "policy"), (dict(devices=[3]), "devices"),
                                 (dict(search_space={1: uniform(0, 1)}), "search_space")):
            with self.subTest(argument=argument):
                with self.assertRaises(ArgumentError) as e:
                    self.experiment(**kwargs)
                self.assertEqual(e.exception.argument, argument)
        with self.assertRaises(ArgumentError) as e:
            self.experiment(seed=object()).to_toml(self.store)
        self.assertEqual(e.exception.argument, "seed")
        self.assertIsInstance(e.exception, CkptError)


if __name__ == "__main__":
    main()
