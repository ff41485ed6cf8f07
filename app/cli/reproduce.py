"""``corel reproduce --all``: the paper's Table 1 matrix, run as sweeps on a service.

Each row of the matrix (a dataset and a model) is two sweeps, as in the paper:

1. **tune**: every loss at every lambda of a grid, a few seeds, fewer epochs. Its
   validation accuracy picks each loss's lambda (paper Table 2).
2. **final**: every loss at the paper's lambda (Table 2) where that is known, at its
   tuned lambda otherwise (``lam_by_loss``), more seeds, the row's full budget. Its test accuracy at the best-validation epoch is Table 1; its test
   latent spaces give Tables 3-4.

The runs are ordinary experiments, so they survive a restart of the service or a
worker. The client only keeps a small state file (row -> sweep ids, times). Running the
same command again picks up where it stopped and creates nothing twice. When every row is
done, it writes the tables between two markers of the budget's own in a Markdown file
(``--doc``, by default ``reproduction.md`` in the working directory), leaving the rest of
the file, other budgets' tables included, as it was.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from corel.loss_catalog import PAPER_LOSSES, declaration
from corel.report import PAPER_TABLE1, PAPER_TABLE2

LOSSES = PAPER_LOSSES
NAMES = {name: declaration(name).short for name in LOSSES}
TITLES = {"paper": "Table 1 at the paper's protocol", "session": "Table 1, every row, at a session's budget",
          "smoke": "Table 1, the smoke budget"}
TEN_LAMBDAS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9)


@dataclass(frozen=True)
class Row:
    """One row of Table 1 and the budget it gets."""

    dataset: str
    model: str
    lambdas: tuple[float, ...]
    tune_seeds: int
    tune_epochs: int
    seeds: int
    epochs: int
    lr: float = 1e-4
    batch_size: int = 128
    train_subset: int | None = None

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.model}"

    def base(self, epochs: int) -> dict[str, Any]:
        spec: dict[str, Any] = {"dataset": self.dataset, "model": self.model, "epochs": epochs,
                                "lr": self.lr, "batch_size": self.batch_size}
        if self.train_subset:
            spec["train_subset"] = self.train_subset
        return spec

    def budget(self) -> str:
        subset = f", first {self.train_subset} training rows" if self.train_subset else ""
        return (f"tune: {len(self.lambdas)} lambdas x {self.tune_seeds} seed(s) x "
                f"{self.tune_epochs} epochs; final: {self.seeds} seeds x {self.epochs} epochs{subset}")


# The budgets. "paper" is the paper's protocol where it is known (150 epochs) with ten
# lambdas to tune on; "session" is what fits in about an hour and a half of a 2-core
# machine; "smoke" is for tests.
BUDGETS: dict[str, tuple[Row, ...]] = {
    "paper": (
        Row("mnist", "ffnn", TEN_LAMBDAS, 2, 30, 5, 150),
        Row("fashion-mnist", "ffnn", TEN_LAMBDAS, 2, 30, 5, 150),
        Row("mnist", "cnn", (0.5, 0.7, 0.85), 1, 20, 5, 150),
        Row("fashion-mnist", "cnn", (0.5, 0.7, 0.85), 1, 20, 5, 150),
        Row("ag-news", "ffnn", TEN_LAMBDAS, 3, 40, 5, 150),
        Row("ag-news", "cnn", (0.5, 0.7, 0.85), 2, 20, 5, 50),
    ),
    "session": (
        Row("ag-news", "ffnn", TEN_LAMBDAS, 2, 40, 5, 80),
        Row("mnist", "ffnn", TEN_LAMBDAS, 1, 15, 3, 100),
        Row("fashion-mnist", "ffnn", TEN_LAMBDAS, 1, 15, 3, 100),
        Row("ag-news", "cnn", (0.5, 0.85), 1, 5, 2, 10),
        Row("fashion-mnist", "cnn", (0.5, 0.85), 1, 3, 2, 6, train_subset=20_000),
        Row("mnist", "cnn", (0.5, 0.85), 1, 3, 2, 6, train_subset=20_000),
    ),
    "smoke": (
        Row("digits", "ffnn", (0.5, 0.85), 1, 2, 2, 3, lr=3e-3, batch_size=64),
    ),
}


def markers(budget: str) -> tuple[str, str]:
    """The two lines between which ``corel reproduce --all --budget B`` writes its block."""
    return (f"<!-- corel reproduce --all --budget {budget}: begin "
            "(generated; edits between the markers are replaced) -->",
            f"<!-- corel reproduce --all --budget {budget}: end -->")


def select_rows(budget: str, keys: str | None) -> tuple[Row, ...]:
    """The budget's rows, or those named in ``keys`` ("mnist/ffnn,fashion-mnist/ffnn")."""
    rows = BUDGETS[budget]
    if not keys:
        return rows
    wanted = [k.strip() for k in keys.split(",") if k.strip()]
    known = {row.key for row in rows}
    unknown = [k for k in wanted if k not in known]
    if unknown or not wanted:
        raise ValueError(f"--rows: {', '.join(unknown) or 'nothing'} is not a row of the "
                         f"{budget!r} budget; its rows are {', '.join(sorted(known))}")
    return tuple(row for row in rows if row.key in wanted)


