"""scripts/check-layers on small trees: a clean one passes; each kind of broken
rule (a forbidden component, another component's private header, a confined
third-party header, a third-party header in a public header, an unknown ckpt
header) fails naming the file and line."""
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from unittest_exit import main  # noqa: E402  (tests/unittest_exit.py)

CHECKER = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "..", "scripts", "check-layers")


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def clean_tree(root):
    write(root, "base/include/ckpt/base/status.h", "#include <string>\n")
    write(root, "store/format/include/ckpt/format/checkpoint.h",
          '#include "ckpt/base/status.h"\n')
    write(root, "records/include/ckpt/records/config.h", '#include "ckpt/format/checkpoint.h"\n')
    write(root, "worker/src/trainer.cc", '#include "model_internal.h"\n#include <torch/torch.h>\n')
    write(root, "worker/src/model_internal.h", '#include "ckpt/format/checkpoint.h"\n')
    write(root, "scheduler/src/experiment.h", '#include "ckpt/records/config.h"\n')
    write(root, "scheduler/src/experiment.cc", '#include "experiment.h"\n')
    for rel in ("scheduler/include/ckpt/scheduler/control_client.h",
                "scheduler/include/ckpt/scheduler/summary.h",
                "scheduler/include/ckpt/scheduler/summary_text.h",
                "scheduler/src/control_client.cc", "scheduler/src/control_protocol.cc",
                "scheduler/src/control_protocol.h", "scheduler/src/summary_text.cc"):
        write(root, rel, '#include "ckpt/records/config.h"\n')
    write(root, "scheduler/include/ckpt/scheduler/scheduler.h", '#include "ckpt/records/config.h"\n')
    write(root, "tools/src/main.cc", '#include "ckpt/scheduler/control_client.h"\n')


def run(root):
    p = subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)
    return p.returncode, p.stdout


class CheckLayersTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name
        clean_tree(self.root)

    def tearDown(self):
        self.dir.cleanup()

    def expect_refused(self, rel, text, *words):
        write(self.root, rel, text)
        code, out = run(self.root)
        self.assertEqual(code, 1, out)
        for w in words:
            self.assertIn(w, out)

    def test_a_clean_tree_passes(self):
        code, out = run(self.root)
        self.assertEqual(code, 0, out)
        self.assertIn("tools -> control_client", out)

    def test_the_worker_may_not_use_the_records(self):
        self.expect_refused("worker/src/worker_loop.cc", '#include "ckpt/records/config.h"\n',
                            "worker/src/worker_loop.cc:1", "worker includes ckpt/records/config.h")

    def test_the_tool_may_not_use_the_engine(self):
        self.expect_refused("tools/src/x.cc", '\n#include "ckpt/scheduler/scheduler.h"\n',
                            "tools/src/x.cc:2", "of scheduler")

    def test_a_private_header_of_another_folder(self):
        self.expect_refused("tools/src/y.cc", '#include "experiment.h"\n',
                            "tools/src/y.cc:1", "private header")

    def test_a_confined_library_elsewhere(self):
        self.expect_refused("scheduler/src/z.cc", "#include <rocksdb/db.h>\n",
                            "scheduler/src/z.cc:1", "only store/src/")

    def test_a_third_party_header_in_a_public_header(self):
        self.expect_refused("records/include/ckpt/records/t.h", "#include <nlohmann/json.hpp>\n",
                            "records/include/ckpt/records/t.h:1", "keep the dependency private")

    def test_a_ckpt_header_no_component_holds(self):
        self.expect_refused("store/src/a.cc", '#include "ckpt/nowhere/x.h"\n',
                            "which no component's include/ folder holds")

    def test_a_moved_control_client_file_is_named(self):
        os.remove(os.path.join(self.root, "scheduler/src/summary_text.cc"))
        code, out = run(self.root)
        self.assertEqual(code, 1, out)
        self.assertIn("scheduler/src/summary_text.cc: listed in CONTROL_CLIENT_FILES", out)


if __name__ == "__main__":
    main()
