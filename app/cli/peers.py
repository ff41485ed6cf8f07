"""``corel reproduce --peers``: COREL against the losses people use today, on one protocol.

Every loss of the catalog (the paper's four and pytorch-metric-learning's seven) on each
row's dataset with the same FFNN encoder, optimiser, epochs, seeds and best-validation
epoch, as sweeps on a service:

1. **tune**: one sweep per loss over its small grid (its declaration's ``grid``,
   :mod:`corel.loss_catalog`), one seed, fewer
   epochs; the best validation accuracy picks its parameters.
2. **final**: one sweep per loss at those parameters over the row's seeds.

Then, per final run, the test accuracy at the best-validation epoch, the clustering report
(K-Means accuracy, silhouette, in the loss's geometry) and MAP@R; per loss, mean +- std over
seeds and the paired t-tests (by seed) against Gaussian-COREL and Cosine-COREL. The client
keeps a state file (sweep ids, results), so running the command again resumes and creates
nothing twice; the table goes between its budget's markers in a Markdown file (``--doc``, by
default ``reproduction.md`` in the working directory).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from scipy import stats

from app.cli.reproduce import cpu_name
from app.core.models import Status
from corel.loss_catalog import PAPER_LOSSES, PEER_LOSSES, declaration

LOSSES: tuple[str, ...] = PAPER_LOSSES + PEER_LOSSES
REFERENCES = ("gaussian", "cosine")
"""The COREL losses every other loss is tested against (paired by seed)."""


def tuning_grid(loss: str) -> dict[str, list[Any]]:
    """The loss's tuning grid, as its declaration has it (corel.loss_catalog)."""
    return {name: list(values) for name, values in declaration(loss).grid.items()}


@dataclass(frozen=True)
class PeerRow:
    dataset: str
    tune_epochs: int
    epochs: int
    seeds: int
    lr: float = 1e-4
    batch_size: int = 128
    model: str = "ffnn"
    grids: str = "full"
    """``full``: each loss's declared grid; ``smoke``: one value per loss but two for two of them."""

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.model}"

    def base(self, epochs: int) -> dict[str, Any]:
        return {"dataset": self.dataset, "model": self.model, "epochs": epochs, "lr": self.lr,
                "batch_size": self.batch_size}

    def grid(self, loss: str) -> dict[str, list[Any]]:
        grid = tuning_grid(loss)
        if self.grids == "smoke" and loss not in ("gaussian", "arcface"):
            return {k: v[:1] for k, v in grid.items()}
        return grid

    def budget(self) -> str:
        return (f"tune: each loss's grid x 1 seed x {self.tune_epochs} epochs; final: "
                f"{self.seeds} seeds x {self.epochs} epochs; Adam, lr {self.lr:g}, batch "
                f"{self.batch_size}")


BUDGETS: dict[str, tuple[PeerRow, ...]] = {
    # What fits in about an hour of a 2-core machine, beside other work.
    "session": (
        PeerRow("ag-news", 10, 40, 3),
        PeerRow("mnist", 5, 20, 3),
        PeerRow("fashion-mnist", 5, 20, 3),
    ),
    "paper": (  # the paper's protocol: 150 epochs, 5 seeds
        PeerRow("mnist", 30, 150, 5),
        PeerRow("fashion-mnist", 30, 150, 5),
        PeerRow("ag-news", 40, 150, 5),
    ),
    "smoke": (PeerRow("digits", 2, 3, 2, lr=3e-3, batch_size=64, grids="smoke"),),
}


def markers(budget: str) -> tuple[str, str]:
    return (f"<!-- corel reproduce --peers --budget {budget}: begin "
            "(generated; edits between the markers are replaced) -->",
            f"<!-- corel reproduce --peers --budget {budget}: end -->")


def _sweep_body(row: PeerRow, loss: str, stage: str, params: dict[str, Any]) -> dict[str, Any]:
    if stage == "tune":
        grid = {"seed": [0], **row.grid(loss)}
        return {"base": {**row.base(row.tune_epochs), "loss": loss}, "grid": grid}
    return {"base": {**row.base(row.epochs), "loss": loss, **params},
            "grid": {"seed": list(range(row.seeds))}}


def _tuned(members: list[dict[str, Any]], grid: dict[str, list[Any]]) -> dict[str, Any] | None:
    """The grid values of the member with the best validation accuracy (ties: the first)."""
    done = [m for m in members if m["status"] == Status.SUCCEEDED and m["best_val_accuracy"] is not None]
    if not done:
        return None
    best = max(done, key=lambda m: (m["best_val_accuracy"], -m["id"]))
    return {k: best["spec"][k] for k in grid}


