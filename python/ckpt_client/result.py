"""What a run left in the store, as pandas, PyTorch and matplotlib objects.

``Result(store, experiment, module)`` reads an experiment of a ckpt store
(the embedded one of ``ckpt-scheduler run``, or the service's, while it runs
too) through ``ckpt-tool --store DIR ... --json``: the store is RocksDB,
which this package never opens itself, and the tool reads it read-only
without blocking a scheduler that writes it::

    r = Result("var", "demo", module=LeNet5())
    r.members            # per member, best first
    r.history            # per member-interval
    r.best(3)
    model = r.best_module()
    r.plot()             # a matplotlib Figure (shown inline in Jupyter)
    r.lineage("m005")

Scores are named by the experiment's metric: ``val_accuracy`` and
``test_accuracy`` (``val_neg_mse``, ``val_r2`` for a regression), None where
a split was not evaluated. Hyperparameters are columns ``config/<name>``, as
in :func:`ckpt_client.results` (the service's table) and Ray Tune's
``ResultGrid.get_dataframe()``.

Needs pandas; ``state_dict``/``best_module`` need torch and safetensors,
``plot`` matplotlib.
"""

import copy
import json
import math
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

from .binaries import find_binary
from .client import CkptError, load_state_dict, results

HPARAM_PREFIX = "config/"


def _val_key(record):
    """The ``val_<metric>`` key of an event or metrics record, else None."""
    return next((k for k in record if k.startswith("val_")), None)


class _StoreSummary:
    """The service's experiment summary (``Client.status(name)``, the form
    ``ckpt-scheduler run --summary-json`` writes too), built from the store,
    so that :func:`ckpt_client.results` parses both the same way."""

    def __init__(self, summary):
        self._summary = summary

    def status(self, experiment=None):
        return self._summary


