"""A user's arrays as ckpt's tensor file, written once and streamed.

The layout is README's "Your own data" (``ckpt/format/tensor_dataset.h``):
one safetensors file holding ``train.x`` (uint8, float16 or float32;
``[N, C, H, W]`` images or ``[N, F]`` features), ``train.y`` (int64 class
labels ``[N]`` or float32 regression targets ``[N]`` / ``[N, T]``), and
optionally ``val.x``/``val.y`` and ``test.x``/``test.y``.

The file's name carries the SHA-256 of its bytes, so writing the same arrays
again finds the file and writes nothing. The arrays are never copied whole:
the hash and the file are made from row chunks of each array's own buffer
(a chunk is converted when the dtype must change: float64 features to
float32, integer labels to int64, float targets to float32).

NumPy and torch arrays are both accepted (torch ones through ``.numpy()``,
which shares the CPU tensor's memory); torch is never imported here.
"""

import hashlib
import json
import os
import tempfile

import numpy as np

__all__ = ["DataFile", "IDX_DATASETS", "SPLITS", "TensorFile", "as_splits", "write_tensor_file"]

SPLITS = ("train", "val", "test")
# The MNIST family ckpt reads as IDX files, and where Debian installs them.
IDX_DATASETS = {"fashion-mnist": "/usr/share/datasets/fashion-mnist",
                "mnist": "/usr/share/datasets/mnist"}
_CHUNK_BYTES = 16 << 20
_ST_DTYPE = {np.dtype(np.uint8): "U8", np.dtype(np.float16): "F16",
             np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}


def _bad(argument, value, why):
    from .experiment import ArgumentError
    return ArgumentError(argument, value, why)


def _to_numpy(a, argument):
    """The array as NumPy without a copy where the memory allows it."""
    mod = type(a).__module__
    if mod.startswith("torch"):
        t = a.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        try:
            return t.numpy()
        except TypeError as e:  # bfloat16, complex, ...
            raise _bad(argument, a, f"dtype {t.dtype} has no NumPy equivalent ({e}); "
                       "use uint8, float16 or float32") from None
    if isinstance(a, np.ndarray):
        return a
    try:
        return np.asarray(a)
    except Exception as e:
        raise _bad(argument, a, f"is not an array ({e})") from None


def _target_dtype_x(x, argument):
    kind = np.dtype(x.dtype.type)  # big-endian arrays too: written little-endian
    if kind in (np.uint8, np.float16, np.float32):
        return kind
    if kind == np.float64:
        return np.dtype(np.float32)
    raise _bad(argument, x,
               f"x has dtype {x.dtype}; ckpt trains on uint8, float16 or float32 inputs")


def _target_dtype_y(y, argument):
    if y.dtype.kind in "iu":
        return np.dtype(np.int64)
    if y.dtype.kind == "f":
        return np.dtype(np.float32)
    raise _bad(argument, y,
               f"y has dtype {y.dtype}; give integer class labels or float regression targets")


