"""The control-socket client (stdlib only) and the state loader.

The protocol: one JSON object per line each way over a Unix stream socket;
``{"verb": ..., fields}`` answered by ``{"ok": true, ...}`` or
``{"ok": false, "code": ..., "error": ...}``. Its verbs and reply forms are
documented in ``scheduler/include/ckpt/scheduler/control_client.h``.
"""

import grp
import json
import os
import shutil
import socket as _socket
import subprocess
import tempfile
import time

DEFAULT_SOCKET = "/run/ckpt/control.sock"


class CkptError(Exception):
    """An error reply of the service, or a connection it did not accept.

    ``code`` is the service's status code name ("NotFound",
    "InvalidArgument", "FailedPrecondition", ...) or "Unavailable" when no
    service answers.
    """

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def _group_to_join(path):
    """The group owning the socket, else its directory."""
    for p in (path, os.path.dirname(path) or "."):
        try:
            gid = os.stat(p).st_gid
        except OSError:
            continue
        try:
            return grp.getgrgid(gid).gr_name
        except KeyError:
            return str(gid)
    return "ckpt"


def _no_service(path, why):
    return CkptError(
        "Unavailable",
        f"no ckpt-scheduler answers at {path}: is the service running? "
        f"`systemctl status ckpt-scheduler` ({why})")


def _permission_denied(path):
    g = _group_to_join(path)
    return CkptError(
        "FailedPrecondition",
        f"permission denied on {path}: add yourself to group {g} "
        f"(`sudo usermod -aG {g} $USER`, then log in again)")


