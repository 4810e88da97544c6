"""Experiment.run() and .submit() against the real binaries: a tiny
workload run on an embedded store, interrupted (a KeyboardInterrupt from the
progress callback, then a real SIGINT to this process) and run again, ending
exactly as an uninterrupted run of the same seed; the progress bar's text;
and the same experiment submitted to a real `ckpt-scheduler serve`.

    CKPT_BIN=build/bin PYTHONPATH=python .venv/bin/python tests/python/run_test.py -v
"""
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from unittest_exit import main  # noqa: E402  (tests/unittest_exit.py)

from ckpt_client import (ArgumentError, CkptError, Client, Experiment, Result,  # noqa: E402
                         find_binary, loguniform, parse_progress, uniform)

LAYERS = [{"type": "linear", "out": 16}, {"type": "relu"}, {"type": "linear", "out": 3}]
COLUMNS = ["member", "status", "intervals_done", "val_accuracy", "test_accuracy", "version",
           "step"]


def workload():
    """Three classes of 8 features, learnable in a few steps."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 3))
    x = rng.standard_normal((600, 8)).astype(np.float32)
    y = np.argmax(x @ w, axis=1)
    return {"train": (x[:400], y[:400]), "val": (x[400:500], y[400:500]),
            "test": (x[500:], y[500:])}


INTERVALS = 8
STEPS = 300


def experiment(intervals=INTERVALS):
    return Experiment(LAYERS, workload(),
                      {"lr": loguniform(0.01, 0.3), "momentum": uniform(0.0, 0.9)},
                      name="pyrun", seed=9, population=4, intervals=intervals,
                      steps_per_interval=STEPS, batch_size=16, eval_size=100,
                      devices={"device": "cpu", "slots": 1})


def table(result, hparams=("lr", "momentum")):
    columns = COLUMNS + [f"config/{h}" for h in hparams]
    return result.members[columns].to_dict("records")


class RunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ckpt-pyrun-")
        # The reference: one uninterrupted run.
        cls.reference_store = os.path.join(cls.dir, "reference")
        cls.reference = experiment().run(cls.reference_store, progress=False)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_reference_run_trained_every_member(self):
        r = self.reference
        self.assertIsInstance(r, Result)
        rows = table(r)
        self.assertEqual(len(rows), 4)
        self.assertEqual([row["status"] for row in rows], ["done"] * 4)
        self.assertEqual([row["intervals_done"] for row in rows], [INTERVALS] * 4)
        self.assertEqual([row["step"] for row in rows], [INTERVALS * STEPS] * 4)
        self.assertGreater(rows[0]["val_accuracy"], 0.6)  # well above a third
        # Run again: the finished experiment is read back, nothing trains.
        again = experiment().run(self.reference_store, progress=False)
        self.assertEqual(table(again), rows)

    def test_interrupted_twice_then_resumed_ends_as_the_uninterrupted_run(self):
        store = os.path.join(self.dir, "interrupted")
        seen = []

        def interrupt_after_first_commit(info):
            seen.append(info)
            if info["event"] == "committed":
                raise KeyboardInterrupt  # as a Ctrl-C while the callback runs

        with self.assertRaises(KeyboardInterrupt):
            experiment().run(store, progress=False, callback=interrupt_after_first_commit)
        middle = table(Result(store, "pyrun"))
        done = [row["intervals_done"] for row in middle]
        self.assertTrue(any(d < INTERVALS for d in done), done)
        self.assertGreaterEqual(max(done), 1)
        self.assertEqual(seen[0]["experiment"], "pyrun")
        self.assertEqual(seen[-1]["committed"], 1)

        # A real SIGINT to this process, as a terminal's Ctrl-C: Python raises
        # KeyboardInterrupt in run()'s loop; the scheduler, in a session of its
        # own, gets SIGINT from run() and stops cleanly.
        def sigint_after_next_commit(info):
            if info["event"] == "committed":
                os.kill(os.getpid(), signal.SIGINT)

        with self.assertRaises(KeyboardInterrupt):
            experiment().run(store, progress=False, callback=sigint_after_next_commit)
        later = table(Result(store, "pyrun"))
        self.assertGreater(sum(r["intervals_done"] for r in later), sum(done))
        self.assertTrue(any(row["intervals_done"] < INTERVALS for row in later), later)

        final = experiment().run(store, progress=False)
        self.assertEqual(table(final), table(self.reference))
        self.assertEqual(final.history.shape, self.reference.history.shape)

    def test_an_error_in_the_callback_stops_the_scheduler(self):
        store = os.path.join(self.dir, "callback-error")

        def fail(info):
            if info["event"] == "committed":
                raise RuntimeError("the callback failed")

        with self.assertRaisesRegex(RuntimeError, "the callback failed"):
            experiment(intervals=3).run(store, progress=False, callback=fail)
        # The scheduler is gone (its store's lock is free): a run resumes at once.
        r = experiment(intervals=3).run(store, progress=False)
        self.assertEqual([row["intervals_done"] for row in table(r)], [3] * 4)

    def test_progress_bar_text(self):
        out = io.StringIO()
        infos = []
        r = experiment(intervals=3).run(os.path.join(self.dir, "progress"), progress=out,
                                        callback=infos.append)
        text = out.getvalue()
        last = text.replace("\r", "\n").strip().splitlines()[-1]
        self.assertIn("pyrun: 100%", last)
        self.assertIn("interval 3/3", last)
        self.assertIn("members done 4/4", last)
        self.assertIn("best val_accuracy ", last)
        self.assertIn("samples/s", last)
        self.assertIn("ETA 0s", last)
        best = float(last.split("best val_accuracy ")[1].split(",")[0])
        self.assertAlmostEqual(best, r.members["val_accuracy"].max(), places=4)
        self.assertEqual(infos[-1]["phase"], "done")
        self.assertEqual(infos[-1]["metric"], "val_accuracy")
        self.assertEqual(infos[-1]["members_done"], 4)
        self.assertGreater(infos[-1]["samples_per_s"], 0)
        self.assertEqual([i["interval"] for i in infos], sorted(i["interval"] for i in infos))

    def test_parse_progress(self):
        info = parse_progress("\x1b[Kdemo: training interval 3/6 | members done 0/8 | 812 "
                              "samples/s | best val_neg_mse -0.7712 median -0.9020 | exploits 4 "
                              "| ETA 1m10s")
        self.assertEqual(info["experiment"], "demo")
        self.assertEqual((info["interval"], info["intervals"]), (3, 6))
        self.assertEqual((info["members_done"], info["population"]), (0, 8))
        self.assertEqual(info["metric"], "val_neg_mse")
        self.assertEqual((info["best"], info["median"]), (-0.7712, -0.902))
        self.assertEqual((info["exploits"], info["eta"]), (4, "1m10s"))
        self.assertIsNone(parse_progress("experiment demo: done, 8 members"))


class SubmitTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ckpt-pysubmit-")
        cls.socket = os.path.join(cls.dir, "run", "control.sock")
        cls.store = os.path.join(cls.dir, "store")
        config = os.path.join(cls.dir, "service.toml")
        with open(config, "w") as f:
            f.write(f'store = "{cls.store}"\nruntime_directory = "{cls.dir}/run"\n'
                    'metrics = ""\nlog_progress = false\ngrace_s = 5\n'
                    '[[devices]]\ndevice = "cpu"\nslots = 2\n')
        cls.log = open(os.path.join(cls.dir, "serve.log"), "w")
        cls.serve = subprocess.Popen([find_binary("ckpt-scheduler"), "serve", "--config", config],
                                     stdout=cls.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while True:
            try:
                with Client(cls.socket) as c:
                    c.status()
                break
            except CkptError:
                if cls.serve.poll() is not None or time.time() > deadline:
                    raise
                time.sleep(0.2)

    @classmethod
    def tearDownClass(cls):
        cls.serve.terminate()
        try:
            cls.serve.wait(60)
        except subprocess.TimeoutExpired:
            cls.serve.kill()
            cls.serve.wait()
        cls.log.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_submit_watches_to_the_same_result(self):
        out = io.StringIO()
        infos = []
        exp = experiment(intervals=3)
        r = exp.submit(self.socket, progress=out, callback=infos.append, poll_s=0.2)
        self.assertIsInstance(r, Result)
        self.assertEqual(r.store, self.store)
        rows = table(r)
        self.assertEqual(len(rows), 4)
        self.assertEqual([row["status"] for row in rows], ["done"] * 4)
        self.assertEqual([row["intervals_done"] for row in rows], [3] * 4)
        # The arrays went to the service's store, once.
        data = os.listdir(os.path.join(self.store, "data"))
        self.assertEqual(len(data), 1, data)
        self.assertEqual(infos[-1]["phase"], "done")
        last = out.getvalue().replace("\r", "\n").strip().splitlines()[-1]
        self.assertIn("interval 3/3", last)
        self.assertIn("members done 4/4", last)
        self.assertIn("best val_accuracy", last)
        # Submitted again: the service has it; watching ends at once, same result.
        with Client(self.socket) as c:
            again = experiment(intervals=3).submit(c, progress=False)
        self.assertEqual(table(again), rows)
        # The service trained what a local run trains.
        local = experiment(intervals=3).run(os.path.join(self.dir, "local"), progress=False)
        self.assertEqual(table(local), rows)

    def test_a_module_kept_as_torchscript_goes_to_the_allowed_model_dir(self):
        import torch
        from torch import nn

        from ckpt_client.convert import ConversionWarning

        class Gated(nn.Module):  # torch.sigmoid has no layer: TorchScript
            def __init__(self):
                super().__init__()
                self.fc1 = nn.Linear(8, 16)
                self.fc2 = nn.Linear(16, 3)

            def forward(self, x):
                return self.fc2(torch.sigmoid(self.fc1(x)))

        exp = Experiment(Gated(), workload(), {"lr": loguniform(0.05, 0.5)}, name="pyscript",
                         population=2, intervals=2, steps_per_interval=10, batch_size=16,
                         eval_size=100)
        with self.assertWarns(ConversionWarning):
            r = exp.submit(self.socket, progress=False, poll_s=0.2)
        self.assertFalse(exp.converted.fused)
        models = os.path.join(self.store, "models")
        self.assertEqual(exp.converted.spec,
                         "torchscript:" + os.path.join(models, os.listdir(models)[0]))
        self.assertEqual([row["status"] for row in table(r, hparams=("lr",))], ["done"] * 2)
        best = r.best_module()
        self.assertIsInstance(best, Gated)

    def test_bad_input_is_named_and_leaves_nothing(self):
        exp = Experiment(LAYERS, workload(), {"lr": loguniform(0.3, 0.01)}, name="pybad",
                         population=2)
        before = set(os.listdir(self.store))
        with self.assertRaises(ArgumentError) as e:
            exp.submit(self.socket, progress=False)
        self.assertEqual(e.exception.argument, "search_space['lr']")
        self.assertIn("loguniform(0.3, 0.01)", str(e.exception))
        self.assertIn("must not be below min", str(e.exception))
        with Client(self.socket) as c:
            self.assertNotIn("pybad", [x["id"] for x in c.experiments()])
        self.assertEqual(set(os.listdir(self.store)), before)


if __name__ == "__main__":
    main()