class PeerReproduction:
    """The state machine over rows x losses; ``step()`` advances everything it can."""

    def __init__(self, client: httpx.Client, rows: tuple[PeerRow, ...], state_path: Path,
                 say: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr)):
        self.client, self.rows, self.state_path, self.say = client, rows, state_path, say
        self.state: dict[str, Any] = json.loads(state_path.read_text()) if state_path.exists() else {}
        self.state.setdefault("rows", {})

    def _save(self) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1, sort_keys=True))
        os.replace(tmp, self.state_path)

    def _call(self, method: str, url: str, **kw: Any) -> Any:
        r = self.client.request(method, url, **kw)
        if r.status_code >= 400:
            raise SystemExit(f"corel: {method} {url}: {r.status_code}: {r.text}")
        return r.json()

    def _sweep(self, row: PeerRow, loss: str, stage: str,
               params: dict[str, Any]) -> dict[str, Any] | None:
        """The sweep's progress, created the first time (or again if the service lost it)."""
        st = self.state["rows"].setdefault(row.key, {"losses": {}})
        ls = st["losses"].setdefault(loss, {})
        sweep_id = ls.get(stage)
        if sweep_id is not None:
            r = self.client.get(f"/sweeps/{sweep_id}")
            if r.status_code == 200:
                return dict(r.json())
            if r.status_code != 404:
                raise SystemExit(f"corel: GET /sweeps/{sweep_id}: {r.status_code}: {r.text}")
            self.say(f"{row.key} {loss}: sweep {sweep_id} is gone from the service; creating it again")
        queued = self._call("POST", "/sweeps", json=_sweep_body(row, loss, stage, params))
        ls[stage] = queued["id"]
        st.setdefault("started", time.time())
        self._save()
        return None

    def _members(self, sweep_id: int) -> list[dict[str, Any]]:
        page = self._call("GET", "/experiments", params={"sweep_id": sweep_id, "limit": 200})
        return list(page["items"])

    def _results(self, eid: int, loss: str) -> dict[str, Any]:
        exp = self._call("GET", f"/experiments/{eid}")
        out: dict[str, Any] = {"experiment_id": eid, "seed": exp["spec"]["seed"],
                               "status": exp["status"], "test_accuracy": exp["test_accuracy"],
                               "best_epoch": exp.get("best_epoch")}
        if exp["status"] == Status.SUCCEEDED:
            clu = self._call("GET", f"/experiments/{eid}/clustering")
            km = clu["results"]["kmeans"]
            out.update(kmeans_accuracy=km["accuracy"], silhouette=km["silhouette"],
                       metric=clu["metric"])
            out["map_at_r"] = self._call("GET", f"/experiments/{eid}/retrieval")[
                "mean_average_precision_at_r"]
        return out

    def step(self) -> bool:
        done = True
        for row in self.rows:
            st = self.state["rows"].setdefault(row.key, {"losses": {}})
            if "finished" in st:
                continue
            row_done = True
            for loss in LOSSES:
                ls = st["losses"].setdefault(loss, {})
                if "results" in ls:
                    continue
                row_done = False
                tune = self._sweep(row, loss, "tune", {})
                if tune is None or not tune["finished"]:
                    continue
                if "params" not in ls:
                    tuned = _tuned(self._members(ls["tune"]), row.grid(loss))
                    ls["params"] = tuned
                    self._save()
                    self.say(f"{row.key} {loss}: tuned {tuned}")
                if ls["params"] is None:  # no tune run succeeded: nothing to train at
                    ls["results"] = []
                    self._save()
                    continue
                final = self._sweep(row, loss, "final", ls["params"])
                if final is None or not final["finished"]:
                    continue
                ls["results"] = [self._results(eid, loss) for eid in final["experiment_ids"]]
                self._save()
                self.say(f"{row.key} {loss}: done")
            if row_done:
                st["finished"] = time.time()
                self._save()
            else:
                done = False
        return done

    def progress(self) -> str:
        parts = []
        for row in self.rows:
            st = self.state["rows"].get(row.key, {"losses": {}})
            n = sum("results" in ls for ls in st["losses"].values())
            parts.append(f"{row.key}: {n}/{len(LOSSES)} losses")
        return "; ".join(parts)


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), (float(arr.std(ddof=1)) if len(arr) > 1 else None)


def paired_test(a: dict[int, float], b: dict[int, float]) -> tuple[float | None, float | None, int]:
    """Paired two-tailed t-test of a against b over the seeds both have: (t, p, n)."""
    common = sorted(set(a) & set(b))
    if len(common) < 2:
        return None, None, len(common)
    x, y = [a[s] for s in common], [b[s] for s in common]
    diff = np.subtract(x, y)
    if np.allclose(diff, diff[0]):
        return None, None, len(common)
    res = stats.ttest_rel(x, y)
    return float(res.statistic), float(res.pvalue), len(common)


