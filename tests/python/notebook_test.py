"""examples/pbt_from_python.ipynb executed top to bottom with nbclient.

The notebook runs in a kernel of this test's own python (the project venv's),
with a small population (CKPT_EXAMPLE_POPULATION and friends) on the real
Fashion-MNIST IDX files and ckpt's real binaries (CKPT_BIN). Checked: every
cell ran, the best member's test accuracy computed in PyTorch clears a floor
and agrees with ckpt's own evaluation, the plot cell produced a PNG, the
members cell an HTML table; and the notebook is the one
examples/sync_notebook.py makes of examples/pbt_from_python.py.

    CKPT_BIN=build/bin PYTHONPATH=python .venv/bin/python tests/python/notebook_test.py -v
"""
import importlib.util
import json
import os
import re
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CKPT_SOURCE_DIR") or os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SOURCE, "tests"))

EXAMPLE = os.path.join(SOURCE, "examples", "pbt_from_python")
FASHION_MNIST = os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
# The small run: 4 members, 4 intervals of 50 steps (batch 64).
SMALL = {"CKPT_EXAMPLE_POPULATION": "4", "CKPT_EXAMPLE_INTERVALS": "4",
         "CKPT_EXAMPLE_STEPS": "50"}
ACCURACY_FLOOR = 0.6
MISSING = [m for m in ("nbclient", "nbformat", "ipykernel")
           if importlib.util.find_spec(m) is None]


def load_sync():
    spec = importlib.util.spec_from_file_location(
        "sync_notebook", os.path.join(SOURCE, "examples", "sync_notebook.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outputs(nb, kind):
    """(cell index, output) of every output of `kind` ("stream", "error", ...)."""
    return [(i, o) for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == kind]


@unittest.skipIf(MISSING, f"{', '.join(MISSING)} not installed in {sys.executable} "
                 "(scripts/setup-deps installs them)")
class NotebookTest(unittest.TestCase):

    def test_the_notebook_is_the_scripts(self):
        with open(EXAMPLE + ".ipynb", encoding="utf-8") as f:
            committed = f.read()
        self.assertEqual(committed, load_sync().notebook_text(EXAMPLE + ".py"),
                         "examples/pbt_from_python.ipynb is out of date: run "
                         "examples/sync_notebook.py examples/pbt_from_python.py")

    @unittest.skipUnless(os.path.isdir(FASHION_MNIST),
                         f"no Fashion-MNIST IDX files in {FASHION_MNIST} "
                         "(Debian's dataset-fashion-mnist; scripts/setup-deps)")
    def test_runs_top_to_bottom_and_scores_the_best_member(self):
        import nbformat
        from nbclient import NotebookClient

        with tempfile.TemporaryDirectory(prefix="ckpt-notebook-test-") as d:
            # A kernel of this very python: the venv's torch and ckpt_client.
            kernels = os.path.join(d, "jupyter", "kernels", "ckpt-test")
            os.makedirs(kernels)
            with open(os.path.join(kernels, "kernel.json"), "w") as f:
                json.dump({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f",
                                    "{connection_file}"],
                           "display_name": "ckpt test", "language": "python"}, f)
            env = dict(os.environ)
            try:
                os.environ.update(SMALL)
                os.environ["JUPYTER_PATH"] = os.path.join(d, "jupyter")
                # Nothing of the user's: connection files, IPython profile
                # (startup scripts) and matplotlib's cache in the temp dir.
                os.environ["JUPYTER_RUNTIME_DIR"] = os.path.join(d, "runtime")
                os.environ["IPYTHONDIR"] = os.path.join(d, "ipython")
                os.environ["MPLCONFIGDIR"] = os.path.join(d, "matplotlib")
                os.environ["CKPT_STORE"] = os.path.join(d, "store")
                os.environ["FASHION_MNIST"] = FASHION_MNIST
                # The kernel's own inline backend draws the figures (a
                # non-interactive MPLBACKEND would leave no image/png).
                os.environ.pop("MPLBACKEND", None)
                nb = nbformat.read(EXAMPLE + ".ipynb", as_version=4)
                NotebookClient(nb, timeout=600, kernel_name="ckpt-test",
                               resources={"metadata": {"path": d}}).execute()
            finally:
                os.environ.clear()
                os.environ.update(env)
            with open(os.path.join(d, "executed.ipynb"), "w") as f:
                nbformat.write(nb, f)

        self.assertEqual(outputs(nb, "error"), [])
        code = [c for c in nb.cells if c.cell_type == "code"]
        self.assertTrue(all(c.get("execution_count") for c in code), "a cell did not run")

        text = "".join(o.get("text", "") for _, o in outputs(nb, "stream"))
        m = re.search(r"test accuracy of (m\d+) in PyTorch: ([0-9.]+) "
                      r"\(ckpt's own evaluation: ([0-9.]+)\)", text)
        self.assertIsNotNone(m, text[-2000:])
        accuracy, ckpt_accuracy = float(m.group(2)), float(m.group(3))
        self.assertGreater(accuracy, ACCURACY_FLOOR, text[-2000:])
        # The same weights and inputs as ckpt's final evaluation: equal but
        # for float rounding at an argmax tie or two of the 10,000 images.
        self.assertAlmostEqual(accuracy, ckpt_accuracy, delta=0.002)

        shown = [o for _, o in outputs(nb, "display_data") + outputs(nb, "execute_result")]
        pngs = [o for o in shown if "image/png" in o.get("data", {})]
        self.assertEqual(len(pngs), 1, [list(o.get("data", {})) for o in shown])
        self.assertTrue(any("val_accuracy" in o.get("data", {}).get("text/html", "")
                            and "config/lr" in o["data"]["text/html"] for o in shown))


if __name__ == "__main__":
    from unittest_exit import main
    main()