def final_lambdas(row: Row, tuned: dict[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """Each loss's lambda for the final sweep and where it comes from: the paper's Table 2
    where it gives one for the row, this run's tune sweep otherwise."""
    paper = PAPER_TABLE2.get((row.dataset, row.model), {})
    lams = {loss: paper.get(loss, lam) for loss, lam in tuned.items()}
    source = {loss: "paper" if loss in paper else "tuned" for loss in tuned}
    return lams, source


def _sweep_body(row: Row, stage: str, tuned: dict[str, float] | None) -> dict[str, Any]:
    if stage == "tune":
        return {"base": row.base(row.tune_epochs),
                "grid": {"loss": list(LOSSES), "lam": list(row.lambdas),
                         "seed": list(range(row.tune_seeds))}}
    # The losses without lambda train once per seed; the others at their tuned lambda.
    losses = [name for name in LOSSES if "lam" not in declaration(name).params] + list(tuned or {})
    return {"base": row.base(row.epochs), "grid": {"loss": losses, "seed": list(range(row.seeds))},
            "lam_by_loss": tuned}


def tuned_lambdas(report: dict[str, Any]) -> dict[str, float]:
    """Each lambda-taking loss's tuned lambda from a tune sweep's JSON report."""
    return {loss: t["tuned_lambda"] for loss, t in report["lambda_tuning"].items()
            if t["tuned_lambda"] is not None}


class Reproduction:
    """The state machine over the rows; ``step()`` advances every row it can."""

    def __init__(self, client: httpx.Client, rows: tuple[Row, ...], state_path: Path,
                 say: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr)):
        self.client = client
        self.rows = rows
        self.state_path = state_path
        self.say = say
        self.state: dict[str, Any] = {}
        if state_path.exists():
            self.state = json.loads(state_path.read_text())
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

    def _sweep(self, row: Row, stage: str, tuned: dict[str, float] | None) -> dict[str, Any] | None:
        """The stage's sweep progress, creating it the first time; None if the service
        has lost it (a new database): it is then created again."""
        st = self.state["rows"].setdefault(row.key, {"row": asdict(row)})
        sweep_id = st.get(stage)
        if sweep_id is not None:
            r = self.client.get(f"/sweeps/{sweep_id}")
            if r.status_code == 200:
                return dict(r.json())
            if r.status_code != 404:
                raise SystemExit(f"corel: GET /sweeps/{sweep_id}: {r.status_code}: {r.text}")
            self.say(f"{row.key}: sweep {sweep_id} is gone from the service; creating it again")
        queued = self._call("POST", "/sweeps", json=_sweep_body(row, stage, tuned))
        st[stage] = queued["id"]
        st.setdefault("started", time.time())
        self._save()
        self.say(f"{row.key}: {stage} sweep {queued['id']}: {queued['size']} experiments in "
                 f"{queued['groups']} tasks")
        return None

    def step(self) -> bool:
        """Advance every row; True when all are done."""
        done = True
        for row in self.rows:
            st = self.state["rows"].setdefault(row.key, {"row": asdict(row)})
            if "report" in st:
                continue
            done = False
            tune = self._sweep(row, "tune", None)
            if tune is None or not tune["finished"]:
                continue
            if "tuned" not in st:
                rep = self._call("GET", f"/sweeps/{st['tune']}/report", params={"clustering": "false"})
                st["tuned"] = tuned_lambdas(rep)
                st["final_lam"], st["lam_source"] = final_lambdas(row, st["tuned"])
                st["tune_markdown"] = self.client.get(
                    f"/sweeps/{st['tune']}/report",
                    params={"format": "markdown", "clustering": "false"}).text
                self._save()
            final = self._sweep(row, "final", st.get("final_lam", st["tuned"]))
            if final is None or not final["finished"]:
                continue
            st["report"] = self._call("GET", f"/sweeps/{st['final']}/report")
            st["final_markdown"] = self.client.get(
                f"/sweeps/{st['final']}/report", params={"format": "markdown"}).text
            st["finished"] = time.time()
            self._save()
            self.say(f"{row.key}: done in {(st['finished'] - st['started']) / 60:.1f} min")
        return done

    def progress(self) -> str:
        parts = []
        for row in self.rows:
            st = self.state["rows"].get(row.key, {})
            stage = "done" if "report" in st else "final" if "final" in st else "tune"
            parts.append(f"{row.key}: {stage}")
        return "; ".join(parts)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}"


