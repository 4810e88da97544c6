"""Running an Experiment: locally (``run``: ``ckpt-scheduler run`` on an
embedded store) or on a running service (``submit``: ``ckpt-scheduler
serve`` through its control socket), with live progress, ending in a
``Result``.

Progress is the scheduler's own progress line (``summary_text.h``:
"NAME: training interval 3/6 | members done 0/8 | 812 samples/s | best
val_accuracy 0.7712 median 0.7020 | exploits 4 | ETA 1m10s"), read from a
pseudo-terminal the local scheduler writes to (where it rewrites the line
every second) or from the service's ``status`` replies, and shown as a tqdm
bar (``tqdm.auto``: a widget in Jupyter when ipywidgets is there, text
otherwise). ``callback(info)`` gets the same values as a dict (``event``
"progress") on each line, and, from ``run()``, on each member-interval the
scheduler commits (``event`` "committed", with ``member`` and
``member_interval``), read from the structured trace it writes
(``CKPT_TRACE_FILE``, ``ckpt/logging/trace_file.h``); ``committed`` counts
those of this call.

Ctrl-C (KeyboardInterrupt) during ``run()`` sends the scheduler SIGINT, as
Ctrl-C in its terminal would: it lets in-flight intervals finish for its
grace period and commits them; ``run()`` waits for it to exit and then
re-raises. What was committed is kept in the store, and ``run()`` again
resumes from it. A second Ctrl-C while it stops sends SIGTERM, a third
SIGKILL (nothing committed is lost; in-flight intervals rerun).
"""

import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
import warnings

from .binaries import find_binary
from .client import CkptError, Client
from .data import TensorFile
from .experiment import ArgumentError, _undo, default_store

__all__ = ["parse_progress", "prepare", "run", "submit"]

_PROGRESS = re.compile(
    r"(?P<experiment>\S+): (?P<phase>\w+) interval (?P<interval>\d+)/(?P<intervals>\d+) \| "
    r"members done (?P<members_done>\d+)/(?P<population>\d+) \| (?P<samples_per_s>[\d.]+) "
    r"samples/s \| best (?P<metric>\S+) (?P<best>\S+) median (?P<median>\S+) \| "
    r"exploits (?P<exploits>\d+) \| ETA (?P<eta>\S+)")
_INTS = ("interval", "intervals", "members_done", "population", "exploits")
_FLOATS = ("samples_per_s", "best", "median")


def parse_progress(line):
    """The scheduler's progress line as a dict (experiment, phase, interval,
    intervals, members_done, population, samples_per_s, metric, best,
    median, exploits, eta, line), or None for another line."""
    line = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line)
    m = _PROGRESS.search(line)
    if m is None:
        return None
    info = m.groupdict()
    for k in _INTS:
        info[k] = int(info[k])
    for k in _FLOATS:
        try:
            info[k] = float(info[k])
        except ValueError:
            info[k] = float("nan")
    info["line"] = line[m.start():].strip()
    return info


class _Bar:
    """The tqdm bar: intervals of the experiment, the rest as its postfix."""

    def __init__(self, progress):
        self.progress = progress
        self.bar = None
        self.last = None

    def update(self, info):
        if not self.progress or info is None or info["line"] == self.last:
            return
        self.last = info["line"]
        done = info["phase"] == "done"
        n = info["intervals"] if done else min(info["interval"], info["intervals"])
        postfix = (f"members done {info['members_done']}/{info['population']}, best "
                   f"{info['metric']} {info['best']:.4f}, {info['samples_per_s']:.0f} samples/s, "
                   f"ETA {info['eta']}")
        if self.bar is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # tqdm.auto without ipywidgets: text
                from tqdm.auto import tqdm
            kwargs = {} if self.progress is True else {"file": self.progress}
            self.bar = tqdm(total=info["intervals"], initial=n, desc=info["experiment"],
                            unit="interval", postfix=postfix, dynamic_ncols=True,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| interval "
                                       "{n_fmt}/{total_fmt} [{elapsed}{postfix}]", **kwargs)
            return
        self.bar.n = n
        self.bar.set_postfix_str(postfix, refresh=False)
        self.bar.refresh()

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _writable_dir(path, argument):
    """``path`` absolute; raises ArgumentError unless it, or the nearest
    existing folder above it, is a folder this process can create files in
    (tried with a file removed at once: nothing is left)."""
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    p = path
    while not os.path.lexists(p):
        p = os.path.dirname(p)
    if not os.path.isdir(p):
        raise ArgumentError(argument, path, f"{p} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".ckpt-write-test-", dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ArgumentError(argument, path, f"cannot write in {p} ({e.strerror or e}); "
                            "give a folder you can write") from None
    return path


