"""ckpt_client.data: arrays written as ckpt's tensor file (README "Your own
data"), read back with the safetensors library and compared; the file named
by its content's hash and reused; streamed without a second copy of an array;
and the arrays' own errors naming the split.

    PYTHONPATH=python .venv/bin/python tests/python/data_test.py -v
"""
import hashlib
import os
import shutil
import sys
import tempfile
import tracemalloc
import unittest

import numpy as np
import torch
from safetensors.numpy import load_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from unittest_exit import main  # noqa: E402  (tests/unittest_exit.py)

from ckpt_client import ArgumentError  # noqa: E402
from ckpt_client.data import TensorFile, write_tensor_file  # noqa: E402


def images(rng, n, dtype):
    if dtype == np.uint8:
        return rng.integers(0, 256, size=(n, 1, 6, 5), dtype=np.uint8)
    return rng.standard_normal((n, 1, 6, 5)).astype(dtype)


class TensorFileTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ckpt-data-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.rng = np.random.default_rng(1)

    def read_back(self, path):
        with open(path, "rb") as f:
            raw = f.read()
        # The name is the SHA-256 of the bytes (32 hex digits of it).
        self.assertEqual(os.path.basename(path),
                         hashlib.sha256(raw).hexdigest()[:32] + ".safetensors")
        return load_file(path)

    def check_splits(self, got, splits, x_dtype, y_dtype):
        self.assertEqual(sorted(got), sorted(f"{s}.{k}" for s in splits for k in "xy"))
        for s, (x, y) in splits.items():
            x = x.numpy() if isinstance(x, torch.Tensor) else x
            y = y.numpy() if isinstance(y, torch.Tensor) else y
            self.assertEqual(got[f"{s}.x"].dtype, x_dtype, s)
            self.assertEqual(got[f"{s}.y"].dtype, y_dtype, s)
            self.assertEqual(got[f"{s}.x"].shape, x.shape)
            self.assertEqual(got[f"{s}.y"].shape, y.shape)
            np.testing.assert_array_equal(got[f"{s}.x"], x.astype(x_dtype))
            np.testing.assert_array_equal(got[f"{s}.y"], y.astype(y_dtype))

    def test_numpy_and_torch_in_each_dtype_for_classes_and_targets(self):
        for frame in ("numpy", "torch"):
            for dtype in (np.uint8, np.float16, np.float32):
                for task in ("classes", "targets", "targets2d"):
                    with self.subTest(frame=frame, dtype=dtype.__name__, task=task):
                        splits = {}
                        for split, n in (("train", 40), ("val", 7), ("test", 9)):
                            x = images(self.rng, n, dtype)
                            if task == "classes":
                                y = self.rng.integers(0, 10, size=n).astype(np.int64)
                            elif task == "targets":
                                y = self.rng.standard_normal(n).astype(np.float32)
                            else:
                                y = self.rng.standard_normal((n, 3)).astype(np.float32)
                            if frame == "torch":
                                x, y = torch.from_numpy(x), torch.from_numpy(y)
                            splits[split] = (x, y)
                        path = write_tensor_file(splits, self.dir)
                        y_dtype = np.int64 if task == "classes" else np.float32
                        self.check_splits(self.read_back(path), splits, dtype, y_dtype)

    def test_dtypes_converted_to_the_layouts(self):
        # float64 features become float32, any integer labels int64, float64
        # targets float32; non-contiguous views and torch views are read as they are.
        x = self.rng.standard_normal((30, 4))
        labels = self.rng.integers(0, 3, size=30).astype(np.int32)
        path = write_tensor_file((x, labels), self.dir)
        got = self.read_back(path)
        self.assertEqual(got["train.x"].dtype, np.float32)
        np.testing.assert_array_equal(got["train.x"], x.astype(np.float32))
        self.assertEqual(got["train.y"].dtype, np.int64)
        np.testing.assert_array_equal(got["train.y"], labels)

        swapped = x.astype(">f4")  # big-endian, written little-endian
        got = self.read_back(write_tensor_file((swapped, labels), self.dir))
        np.testing.assert_array_equal(got["train.x"], x.astype(np.float32))

        big = self.rng.standard_normal((8, 30)).astype(np.float32)
        view = big.T  # [30, 8], not C-contiguous
        t = torch.from_numpy(big).t()
        targets = torch.linspace(0, 1, 30, dtype=torch.float64)
        path = write_tensor_file({"train": (view, targets), "test": (t, targets)}, self.dir)
        got = self.read_back(path)
        np.testing.assert_array_equal(got["train.x"], view)
        np.testing.assert_array_equal(got["test.x"], view)
        self.assertEqual(got["train.y"].dtype, np.float32)
        np.testing.assert_array_equal(got["train.y"], targets.numpy().astype(np.float32))

    def test_the_same_arrays_reuse_the_file(self):
        x = images(self.rng, 20, np.uint8)
        y = self.rng.integers(0, 10, size=20)
        first = write_tensor_file((x, y), self.dir)
        before = os.stat(first)
        again = write_tensor_file((torch.from_numpy(x.copy()), torch.from_numpy(y.copy())),
                                  self.dir)
        self.assertEqual(again, first)
        after = os.stat(again)
        self.assertEqual((before.st_ino, before.st_mtime_ns), (after.st_ino, after.st_mtime_ns))
        self.assertEqual(os.listdir(self.dir), [os.path.basename(first)])
        y2 = y.copy()
        y2[3] = (y2[3] + 1) % 10
        other = write_tensor_file((x, y2), self.dir)
        self.assertNotEqual(other, first)
        self.assertEqual(len(os.listdir(self.dir)), 2)

    def test_large_arrays_are_streamed_not_copied(self):
        # 96 MiB of float64 features written as float32: converting whole
        # would allocate 48 MiB at once; the writer converts row chunks.
        x = np.zeros((3 << 20, 4), dtype=np.float64)
        x[::1000, 0] = 1.5
        y = np.zeros(x.shape[0], dtype=np.float32)
        tracemalloc.start()
        try:
            path = write_tensor_file((x, y), self.dir)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        self.assertLess(peak, 40 << 20, f"peak {peak >> 20} MiB while writing 96 MiB")
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
        self.assertEqual(os.path.getsize(path), 8 + n + x.size * 4 + y.size * 4)
        got = load_file(path)
        marked = got["train.x"][::1000, 0]
        np.testing.assert_array_equal(marked, np.full(marked.shape, 1.5, np.float32))

    def test_bad_arrays_name_the_split_and_value(self):
        x = images(self.rng, 10, np.uint8)
        y = self.rng.integers(0, 10, size=10)
        cases = [
            ({"train": (x, y[:9])}, None, "data['train']", "x has 10 rows but y has 9"),
            ({"train": (x, y), "test": (x[:4], y[:5])}, None, "data['test']",
             "x has 4 rows but y has 5"),
            ({"train": (x, np.where(y == y[2], -1, y))}, None, "data['train']",
             "label -1 at row 2 is outside"),
            ({"train": (x, y), "val": (x, np.full(10, 12))}, 10, "data['val']",
             "label 12 at row 0 is outside [0, 10)"),
            ({"train": (x.astype(np.int16), y)}, None, "data['train']", "dtype int16"),
            ({"train": (x, y.astype(bool))}, None, "data['train']", "dtype bool"),
            ({"train": (torch.zeros(10, 3, dtype=torch.bfloat16), torch.from_numpy(y))}, None,
             "data['train']", "torch.bfloat16"),
            ({"train": x}, None, "data['train']", "must be a pair (x, y)"),
            ({"val": (x, y)}, None, "data", "needs a 'train' split"),
        ]
        for splits, classes, argument, why in cases:
            with self.subTest(argument=argument, why=why):
                with self.assertRaises(ArgumentError) as e:
                    TensorFile(splits, classes=classes)
                self.assertEqual(e.exception.argument, argument)
                self.assertIn(why, str(e.exception))
                self.assertTrue(str(e.exception).startswith(argument + " = "), str(e.exception))
                self.assertIsInstance(e.exception, ValueError)
        self.assertEqual(os.listdir(self.dir), [])


if __name__ == "__main__":
    main()