def render(state: dict[str, Any], budget: str, command: str) -> str:
    """The generated block: the summary of Table 1, then each row's tables, for every row
    of the budget that the state has started."""
    begin, end = markers(budget)
    rows = tuple(row for row in BUDGETS[budget] if row.key in state["rows"])
    lines = [begin, "", f"## {TITLES[budget]} (generated by `corel reproduce --all`)", "",
             f"Command: `{command}`", "",
             f"Machine: {cpu_name()} ({os.cpu_count()} cores, {platform.machine()}, "
             f"Python {platform.python_version()}); {_total(state, rows)}.", "",
             "Test accuracy (%) at the best-validation epoch, mean +- std over the final seeds, "
             "each loss at the paper's lambda (Table 2) where it is known, marked (paper), at "
             "the lambda its tune sweep picked otherwise; the paper's figure and the "
             "difference in points where the paper has the row.", "",
             "| dataset / model | loss | lambda | mean +- std | seeds | paper | difference |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        st = state["rows"].get(row.key, {})
        rep = st.get("report")
        if rep is None:
            lines.append(f"| {row.key} | (not finished) | | | | | |")
            continue
        paper = PAPER_TABLE1.get((row.dataset, row.model), {})
        got = {r["loss"]: r for r in rep["test_accuracy"]["rows"]}
        for loss in LOSSES:
            r = got.get(loss)
            published = paper.get(loss)
            if r is None:
                failed = "did not train (see its tune sweep)" if loss not in st.get("tuned", {}) \
                    and "lam" in declaration(loss).params else "no succeeded run"
                lines.append(f"| {row.key} | {NAMES[loss]} | - | {failed} | 0 | "
                             f"{published if published is not None else '-'} | - |")
                continue
            std = "" if r["std"] is None else f" +- {100 * r['std']:.2f}"
            diff = "-" if published is None else f"{100 * r['mean'] - published:+.2f}"
            lam = "-" if r["lam"] is None else f"{r['lam']:g}"
            if st.get("lam_source", {}).get(loss) == "paper":
                lam += " (paper)"
            lines.append(f"| {row.key} | {NAMES[loss]} | {lam} | {100 * r['mean']:.2f}{std} | "
                         f"{r['n']} | {published if published is not None else '-'} | {diff} |")
    lines += ["", "Rows share the service's workers, so their wall times (from the tune sweep's "
              "creation to the final sweep's end) overlap.", "",
              "| dataset / model | budget | wall time |", "|---|---|---|"]
    for row in rows:
        st = state["rows"].get(row.key, {})
        wall = "-" if "finished" not in st else f"{(st['finished'] - st['started']) / 60:.1f} min"
        lines.append(f"| {row.key} | {row.budget()} | {wall} |")
    for row in rows:
        st = state["rows"].get(row.key, {})
        if "report" not in st:
            continue
        lines += ["", f"### {row.key}", "", f"Budget: {row.budget()}; Adam, lr {row.lr:g}, "
                  f"batch {row.batch_size}.", "", "Tune sweep (paper Table 2):", ""]
        lines += [_demote(st["tune_markdown"])]
        lines += ["Final sweep (paper Tables 1, 3 and 4):", "", _demote(st["final_markdown"])]
    lines += [end, ""]
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _total(state: dict[str, Any], rows: tuple[Row, ...]) -> str:
    runs = [state["rows"].get(row.key, {}) for row in rows]
    if not runs or any("finished" not in r for r in runs):
        return "not finished"
    wall = max(r["finished"] for r in runs) - min(r["started"] for r in runs)
    return f"{wall / 60:.1f} min in all, interruptions included"


def _demote(markdown: str) -> str:
    """Sweep reports use ## and ###; inside a row's section they go two levels down."""
    return "\n".join("##" + line if line.startswith("#") else line for line in markdown.splitlines())


def write_block(doc: Path, block: str, budget: str,
                marks: tuple[str, str] | None = None) -> None:
    """Put the block between the budget's markers (``marks``: others') in ``doc``, appended
    when it has none."""
    begin, end = marks or markers(budget)
    text = doc.read_text() if doc.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block.rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block
    tmp = doc.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, doc)
