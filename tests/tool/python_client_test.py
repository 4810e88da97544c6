"""The Python client (python/ckpt_client) against a real `ckpt-scheduler serve`
on a temporary socket and store, with real workers: every verb, errors,
watch, results and load_state_dict into a real nn.Module.

Run by ctest (tests/tool/CMakeLists.txt) with the project venv's python:
    CKPT_SCHEDULER_BIN=... CKPT_TOOL=... python -m unittest tests/tool/python_client_test.py
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from ckpt_client import CkptError, Client, load_state_dict, results  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from unittest_exit import main  # noqa: E402  (tests/unittest_exit.py)


def experiment(name, intervals, population=2, steps=4):
    return f"""name = "{name}"
seed = 7
[model]
spec = "lenet5"
optimizer = "sgd"
[data]
batch_size = 16
eval_size = 200
[population]
size = {population}
steps_per_interval = {steps}
intervals = {intervals}
[search_space.lr]
type = "log_uniform"
min = 0.001
max = 0.1
[policy]
kind = "pbt"
mode = "sync"
quantile = 0.5
"""


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ckpt-pyclient-")
        cls.socket = os.path.join(cls.dir, "run", "control.sock")
        cls.store = os.path.join(cls.dir, "store")
        config = os.path.join(cls.dir, "service.toml")
        with open(config, "w") as f:
            f.write(f'store = "{cls.store}"\nruntime_directory = "{cls.dir}/run"\n'
                    'metrics = ""\nlog_progress = false\ngrace_s = 5\n'
                    '[[devices]]\ndevice = "cpu"\nslots = 2\nfusion = "plain"\n')
        cls.log = open(os.path.join(cls.dir, "serve.log"), "w")
        cls.serve = subprocess.Popen([os.environ["CKPT_SCHEDULER_BIN"], "serve", "--config", config],
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

    def client(self):
        c = Client(self.socket)
        self.addCleanup(c.close)
        return c

    def test_no_service_says_what_to_do(self):
        with self.assertRaises(CkptError) as e:
            Client(os.path.join(self.dir, "nothing.sock"))
        self.assertIn("no ckpt-scheduler answers at", str(e.exception))
        self.assertIn("systemctl status ckpt-scheduler", str(e.exception))

    def test_every_verb(self):
        c = self.client()
        with self.assertRaises(CkptError) as e:
            c.submit('name = "bad"\n[population]\nsize = 0\n')
        self.assertEqual(e.exception.code, "InvalidArgument")
        self.assertIn("population.size", e.exception.message)
        self.assertIn("line 3", e.exception.message)

        path = os.path.join(self.dir, "pylive.toml")
        with open(path, "w") as f:
            f.write(experiment("pylive", 100000))
        self.assertEqual(c.submit(path), "pylive")
        s = c.status()
        self.assertEqual(s["service"]["version"], "0.1.0")
        self.assertEqual(s["service"]["store"], self.store)
        self.assertIn("pylive", [e["id"] for e in s["experiments"]])

        deadline = time.time() + 180
        while c.status("pylive")["member_intervals"] < 2:
            self.assertLess(time.time(), deadline)
            time.sleep(0.5)
        workers = c.workers()
        self.assertEqual(len(workers), 1)
        self.assertEqual(workers[0]["device"], "cpu")
        self.assertEqual(workers[0]["capacity"], 2)  # slots, known once it said HELLO
        self.assertTrue(workers[0]["ready"])
        one = c.status("pylive")
        self.assertEqual(len(one["members"]), 2)
        self.assertTrue(one["progress"].startswith("pylive: training interval"), one["progress"])

        c.pause("pylive")
        self.assertEqual(c.status("pylive")["status"], "paused")
        c.resume("pylive")
        self.assertEqual(c.status("pylive")["status"], "running")

        with self.assertRaises(CkptError) as e:
            c.status("nope")
        self.assertEqual(e.exception.code, "NotFound")
        self.assertIn("experiments:", e.exception.message)
        self.assertIn("pylive", e.exception.message)

        c.stop("pylive")
        self.assertEqual(c.status("pylive")["status"], "stopped")
        with self.assertRaises(CkptError) as e:
            c.stop("pylive")
        self.assertEqual(e.exception.code, "FailedPrecondition")

    def test_watch_results_and_state(self):
        c = self.client()
        name = c.submit(experiment("pyshort", 2))
        events = list(c.watch(name, interval=0.2))
        self.assertGreaterEqual(len(events), 2)
        self.assertEqual(events[-1]["phase"], "done")
        self.assertEqual(events[-1]["status"], "done")
        self.assertTrue(all("progress" in e for e in events))
        intervals = [e["member_intervals"] for e in events]
        self.assertEqual(intervals, sorted(intervals))

        # pandas is in the project venv (scripts/setup-deps): a DataFrame,
        # one row per member, best first, Ray Tune's column names.
        import pandas

        table = results(name, client=c)
        self.assertIsInstance(table, pandas.DataFrame)
        self.assertEqual(len(table), 2)
        # The scores under the experiment's metric's own name.
        for column in ("experiment", "member", "status", "intervals_done", "val_accuracy",
                       "test_accuracy", "version", "step", "config/lr"):
            self.assertIn(column, table.columns)
        self.assertNotIn("val_score", table.columns)
        self.assertTrue(table["val_accuracy"].is_monotonic_decreasing, table)
        self.assertEqual(list(table["status"]), ["done", "done"])
        rows = table.to_dict("records")
        self.assertEqual({r["member"] for r in rows}, {"m000", "m001"})
        self.assertEqual(table["config/lr"].dtype.kind, "f")
        self.assertGreaterEqual(rows[0]["val_accuracy"], rows[1]["val_accuracy"])
        # Without pandas: the same records as a list of dicts.
        saved = sys.modules.get("pandas")
        sys.modules["pandas"] = None  # makes `import pandas` raise ImportError
        try:
            plain = results(name, client=c)
        finally:
            sys.modules["pandas"] = saved
        self.assertIsInstance(plain, list)
        self.assertEqual([r["member"] for r in plain], list(table["member"]))
        self.assertEqual([r["val_accuracy"] for r in plain], list(table["val_accuracy"]))
        self.assertEqual(plain[0]["config/lr"], rows[0]["config/lr"])

        import torch
        from export_example import LeNet5

        ref = f"{name}/{rows[0]['member']}@{rows[0]['version']}"
        state, meta = load_state_dict(ref, client=c, metadata=True)
        self.assertEqual(meta["ckpt.model_spec"], "lenet5")
        self.assertFalse([k for k in state if k.startswith("optim.")])
        model = LeNet5()
        model.load_state_dict(state)  # strict: every name and shape matches
        same = load_state_dict(ref, store=self.store)
        self.assertEqual(sorted(same), sorted(state))
        for k in state:
            self.assertTrue(torch.equal(same[k], state[k]), k)
        with self.assertRaises(CkptError) as e:
            load_state_dict(f"{name}/m999", store=self.store)
        self.assertIn("m999", e.exception.message)

    def test_two_clients_at_once(self):
        a, b = self.client(), self.client()
        name = a.submit(experiment("pytwo", 100000))
        watch = b.watch(name, interval=0.2)
        first = next(watch)
        self.assertEqual(first["id"], name)
        a.stop(name)
        last = list(watch)[-1]
        self.assertEqual(last["status"], "stopped")
        self.assertEqual(a.status(name)["status"], "stopped")


if __name__ == "__main__":
    main()