def summarize(results: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """{measure: {seed: value}} over the succeeded runs."""
    out: dict[str, dict[int, float]] = {}
    for key in ("test_accuracy", "kmeans_accuracy", "silhouette", "map_at_r"):
        out[key] = {int(r["seed"]): float(r[key]) for r in results
                    if r["status"] == Status.SUCCEEDED and r.get(key) is not None}
    return out


def _cell(by_seed: dict[int, float], pct: bool = True) -> str:
    if not by_seed:
        return "-"
    mean, std = _mean_std(list(by_seed.values()))
    k = 100.0 if pct else 1.0
    digits = 2 if pct else 3
    return f"{k * mean:.{digits}f}" + ("" if std is None else f" +- {k * std:.{digits}f}")


def _versus(ours: dict[str, dict[int, float]], ref: dict[str, dict[int, float]]) -> str:
    parts = []
    for key, label in (("test_accuracy", "acc"), ("map_at_r", "MAP@R")):
        t, p, _ = paired_test(ours[key], ref[key])
        if t is None or p is None or math.isnan(p):
            parts.append(f"{label} n/a")
            continue
        diff = 100 * (np.mean([ours[key][s] for s in ref[key] if s in ours[key]])
                      - np.mean([ref[key][s] for s in ours[key] if s in ref[key]]))
        parts.append(f"{label} {diff:+.2f} (p={p:.3f})")
    return ", ".join(parts)


def _params(loss: str, params: dict[str, Any] | None) -> str:
    if params is None:
        return "(no tune run succeeded)"
    decl = declaration(loss)
    shown = dict(params)
    for option in decl.options:
        shown.setdefault(option.field, option.default)
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items()) or "-"


def _total(state: dict[str, Any], rows: tuple[PeerRow, ...]) -> str:
    runs = [state["rows"].get(row.key, {}) for row in rows]
    if not runs or any("finished" not in r for r in runs):
        return "not finished"
    wall = max(r["finished"] for r in runs) - min(r["started"] for r in runs)
    return f"wall time {wall / 60:.1f} min in all (the rows share one worker)"


def render(state: dict[str, Any], budget: str, command: str) -> str:
    begin, end = markers(budget)
    rows = tuple(row for row in BUDGETS[budget] if row.key in state["rows"])
    lines = [begin, "", "## COREL against pytorch-metric-learning's losses (generated by "
             "`corel reproduce --peers`)", "", f"Command: `{command}`", "",
             f"Machine: {cpu_name()} ({os.cpu_count()} cores, {platform.machine()}, Python "
             f"{platform.python_version()}); {_total(state, rows)}.", "",
             "Tuning grids (validation accuracy of one seed picks; the others at their "
             "defaults): " + "; ".join(
                 f"{declaration(loss).short} " + (", ".join(f"{k} {v}" for k, v in tuning_grid(loss).items())
                                                  or "none")
                 for loss in LOSSES) + ".", "",
             "Per loss at its tuned parameters: test accuracy at the best-validation epoch, "
             "K-Means accuracy and silhouette of the test representations (in the loss's "
             "geometry: Euclidean for CCE, Center and Gaussian-COREL, cosine for the others) "
             "and MAP@R of the test split among the training split, each mean +- std (%, "
             "silhouette as is) over the seeds. The last two columns: the difference in points "
             "from Gaussian-COREL and Cosine-COREL in test accuracy and MAP@R, with the p of a "
             "paired two-tailed t-test over the seeds. Prediction: class vectors for every loss "
             "with a class (or proxy) matrix, the nearest class mean of the training "
             "representations for SupCon, Triplet and MultiSim (marked *).", ""]
    for row in rows:
        st = state["rows"][row.key]
        wall = "not finished" if "finished" not in st else \
            f"{(st['finished'] - st['started']) / 60:.1f} min"
        lines += [f"### {row.key}", "", f"Budget: {row.budget()}. Wall time: {wall}.", "",
                  "| loss | tuned | seeds | test acc | K-Means acc | silhouette | MAP@R | "
                  "vs Gaussian-COREL | vs Cosine-COREL |",
                  "|---|---|---|---|---|---|---|---|---|"]
        summaries = {loss: summarize(ls.get("results", [])) for loss, ls in st["losses"].items()}
        for loss in LOSSES:
            ls = st["losses"].get(loss, {})
            decl = declaration(loss)
            name = decl.short + ("" if decl.class_vectors else " *")
            if "results" not in ls:
                lines.append(f"| {name} | (not finished) | | | | | | | |")
                continue
            s = summaries[loss]
            vs = [("-" if loss == ref or ref not in summaries else _versus(s, summaries[ref]))
                  for ref in REFERENCES]
            lines.append(f"| {name} | {_params(loss, ls.get('params'))} | {len(s['test_accuracy'])} | "
                         f"{_cell(s['test_accuracy'])} | {_cell(s['kmeans_accuracy'])} | "
                         f"{_cell(s['silhouette'], pct=False)} | {_cell(s['map_at_r'])} | "
                         f"{vs[0]} | {vs[1]} |")
        lines.append("")
    lines += [end, ""]
    return "\n".join(lines)

