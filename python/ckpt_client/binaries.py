"""Where ckpt's programs are: ``find_binary("ckpt-scheduler")``.

The package drives ckpt through its binaries (``ckpt-scheduler``,
``ckpt-tool``, ``ckpt-worker``); it never opens the store itself. They are
looked up, first found wins, in
  1. ``$CKPT_BIN/<name>`` (a directory, e.g. a build's ``build/bin``);
  2. ``PATH``;
  3. the checkout's ``build/bin``, when this package runs from a checkout's
     ``python/`` directory (``python/ckpt_client/../../build/bin``).
Otherwise ``CkptError("NotFound")`` says which of these to set.
"""

import os
import shutil

from .client import CkptError

KNOWN = ("ckpt-scheduler", "ckpt-tool", "ckpt-worker")


def _executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _checkout_bin():
    """The checkout's build/bin when this file lies in <checkout>/python/ckpt_client."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", ".."))
    return os.path.join(root, "build", "bin")


def find_binary(name: str) -> str:
    """The absolute path of ckpt's program ``name`` ("ckpt-scheduler",
    "ckpt-tool" or "ckpt-worker"), searched in $CKPT_BIN, PATH, then the
    checkout's build/bin; raises CkptError("NotFound") naming the binary and
    the three ways to provide it."""
    if name not in KNOWN:
        raise ValueError(f"find_binary: unknown binary {name!r}; one of {', '.join(KNOWN)}")
    tried = []
    env = os.environ.get("CKPT_BIN")
    if env:
        candidate = os.path.join(env, name)
        if _executable(candidate):
            return os.path.abspath(candidate)
        tried.append(f"$CKPT_BIN={env}")
    found = shutil.which(name)
    if found:
        return os.path.abspath(found)
    tried.append("PATH")
    checkout = _checkout_bin()
    candidate = os.path.join(checkout, name)
    if _executable(candidate):
        return candidate
    tried.append(checkout)
    raise CkptError(
        "NotFound",
        f"{name} not found (looked in {', '.join(tried)}): set CKPT_BIN=<dir> to the directory "
        f"holding ckpt's binaries, put {name} on PATH, or build the checkout (make build)")
