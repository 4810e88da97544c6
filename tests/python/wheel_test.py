"""The package as users install it: a wheel built from python/ (pip wheel
--no-deps --no-build-isolation), installed into a fresh venv, and a tiny
experiment run with that venv's python from a folder outside the source
tree, finding the binaries through $CKPT_BIN only.

The fresh venv sees the system's packages (--system-site-packages: Debian's
torch and NumPy) and, through a .pth file, the project venv's PyPI packages
(tqdm, pandas, safetensors), so that nothing is downloaded; its own
site-packages come first, so ckpt_client is the wheel's (checked).

    CKPT_BIN=build/bin .venv/bin/python tests/python/wheel_test.py -v
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))
from unittest_exit import main  # noqa: E402  (tests/unittest_exit.py)

SCRIPT = r"""
import json, os, sys
import numpy as np
import ckpt_client
from ckpt_client import Experiment, loguniform
assert "torch" not in sys.modules
rng = np.random.default_rng(3)
x = rng.standard_normal((200, 5)).astype(np.float32)
y = (x[:, 0] > 0).astype(np.int64)
exp = Experiment([{"type": "linear", "out": 8}, {"type": "relu"}, {"type": "linear", "out": 2}],
                 {"train": (x[:150], y[:150]), "val": (x[150:], y[150:])},
                 {"lr": loguniform(0.01, 0.3)}, population=2, intervals=2,
                 steps_per_interval=10, batch_size=16, eval_size=50,
                 devices={"device": "cpu", "slots": 1})
r = exp.run(progress=False)
print(json.dumps({"file": ckpt_client.__file__, "version": ckpt_client.__version__,
                  "store": r.store, "members": r.members[["member", "status"]].to_dict("records"),
                  "cwd": os.getcwd()}))
"""


class WheelTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ckpt-wheel-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def run_checked(self, cmd, **kwargs):
        p = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
        self.assertEqual(p.returncode, 0, f"{cmd}:\n{p.stdout}\n{p.stderr}")
        return p

    def test_wheel_in_a_fresh_venv_runs_an_experiment(self):
        # Built from a copy, so that the build leaves nothing in the source tree.
        source = os.path.join(self.dir, "source")
        shutil.copytree(os.path.join(ROOT, "python"), source,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        wheels = os.path.join(self.dir, "wheels")
        self.run_checked([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "-q", "-w", wheels, source])
        built = os.listdir(wheels)
        self.assertEqual(len(built), 1, built)
        self.assertTrue(built[0].startswith("ckpt_client-") and built[0].endswith(".whl"), built)

        venv = os.path.join(self.dir, "venv")
        self.run_checked(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv])
        python = os.path.join(venv, "bin", "python")
        purelib = self.run_checked([python, "-c", "import sysconfig; "
                                    "print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
        with open(os.path.join(purelib, "ckpt-test-deps.pth"), "w") as f:
            f.write(sysconfig.get_paths()["purelib"] + "\n")
        # --ignore-installed: the project venv seen through the .pth may hold
        # the same version (setup-deps installs python/ there), which pip would
        # call satisfied and leave the fresh venv without the wheel.
        self.run_checked([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                          "--ignore-installed", os.path.join(wheels, built[0])])

        work = os.path.join(self.dir, "work")
        os.mkdir(work)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CKPT_STORE")}
        env["CKPT_BIN"] = os.environ["CKPT_BIN"]
        p = self.run_checked([python, "-c", SCRIPT], cwd=work, env=env)
        out = json.loads(p.stdout.strip().splitlines()[-1])
        self.assertTrue(out["file"].startswith(purelib), out["file"])
        self.assertFalse(out["file"].startswith(ROOT), out["file"])
        self.assertEqual(out["store"], os.path.join(work, "ckpt-store"))  # the default store
        self.assertEqual([m["status"] for m in out["members"]], ["done", "done"])
        with open(os.path.join(ROOT, "python", "pyproject.toml"), "rb") as f:
            import tomllib
            self.assertEqual(out["version"], tomllib.load(f)["project"]["version"])
        self.assertEqual(sorted(os.listdir(os.path.join(work, "ckpt-store", "data"))).__len__(), 1)


if __name__ == "__main__":
    main()