class TensorFile:
    """The arrays of the splits given, checked and planned as one file.

    ``splits``: split name -> (x, y). Raises ArgumentError naming the split
    for what only the arrays show: x and y whose rows disagree, dtypes ckpt
    does not train on, and class labels outside ``[0, classes)`` (``classes``
    None: labels must not be negative). Everything else (ranks, shapes
    agreeing between splits, finite floats) the scheduler's check reports.
    """

    def __init__(self, splits, argument="data", classes=None):
        self.tensors = []  # (name, array, dtype to write)
        for split in SPLITS:
            if split not in splits:
                continue
            where = f"{argument}[{split!r}]"
            pair = splits[split]
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise _bad(where, pair, "must be a pair (x, y) of arrays")
            x = _to_numpy(pair[0], where)
            y = _to_numpy(pair[1], where)
            if x.ndim == 0 or y.ndim == 0:
                raise _bad(where, (x, y), "x and y must have a row dimension")
            if x.shape[0] != y.shape[0]:
                raise _bad(where, (x, y), f"x has {x.shape[0]} rows but y has {y.shape[0]}")
            xt = _target_dtype_x(x, where)
            yt = _target_dtype_y(y, where)
            if yt == np.int64 and y.size:
                self._check_labels(y, where, classes)
            self.tensors.append((f"{split}.x", x, xt))
            self.tensors.append((f"{split}.y", y, yt))
        if "train" not in splits:
            raise _bad(argument, sorted(splits), "needs a 'train' split (x, y)")
        # What safetensors' own writer does: larger elements first, so every
        # tensor starts aligned to its element size.
        self.tensors.sort(key=lambda t: (-t[2].itemsize, t[0]))

    @staticmethod
    def _check_labels(y, where, classes):
        low = int(y.min())
        high = int(y.max())
        limit = classes if classes else None
        if low < 0 or (limit is not None and high >= limit):
            bad = low if low < 0 else high
            row = int(np.argwhere(y == bad)[0][0])
            span = f"[0, {limit})" if limit is not None else "[0, classes)"
            raise _bad(where, y,
                       f"y: label {bad} at row {row} is outside {span}" +
                       (" (classes=%d)" % limit if limit is not None else ""))

    def header(self):
        """The safetensors header, padded with spaces to 8 bytes."""
        meta = {}
        offset = 0
        for name, a, dtype in self.tensors:
            size = a.size * dtype.itemsize
            meta[name] = {"dtype": _ST_DTYPE[dtype], "shape": list(a.shape),
                          "data_offsets": [offset, offset + size]}
            offset += size
        text = json.dumps(meta, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        return len(text).to_bytes(8, "little") + text

    def chunks(self):
        """Each tensor's bytes, little-endian, in row chunks of its buffer."""
        for _, a, dtype in self.tensors:
            if a.size == 0:
                continue
            row_bytes = max(1, (a.size // a.shape[0]) * max(a.dtype.itemsize, dtype.itemsize))
            rows = max(1, _CHUNK_BYTES // row_bytes)
            for i in range(0, a.shape[0], rows):
                c = a[i:i + rows]
                want = dtype.newbyteorder("<")
                if c.dtype != want:
                    c = c.astype(want)
                c = np.ascontiguousarray(c)
                yield memoryview(c.reshape(-1).view(np.uint8))

    def digest(self):
        h = hashlib.sha256(self.header())
        for chunk in self.chunks():
            h.update(chunk)
        return h.hexdigest()

    def size(self):
        return len(self.header()) + sum(a.size * d.itemsize for _, a, d in self.tensors)

    def write(self, folder):
        """Writes the file into ``folder`` as ``<sha256>.safetensors`` unless
        a file of that name and size is there; returns (path, created)."""
        path = os.path.join(folder, self.digest()[:32] + ".safetensors")
        if os.path.isfile(path) and os.path.getsize(path) == self.size():
            return path, False
        fd, tmp = tempfile.mkstemp(prefix=".writing-", suffix=".safetensors", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(self.header())
                for chunk in self.chunks():
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return path, True


class DataFile:
    """Data that is already a file: ``[data]``'s ``format``, ``path`` and
    ``dataset`` as the experiment file has them (None: not written).

    ``DataFile.of("fashion-mnist")`` is the IDX dataset of that name;
    ``DataFile.of("train.safetensors")`` a tensor file (the format from the
    suffix: .safetensors, .npz); ``DataFile.of("/dir")`` an IDX directory.
    """

    def __init__(self, path=None, format=None, dataset=None):
        self.path = path
        self.format = format
        self.dataset = dataset

    @classmethod
    def of(cls, value):
        text = os.fspath(value)
        if text in IDX_DATASETS:
            return cls(dataset=text)
        path = os.path.abspath(os.path.expanduser(text))
        if text.endswith(".npz"):
            return cls(path=path, format="npz")
        if os.path.isdir(path):
            return cls(path=path, format="idx")
        return cls(path=path, format="safetensors")

    def table(self):
        """[data]'s keys for this file, in the file's order."""
        return {k: v for k, v in (("format", self.format), ("dataset", self.dataset),
                                  ("path", self.path)) if v is not None}

    def input_shape(self):
        """One sample's shape ([C, H, W] or [F]): read from the tensor file's
        header, or the MNIST family's [1, 28, 28]; None when unreadable."""
        if self.format in (None, "idx"):
            return (1, 28, 28)
        try:
            if self.format == "npz":
                import zipfile
                with zipfile.ZipFile(self.path) as z, z.open("train.x.npy") as f:
                    version = np.lib.format.read_magic(f)
                    shape = np.lib.format._read_array_header(f, version)[0]
                return tuple(shape[1:])
            with open(self.path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                if n > 100 << 20:
                    return None
                header = json.loads(f.read(n))
            return tuple(header["train.x"]["shape"][1:])
        except (OSError, KeyError, ValueError, TypeError):
            return None

    def __eq__(self, other):
        return isinstance(other, DataFile) and self.table() == other.table()

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in (("path", self.path), ("format", self.format),
                                                   ("dataset", self.dataset)) if v is not None)
        return f"DataFile({args})"


def as_splits(data, argument="data"):
    """The arrays of ``data`` as {split: (x, y)}, or None when ``data`` names
    a file or an IDX dataset. ``(x, y)`` is the train split; a dict maps
    "train", "val" and "test" to pairs."""
    if isinstance(data, dict):
        unknown = [k for k in data if k not in SPLITS]
        if unknown:
            raise _bad(argument, unknown[0], "unknown split; the splits are 'train', 'val', 'test'")
        return dict(data)
    if isinstance(data, (tuple, list)):
        if len(data) != 2:
            raise _bad(argument, f"a sequence of {len(data)}",
                       "must be (x, y), a dict of splits, a file path or an IDX dataset name")
        return {"train": tuple(data)}
    return None


def write_tensor_file(data, folder, classes=None):
    """Writes ``data`` ((x, y) or {split: (x, y)}) into ``folder`` (created)
    in ckpt's tensor-file layout; returns the file's path. Rewrites nothing
    when the same arrays were written there before."""
    os.makedirs(folder, exist_ok=True)
    return TensorFile(as_splits(data), classes=classes).write(folder)[0]