class Result:
    """An experiment of a ckpt store, read as DataFrames, tensors and a figure.

    ``store``: the store directory (``Experiment.run()``'s, by default
    ``./ckpt-store``; ``ckpt-scheduler run``'s ``var/``; or the service's). ``experiment``: its name. ``module``: the
    user's ``nn.Module``, an instance whose class is the trained model, used
    as the template of :meth:`best_module`; None when only state dicts are
    wanted.

    The store is read once, when the Result is made; :meth:`refresh` reads it
    again (a run still going on). Raises ``CkptError("NotFound")`` naming the
    store or the experiment when either does not exist.
    """

    def __init__(self, store: str, experiment: str, module=None):
        self.store = os.fspath(store)
        self.experiment = experiment
        self.module = module
        self._tool = find_binary("ckpt-tool")
        self.refresh()

    def __repr__(self):
        return (f"Result(store={self.store!r}, experiment={self.experiment!r}, "
                f"{len(self._ls['members'])} members, metric {self.metric!r})")

    # ---- reading the store ----

    def _run_tool(self, *args):
        """``ckpt-tool --store STORE --json ARGS`` parsed; its one-line error
        (exit 1: not found, 2: usage) as CkptError."""
        p = subprocess.run([self._tool, "--store", self.store, "--json", *args],
                           capture_output=True, text=True)
        if p.returncode != 0:
            message = p.stderr.strip() or f"ckpt-tool {' '.join(args)} exited {p.returncode}"
            raise CkptError("NotFound" if p.returncode == 1 else "InvalidArgument", message)
        return json.loads(p.stdout)

    def refresh(self):
        """Reads the experiment's members and decision log again."""
        self._ls = self._run_tool("ls", self.experiment, "--sort", "score")
        self._events = self._run_tool("events", self.experiment)["events"]
        self._initial = None
        self._normalization = None
        self.metric = self._find_metric()
        return self

    def _find_metric(self):
        """The metric's name: the ``val_<metric>`` key of the final
        evaluation, else of the best head's manifest metrics. (Trained events
        are not asked: the scheduler logs them as ``val_accuracy`` whatever
        the metric.)"""
        for e in self._events:
            if e.get("type") == "final_eval" and e.get("results"):
                found = _val_key(e["results"][0])
                if found:
                    return found[len("val_"):]
        for m in self._ls["members"]:
            if m.get("score") is None:
                continue
            found = _val_key(self._run_tool("show", f"{self.experiment}/{m['member']}")
                             .get("metrics", {}))
            if found:
                return found[len("val_"):]
            break
        return "accuracy"

    @property
    def score_column(self) -> str:
        """The validation score's column: ``val_<metric>``."""
        return "val_" + self.metric

    def _summary(self):
        """The store's view in the form of the service's summary."""
        test = {}
        for e in self._events:
            if e.get("type") == "final_eval":
                for r in e.get("results", []):
                    test[r["member"]] = r.get("test_" + self.metric)
        members = []
        for m in self._ls["members"]:
            members.append({"member": m["member"], "status": m["state"],
                            "intervals_done": m["intervals_done"], "val_score": m.get("score"),
                            "test_score": test.get(m["member"]), "version": m["version"],
                            "step": m["step"], "hparams": m.get("hparams", {})})
        return {"id": self.experiment, "metric": self.metric, "status": self._ls.get("status"),
                "members": members}

    # ---- tables ----

    @property
    def members(self):
        """One row per member, best validation score first: experiment,
        member, status, intervals_done, ``val_<metric>``, ``test_<metric>``
        (only for the members ckpt's final evaluation scored: the best few,
        once the run ended), version, step and each
        hyperparameter as ``config/<name>`` (the head's)."""
        import pandas

        return pandas.DataFrame(results(self.experiment, client=_StoreSummary(self._summary())))

    def best(self, k=1):
        """The ``k`` best members' rows of :attr:`members`."""
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"Result.best: k must be a positive integer, got {k!r}")
        return self.members.head(k).reset_index(drop=True)

    def _hparam_names(self):
        names = set()
        for m in self._ls["members"]:
            names.update(m.get("hparams", {}))
        return sorted(names)

    def _show_hparams(self, ref):
        try:
            return self._run_tool("show", f"{self.experiment}/{ref}").get("hparams")
        except CkptError:
            return None  # deleted by retention: unknown

    def _initial_hparams(self, first_versions):
        """Each member's hyperparameters before its first exploit or restore:
        its first trained version's manifest (None where retention deleted
        it), read in parallel."""
        if self._initial is None:
            refs = sorted(first_versions.items())
            with ThreadPoolExecutor(max_workers=4) as pool:
                found = list(pool.map(lambda mv: self._show_hparams(f"{mv[0]}@{mv[1]}"), refs))
            self._initial = {m: h for (m, _), h in zip(refs, found)}
        return self._initial

    @property
    def history(self):
        """One row per member-interval trained, in the decision log's order:
        member, interval, step, version, ``val_<metric>``, each
        hyperparameter the interval trained with (``config/<name>``),
        ``exploited`` (the interval started from a copy of ``donor``'s
        ``donor_version``, with new hyperparameters) and ``donor`` (None when
        not exploited).

        The hyperparameters come from the exploit events; before a member's
        first exploit they are its head's when it never changed, else its
        first version's manifest, NaN where retention deleted it. A member
        retrained after a restart keeps its last row per interval."""
        import pandas

        names = self._hparam_names()
        heads = {m["member"]: m for m in self._ls["members"]}
        steps_per_interval = self._steps_per_interval()
        changed, first_version = set(), {}
        for e in self._events:
            if e.get("type") in ("exploit", "restore") and e.get("member"):
                changed.add(e["member"])
            if e.get("type") == "trained" and e.get("member") and e["member"] not in first_version:
                first_version[e["member"]] = e.get("version")
        initial = self._initial_hparams({m: v for m, v in first_version.items()
                                         if m in changed and v})
        current, pending, rows = {}, {}, {}
        for e in self._events:
            kind, member = e.get("type"), e.get("member")
            if not member:
                continue
            if kind == "exploit":
                current[member] = e.get("hparams", {})
                pending[member] = (e.get("donor"), e.get("donor_version"))
            elif kind == "restore":
                current[member] = self._show_hparams(f"{member}@{e.get('version')}") or {}
            elif kind == "trained":
                if member not in current:
                    current[member] = (initial.get(member) or {}) if member in changed else \
                        heads.get(member, {}).get("hparams", {})
                donor, donor_version = pending.pop(member, (None, None))
                interval = e.get("interval")
                row = {"member": member, "interval": interval,
                       "step": e.get("step", (interval or 0) * steps_per_interval),
                       "version": e.get("version"),
                       self.score_column: e.get(_val_key(e) or self.score_column)}
                for n in names:
                    row[HPARAM_PREFIX + n] = current[member].get(n, math.nan)
                row.update(exploited=donor is not None, donor=donor, donor_version=donor_version)
                rows[(member, interval)] = row
        columns = ["member", "interval", "step", "version", self.score_column] + \
            [HPARAM_PREFIX + n for n in names] + ["exploited", "donor", "donor_version"]
        frame = pandas.DataFrame(list(rows.values()), columns=columns)
        return frame.astype({"version": "Int64", "donor_version": "Int64"})

    def _steps_per_interval(self):
        for m in self._ls["members"]:
            if m.get("intervals_done"):
                return m["step"] // m["intervals_done"]
        return 0

    def lineage(self, member):
        """The ancestry of ``member`` (``"m003"`` or ``"m003@5"``), newest
        first, back to its first version as far as the store kept it: member,
        version, reason ("trained", "exploit", "restore", "import"), step,
        ``val_<metric>``, the hyperparameters, and parent_member /
        parent_version, the version it came from (another member's for an
        exploit: the donor it was copied from at that step)."""
        import pandas

        chain = self._run_tool("lineage", f"{self.experiment}/{member}")["chain"]
        names = self._hparam_names()
        rows = []
        for v in chain:
            parent = v.get("parent") or {}
            row = {"member": v["member"], "version": v["version"], "reason": v["reason"],
                   "step": v["step"], self.score_column: v.get("score")}
            for n in names:
                row[HPARAM_PREFIX + n] = v.get("hparams", {}).get(n, math.nan)
            row.update(parent_member=parent.get("member"), parent_version=parent.get("version"))
            rows.append(row)
        return pandas.DataFrame(rows).astype({"parent_version": "Int64"})

    # ---- states ----

    def _best_member(self):
        if not self._ls["members"]:
            raise CkptError("NotFound", f"experiment {self.experiment} has no member")
        return self._ls["members"][0]["member"]

    def state_dict(self, member=None):
        """A member's model tensors (name -> ``torch.Tensor``, as trained:
        no optimizer slots): ``member`` ("m003", "m003@5"), by default the
        best. Through ``ckpt-tool export``, which checks every checksum."""
        ref = member if member is not None else self._best_member()
        return load_state_dict(f"{self.experiment}/{ref}", store=self.store, tool=self._tool)

    def normalize(self, x, member=None):
        """``x`` (NumPy or torch, raw values: uint8 images as stored) as ckpt's
        workers feed it to the model: float32 ``x * input_scale[c] +
        input_shift[c]`` per channel ``c`` (dim 1), the training split's
        normalization that ``ckpt-tool export`` records with the state of
        ``member`` (default the best). Scoring :meth:`best_module` in PyTorch
        on ``normalize(test_x)`` reproduces ckpt's test score."""
        import torch

        if self._normalization is None or member is not None:
            ref = member if member is not None else self._best_member()
            _, meta = load_state_dict(f"{self.experiment}/{ref}", store=self.store,
                                      tool=self._tool, metadata=True)
            if "ckpt.input_scale" not in meta or "ckpt.input_shift" not in meta:
                raise CkptError("NotFound", f"{self.experiment}/{ref}: the export records no "
                                "input normalization (ckpt-tool found no data file for it)")
            found = (json.loads(meta["ckpt.input_scale"]), json.loads(meta["ckpt.input_shift"]))
            if member is not None:
                return self._apply_normalization(torch, x, found)
            self._normalization = found
        return self._apply_normalization(torch, x, self._normalization)

    @staticmethod
    def _apply_normalization(torch, x, normalization):
        scale, shift = normalization
        if not isinstance(x, torch.Tensor):
            import numpy

            # A float32 copy of its own: the result is new memory either way,
            # and torch would warn of a read-only array (np.frombuffer's).
            x = torch.from_numpy(numpy.array(x, dtype=numpy.float32))
        if x.dim() < 2 or x.shape[1] != len(scale):
            raise ValueError(f"Result.normalize: x of shape {list(x.shape)} has no dim 1 of "
                             f"{len(scale)} channels (or features), as the model was trained")
        view = [1, len(scale)] + [1] * (x.dim() - 2)
        scale = torch.tensor(scale, dtype=torch.float32).view(view)
        shift = torch.tensor(shift, dtype=torch.float32).view(view)
        return x.to(torch.float32) * scale + shift

    def best_module(self):
        """A copy of ``module`` with the best member's weights, loaded
        strictly (every tensor named and shaped as the module's), in eval
        mode."""
        if self.module is None:
            raise ValueError("Result.best_module: no module given; pass one "
                             "(Result(store, experiment, module=MyNet())) or use state_dict()")
        from .convert import load_state

        model = copy.deepcopy(self.module)
        return load_state(model, self.state_dict()).eval()

    # ---- the figure ----

    def plot(self):
        """A matplotlib Figure: the validation score and each hyperparameter
        over training steps, one line per member, exploits marked (an "x"
        where a member started over from its donor's copy, on the donor's
        score and the new hyperparameters). Jupyter shows it inline;
        ``fig.savefig("pbt.png")`` writes it."""
        import matplotlib.pyplot as plt

        h = self.history
        names = [c for c in h.columns if c.startswith(HPARAM_PREFIX)]
        quantities = [self.score_column] + names
        fig, axes = plt.subplots(len(quantities), 1, sharex=True, squeeze=False,
                                 constrained_layout=True, figsize=(9, 2.4 * len(quantities)))
        axes = [a[0] for a in axes]
        step = self._steps_per_interval()
        donor_score = self._donor_scores(h)
        for member, rows in h.groupby("member", sort=True):
            rows = rows.sort_values("step")
            for ax, q in zip(axes, quantities):
                if q in names:  # the value an interval trained with, over its steps
                    ax.step((rows["step"] - step).tolist() + [rows["step"].iloc[-1]],
                            rows[q].tolist() + [rows[q].iloc[-1]], where="post", label=member)
                    continue
                # The score, broken where the member became a copy of its
                # donor: the line goes on from the donor's score there.
                xs, ys = [], []
                for r in rows.to_dict("records"):
                    if r["exploited"]:
                        xs += [math.nan, r["step"] - step]
                        ys += [math.nan, donor_score.get((r["donor"], r["donor_version"]),
                                                         math.nan)]
                    xs.append(r["step"])
                    ys.append(r[q])
                ax.plot(xs, ys, marker=".", label=member)
        self._mark_exploits(axes, quantities, h, step)
        for ax, q in zip(axes, quantities):
            ax.set_ylabel(q[len(HPARAM_PREFIX):] if q.startswith(HPARAM_PREFIX) else q)
            values = h[q].dropna()
            if q in names and len(values) and values.min() > 0 and values.max() / values.min() > 10:
                ax.set_yscale("log")
            ax.grid(True, alpha=0.3)
        axes[-1].set_xlabel("step")
        axes[0].set_title(f"{self.experiment}: {self.score_column} and hyperparameters")
        # Beside the axes. Members by name while their colours tell them
        # apart (matplotlib's cycle has 10); past that, the exploit mark only.
        handles, labels = axes[0].get_legend_handles_labels()
        if h["member"].nunique() > 10:
            handles, labels = handles[-1:], labels[-1:]
            if labels != ["exploit"]:
                handles, labels = [], []
        if handles:
            axes[0].legend(handles, labels, fontsize="small", loc="upper left",
                           bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        plt.close(fig)  # shown once: by Jupyter's display of the return value
        return fig

    def _donor_scores(self, h):
        """(member, version) -> its score, from the history's rows."""
        import pandas

        return {(m, int(v)): s for m, v, s in zip(h["member"], h["version"], h[self.score_column])
                if not pandas.isna(v)}

    def _mark_exploits(self, axes, quantities, h, step):
        """One scatter per axes (gid "exploits"): each exploited interval's
        start, at the donor's score there and the interval's new values."""
        ex = h[h["exploited"]]
        if ex.empty:
            return
        scores = self._donor_scores(h)
        for ax, q in zip(axes, quantities):
            xs, ys = [], []
            for _, r in ex.iterrows():
                xs.append(r["step"] - step)
                if q == self.score_column:
                    ys.append(scores.get((r["donor"], r["donor_version"]), math.nan))
                else:
                    ys.append(r[q])
            ax.scatter(xs, ys, marker="x", color="black", s=40, zorder=5, gid="exploits",
                       label="exploit")