class Client:
    """One connection to a running ``ckpt-scheduler serve``.

    ``socket``: the control socket (default ``$CKPT_SOCKET``, else
    ``/run/ckpt/control.sock``). ``timeout``: seconds for connecting and for
    each request. Not thread-safe: one request at a time; use one Client per
    thread. Usable as a context manager.
    """

    def __init__(self, socket=None, timeout=30.0):
        self.socket_path = socket or os.environ.get("CKPT_SOCKET") or DEFAULT_SOCKET
        self.timeout = timeout
        self._sock = None
        self._buffer = b""
        self._next_id = 1
        self._connect()

    def _connect(self):
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.socket_path)
        except FileNotFoundError:
            s.close()
            raise _no_service(self.socket_path, "no socket there") from None
        except ConnectionRefusedError:
            s.close()
            raise _no_service(self.socket_path, "a stale socket: nothing listens on it") from None
        except PermissionError:
            s.close()
            raise _permission_denied(self.socket_path) from None
        self._sock = s
        self._buffer = b""

    def close(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def call(self, verb, **fields):
        """Sends one request; returns the reply (a dict) or raises CkptError.

        The service closes a connection idle longer than its
        client_idle_timeout: a request on a closed connection reconnects once.
        """
        request = dict(fields, verb=verb, id=self._next_id)
        self._next_id += 1
        line = (json.dumps(request) + "\n").encode()
        for attempt in (0, 1):
            if self._sock is None:
                self._connect()
            try:
                self._sock.sendall(line)
                reply = self._read_line()
                break
            except (BrokenPipeError, ConnectionResetError, EOFError):
                self.close()
                if attempt == 1:
                    raise CkptError("Unavailable",
                                    f"the scheduler closed the connection on {self.socket_path}")
        reply = json.loads(reply)
        if not reply.get("ok", False):
            raise CkptError(reply.get("code", "Internal"), reply.get("error", "error reply"))
        reply.pop("ok", None)
        reply.pop("id", None)
        return reply

    def _read_line(self):
        while b"\n" not in self._buffer:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise EOFError()
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    # ---- verbs ----

    def submit(self, toml):
        """Submits an experiment: TOML text, or the path of a TOML file.

        Returns the experiment's name. The service checks the file with the
        scheduler's parser: a bad file raises CkptError("InvalidArgument")
        naming the key and its line.
        """
        origin = "python"
        if "\n" not in toml and os.path.isfile(toml):
            origin = toml
            with open(toml, encoding="utf-8") as f:
                toml = f.read()
        return self.call("submit", toml=toml, origin=origin)["experiment"]

    def status(self, experiment=None):
        """The service (``{"service", "experiments", "devices"}``), or one
        experiment's full summary (members best first) when named."""
        if experiment is None:
            return self.call("status")
        return self.call("status", experiment=experiment)["experiment"]

    def experiments(self):
        """Every experiment in brief."""
        return self.call("list")["experiments"]

    def workers(self):
        """Each worker: index, device, host, pid, ready, capacity (slots),
        busy (members in flight), restarts, given_up, samples_per_s."""
        return self.call("status")["devices"]

    def pause(self, experiment):
        self.call("pause", experiment=experiment)

    def resume(self, experiment):
        self.call("resume", experiment=experiment)

    def stop(self, experiment):
        self.call("stop", experiment=experiment)

    def watch(self, experiment, interval=1.0):
        """Yields the experiment's summary each time an interval is committed
        (and once at the start), until it ends; the last one has
        ``phase == "done"``. Each carries ``progress``, the run's progress
        line."""
        seen = None
        while True:
            s = self.status(experiment)
            key = (s["member_intervals"], s["phase"], s["status"])
            if key != seen:
                seen = key
                yield s
            if s["phase"] == "done":
                return
            time.sleep(interval)

    def results(self, experiment):
        """See :func:`results`."""
        return results(experiment, client=self)


def results(experiment, client=None, socket=None):
    """One record per member, best first, in the spirit of Ray Tune's
    ``ResultGrid.get_dataframe()``: experiment, member, status,
    intervals_done, ``val_<metric>`` and ``test_<metric>`` under the
    experiment's metric ("val_accuracy", "test_neg_mse", "val_r2"; None when
    not evaluated), version, step, and each hyperparameter as
    ``config/<name>``. A pandas DataFrame when pandas is importable, else a
    list of dicts."""
    c = client or Client(socket)
    s = c.status(experiment)
    metric = s.get("metric", "accuracy")
    rows = []
    for m in s["members"]:
        row = {"experiment": experiment, "member": m["member"], "status": m["status"],
               "intervals_done": m["intervals_done"], "val_" + metric: m["val_score"],
               "test_" + metric: m["test_score"], "version": m["version"],
               "step": m["step"]}
        for k, v in sorted(m["hparams"].items()):
            row["config/" + k] = v
        rows.append(row)
    try:
        import pandas
    except ImportError:
        return rows
    return pandas.DataFrame(rows)


def _tool_binary(tool):
    if tool:
        return tool
    env = os.environ.get("CKPT_TOOL")
    if env:
        return env
    found = shutil.which("ckpt-tool")
    if found:
        return found
    here = os.path.dirname(os.path.abspath(__file__))
    for guess in (os.path.join(here, "..", "..", "build", "bin", "ckpt-tool"),):
        if os.access(guess, os.X_OK):
            return os.path.normpath(guess)
    raise CkptError("NotFound", "ckpt-tool not found: put it on PATH or set $CKPT_TOOL")


def load_state_dict(ref, store=None, client=None, tool=None, optimizer=False, metadata=False):
    """A member's model state as a PyTorch ``state_dict`` (tensor name ->
    ``torch.Tensor``).

    ``ref``: ``"EXPERIMENT/MEMBER[@VERSION]"`` (the head when no version).
    ``store``: the store directory; or ``client``: a Client, whose service
    names its store. The state comes through ``ckpt-tool export`` (``tool``,
    else ``$CKPT_TOOL``, else ``ckpt-tool`` on PATH) into a temporary
    ``.safetensors`` file, read with ``safetensors``: the store is RocksDB,
    which Python cannot open without bindings ckpt does not ship, and export
    reads it read-only (never blocking the running service), checks every
    tensor's checksum, and writes the blob's own safetensors layout, so no
    second decoder of the format exists. ``optimizer``: keep the optimizer's
    ``optim.*`` tensors too (default: the model's only). ``metadata``: return
    ``(state_dict, metadata)``, the blob's ``__metadata__`` strings
    ("ckpt.model_spec", "ckpt.input_mean", "ckpt.input_std", "ckpt.hparams",
    ...)."""
    if (store is None) == (client is None):
        raise ValueError("give exactly one of store= or client=")
    if client is not None:
        store = client.status()["service"]["store"]
    from safetensors import safe_open
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory(prefix="ckpt-state-") as d:
        out = os.path.join(d, "state.safetensors")
        p = subprocess.run([_tool_binary(tool), "--store", store, "export", ref, "-o", out],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise CkptError("NotFound" if p.returncode == 1 else "InvalidArgument",
                            p.stderr.strip() or f"ckpt-tool export exited {p.returncode}")
        state = load_file(out)
        with safe_open(out, "pt") as f:
            meta = f.metadata()
    if not optimizer:
        state = {k: v for k, v in state.items() if not k.startswith("optim.")}
    return (state, meta) if metadata else state