def _check_with_scheduler(exp, scheduler, text, store):
    """Runs ``ckpt-scheduler check`` on ``text``; raises the mapped error.
    A scheduler without the verb (an older build) leaves the check to
    ``run``, which reads the file with the same parser and errors."""
    with tempfile.TemporaryDirectory(prefix="ckpt-check-") as d:
        path = os.path.join(d, "experiment.toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        cmd = [scheduler, "check", path]
        if os.path.isdir(store):
            cmd += ["--store", store]
        p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if p.returncode == 0:
        return
    out = (p.stderr.strip() or p.stdout.strip())
    if p.returncode >= 100:
        return  # CLI11 knows no `check` verb (an older build): run() reports the same errors
    raise exp.error_of(_last_error(out) or f"ckpt-scheduler check exited {p.returncode}")


def _last_error(text):
    """The scheduler's error line ("ckpt-scheduler: InvalidArgument: ...")."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("ckpt-scheduler"):
            return ln
    return lines[-1] if lines else ""


def prepare(exp, store=None):
    """Everything run() does before starting the scheduler: finds the
    binaries, checks the store can be written, writes the data and model
    files, and has the scheduler check the file. Returns (text, store,
    scheduler binary). On any error, what it wrote is removed."""
    scheduler = find_binary("ckpt-scheduler")
    find_binary("ckpt-worker")
    store = _writable_dir(store or exp.store or default_store(), "store")
    text, created = exp._materialize(os.path.join(store, "data"), os.path.join(store, "models"))
    try:
        _check_with_scheduler(exp, scheduler, text, store)
    except BaseException:
        _undo(created)
        raise
    return text, store, scheduler


def _name_of(text):
    return tomllib.loads(text)["name"]


class _Scheduler:
    """``ckpt-scheduler run`` on a pseudo-terminal (its progress line every
    second), its log appended to ``<store>/logs/<name>.log``."""

    def __init__(self, cmd, log_path, trace_path):
        self.log_path = log_path
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        self.log = open(log_path, "ab")
        # The structured trace (ckpt/logging/trace_file.h): a line per
        # committed member-interval, read as it is written.
        self.trace = open(trace_path, "a+b")
        self.trace_rest = b""
        env = dict(os.environ, CKPT_TRACE_FILE=trace_path)
        master, slave = pty.openpty()
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave,
                                         stderr=self.log, start_new_session=True, env=env)
        except BaseException:
            os.close(master)
            os.close(slave)
            self.log.close()
            self.trace.close()
            raise
        os.close(slave)
        self.master = master
        self.buffer = b""
        self.output = []  # lines other than progress (the summary table)
        self.signals = 0

    def events(self):
        """The trace's events written since the last call."""
        self.trace_rest += self.trace.read()
        *lines, self.trace_rest = self.trace_rest.split(b"\n")
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def pump(self, on_line, timeout, on_event=None):
        """Reads what the scheduler wrote within ``timeout`` s; False at its end."""
        r, _, _ = select.select([self.master], [], [], timeout)
        if on_event is not None:
            for event in self.events():
                on_event(event)
        if not r:
            return self.proc.poll() is None
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: every holder of the terminal closed it
            chunk = b""
        if not chunk:
            return False
        self.buffer += chunk
        *lines, self.buffer = re.split(rb"[\r\n]", self.buffer)
        for raw in lines:
            line = raw.replace(b"\x1b[K", b"").decode(errors="replace").strip()
            if line:
                on_line(line)
        return True

    def interrupt(self):
        """SIGINT, then SIGTERM, then SIGKILL, one more each call."""
        if self.proc.poll() is not None:
            return
        self.signals += 1
        if self.signals == 1:
            self.proc.send_signal(signal.SIGINT)
        elif self.signals == 2:
            self.proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(self.proc.pid, signal.SIGKILL)

    def finish(self, on_line, on_event=None):
        """Waits for the scheduler to exit, reading its output; Ctrl-C meanwhile
        escalates the signal. Returns its exit status."""
        while True:
            try:
                while self.pump(on_line, 0.2, on_event):
                    pass
                if on_event is not None:
                    for event in self.events():
                        on_event(event)
                return self.proc.wait()
            except KeyboardInterrupt:
                self.interrupt()

    def close(self):
        """Closes the terminal; a scheduler still running (an exception out of
        a callback) is stopped as Ctrl-C stops it, and waited for."""
        os.close(self.master)  # its writes fail from now on instead of blocking
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                try:
                    self.proc.wait(120)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
        finally:
            self.log.close()
            self.trace.close()

    def log_tail(self, lines=20):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 8192))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def run(exp, store=None, progress=True, callback=None):
    """Runs ``exp`` with ``ckpt-scheduler run`` on the embedded store
    ``store`` (default: ``exp.store``, else ``default_store()``), showing
    progress (``progress``: True, False, or a file for the bar), calling
    ``callback(info)`` (parse_progress's dict and ``event``, see above) on
    each progress line and each committed member-interval.
    Returns a ``Result`` once the experiment ends; run it again on the same
    store and it resumes (or, when done, returns the same result at once).

    Raises ArgumentError for bad input (nothing is left behind), CkptError
    naming the log when the scheduler fails, and KeyboardInterrupt after a
    Ctrl-C has stopped the scheduler cleanly.
    """
    text, store, scheduler = prepare(exp, store)
    name = _name_of(text)
    worker = find_binary("ckpt-worker")
    bar = _Bar(progress)
    tmp = tempfile.mkdtemp(prefix="ckpt-run-")
    try:
        path = os.path.join(tmp, f"{name}.toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        summary = os.path.join(tmp, "summary.json")
        proc = _Scheduler([scheduler, "run", path, "--store", store, "--worker", worker,
                           "--summary-json", summary],
                          os.path.join(store, "logs", f"{name}.log"),
                          os.path.join(tmp, "trace.jsonl"))
        try:
            last = {}

            def on_line(line):
                info = parse_progress(line)
                if info is None:
                    proc.output.append(line)
                    return
                info["event"] = "progress"
                info["committed"] = last.get("committed", 0)
                last.clear()
                last.update(info)
                bar.update(info)
                if callback is not None:
                    callback(dict(info))

            def on_event(event):
                if event.get("ev") != "committed" or event.get("exp") != name:
                    return
                last["committed"] = last.get("committed", 0) + 1
                if callback is not None and "line" in last:
                    callback(dict(last, event="committed", member=event.get("member"),
                                  member_interval=event.get("interval")))

            interrupted = False
            try:
                while proc.pump(on_line, 0.1, on_event):
                    pass
            except KeyboardInterrupt:
                interrupted = True
                proc.interrupt()
            except BaseException:
                proc.interrupt()
                proc.finish(lambda line: None)
                raise
            rc = proc.finish(on_line, on_event) if not interrupted else \
                proc.finish(lambda line: None)
            bar.close()
            if interrupted:
                print(f"ckpt: stopped {name}; what was committed is kept in {store}: run() "
                      "again resumes it", file=sys.stderr)
                raise KeyboardInterrupt
            if rc == 2:
                raise exp.error_of(_last_error(proc.log_tail()))
            if rc != 0:
                raise CkptError("Internal", f"ckpt-scheduler run exited {rc}; log "
                                f"{proc.log_path}:\n{proc.log_tail()}")
        finally:
            bar.close()
            proc.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    from .result import Result
    return Result(store, name, module=exp.module())


def submit(exp, client=None, progress=True, callback=None, poll_s=1.0, data_dir=None,
           model_dir=None, detach=False):
    """Submits ``exp`` to a running ``ckpt-scheduler serve`` and watches it to
    its end, with the same progress as run(); returns the same Result.

    ``client``: a Client, or the control socket's path (default: Client()'s).
    The arrays go to ``data_dir`` and a TorchScript fallback to
    ``model_dir``, which the service must read (default: its store's
    ``data`` and ``models``, the service's default allowed_model_dirs).
    ``detach``: return the experiment's name at once, without watching.
    Ctrl-C while watching stops the watching only: the experiment goes on
    in the service (``Client.stop(name)`` stops it), and submit() again
    watches it again.
    """
    if isinstance(client, Client):
        return _submit(exp, client, progress, callback, poll_s, data_dir, model_dir, detach)
    with Client(client) as c:
        return _submit(exp, c, progress, callback, poll_s, data_dir, model_dir, detach)


def _submit(exp, c, progress, callback, poll_s, data_dir, model_dir, detach):
    store = c.status()["service"]["store"]
    data_dir = data_dir or os.path.join(store, "data")
    if isinstance(exp._data, TensorFile):
        data_dir = _writable_dir(data_dir, "data_dir")
    model_dir = model_dir or os.path.join(store, "models")
    if exp.is_module():
        model_dir = _writable_dir(model_dir, "model_dir")
    text, created = exp._materialize(data_dir, model_dir)
    name = _name_of(text)
    try:
        c.submit(text)
    except CkptError as e:
        if e.code != "AlreadyExists":
            _undo(created)
            raise (exp.error_of(e.message) if e.code == "InvalidArgument" else e) from None
    if detach:
        return name
    bar = _Bar(progress)
    try:
        for s in c.watch(name, interval=poll_s):
            info = parse_progress(s.get("progress", ""))
            if info is None:
                continue
            info["member_intervals"] = s.get("member_intervals")
            info["status"] = s.get("status")
            bar.update(info)
            if callback is not None:
                callback(info)
    except KeyboardInterrupt:
        bar.close()
        print(f"ckpt: stopped watching {name}; it goes on in the service "
              f"(Client.stop({name!r}) stops it; submit() again watches it)", file=sys.stderr)
        raise
    finally:
        bar.close()
    final = c.status(name)
    if final.get("status") == "failed":
        raise CkptError("Internal", f"experiment {name} failed in the service; its events "
                        f"say why (ckpt-tool --store {store} events {name})")
    from .result import Result
    return Result(store, name, module=exp.module())

