"""The paper's CNN rows (Table 1) at its protocol on one GPU, each run its own process.

MNIST and Fashion-MNIST, the CNN, the four losses at the paper's tuned lambdas
(``corel.report.PAPER_TABLE2``; CCE has none), several seeds, 150 epochs, Adam at 1e-4,
batch 128, test accuracy at the best-validation epoch: what ``corel.train.fit`` does,
the code a worker runs. Every run is a process of its own on the same device, all at once,
which keeps a GPU busy that one small CNN's step leaves mostly idle; with
``--stack-seeds`` the seeds of a row train as one stacked group instead
(``corel.train.fit_group``, each seed with its own batch order: a worker trains a
sweep's seeds so), a process per row, a third as many processes for the GPU to switch
between, each launching a third as many kernels per member. A group that fails falls back
to its runs one process each.

    python bench/cnn_rows.py launch --out rows.jsonl [--seeds 0 1 2] [--epochs 150]
        [--datasets mnist fashion-mnist] [--stop-after SECONDS] [--precision-check]
        [--stack-seeds] [--losses cce center cosine gaussian] [--until-epoch N] [--state DIR]
    python bench/cnn_rows.py table rows.jsonl        # the Markdown for docs/reproduction.md
    python bench/cnn_rows.py --smoke                 # a few seconds: that it runs

Each process appends a JSON line to ``--out`` after every epoch and a final one with the
test accuracy at the best-validation epoch, the wall time and the clustering of the test
latent space at that epoch (K-Means, the paper's Tables 3-4). ``--stop-after`` ends every
run that is still training that many seconds after the launch (its final line then says
how many epochs it had: the table marks such rows as short of the protocol).
``--until-epoch N`` ends every run after its N-th epoch of ``--epochs`` (the protocol's
length stays ``--epochs``).

``--state DIR`` makes the rows resumable across launches (for a GPU machine held for less
time than the protocol's epochs take): every process writes its runs' checkpoints (the
format a worker resumes from, ``corel.train.checkpoints``) to ``DIR/<row>.pt`` after each epoch,
and a later launch with the same DIR resumes each row from its file, under the same
process layout (``--stack-seeds`` or not), up to ``--epochs``; a row already at
``--epochs`` only writes its final line again. The final line of a resumed run counts every
epoch and the wall time of every launch. ``table`` reads the last final line of each run.

Needs: MNIST and Fashion-MNIST as IDX files under ``--data-dir`` (default $COREL_DATA_DIR;
Fashion-MNIST also from Debian's dataset-fashion-mnist), a GPU for the protocol's 150
epochs (about 7 minutes a dataset on an H100, all rows at once; it runs on a CPU, far
slower); ``--smoke`` checks in a few seconds that it runs (one stacked row on
scikit-learn's digits). ``bench/on_gpu.sh`` runs it with the GPU checks. Writes ``--out``
(JSON lines) and, with ``--state``, a checkpoint per row in DIR.

``--precision-check`` adds issue 24's bf16 check: Fashion-MNIST FFNN, Gaussian-COREL at
the paper's lambda, each seed in fp32 and in bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corel.report import PAPER_CLUSTERING, PAPER_TABLE1, PAPER_TABLE2

# The launcher imports neither torch nor the engine (seconds a launch): its processes do, in
# run_one and run_group.
if TYPE_CHECKING:
    from corel.train import EngineOptions, EpochMetrics, FitResult

LOSSES = ("cce", "center", "cosine", "gaussian")
TITLES = {"cce": "CCE", "center": "Center", "cosine": "Cosine-COREL", "gaussian": "Gaussian-COREL"}


def options() -> EngineOptions:
    """The engine's switches from COREL_CUDA_GRAPHS, COREL_NATIVE and COREL_NATIVE_DIR, as
    `corel train` reads them (bench/on_gpu.sh sets them)."""
    from corel.cli import engine_options

    return engine_options(os.environ)

def jobs(datasets: list[str], seeds: list[int], epochs: int, precision_check: bool,
         train_subset: int | None = None, extra_lams: Sequence[tuple[str, float]] = (),
         losses: Sequence[str] = LOSSES) -> list[dict[str, Any]]:
    """Every run's spec fields, the CNN rows first (the longest); ``extra_lams`` adds, for
    each dataset, a row of a loss at another lambda than the paper's (marked ``extra``)."""
    out: list[dict[str, Any]] = []
    for dataset in datasets:
        for loss in losses:
            lam = PAPER_TABLE2.get((dataset, "cnn"), {}).get(loss, 0.5)
            for seed in seeds:
                out.append({"dataset": dataset, "model": "cnn", "loss": loss, "lam": lam,
                            "seed": seed, "epochs": epochs})
        for loss, lam in extra_lams:
            for seed in seeds:
                out.append({"dataset": dataset, "model": "cnn", "loss": loss, "lam": lam,
                            "seed": seed, "epochs": epochs, "extra": True})
    if precision_check:
        lam = PAPER_TABLE2[("fashion-mnist", "ffnn")]["gaussian"]
        for seed in seeds:
            for precision in ("fp32", "bf16"):
                out.append({"dataset": "fashion-mnist", "model": "ffnn", "loss": "gaussian", "lam": lam,
                            "seed": seed, "epochs": epochs, "precision": precision})
    if train_subset:
        out = [{**fields, "train_subset": train_subset} for fields in out]
    return out


def job_name(fields: dict[str, Any]) -> str:
    loss = f"{fields['loss']}@{fields['lam']:g}" if fields.get("extra") else fields["loss"]
    return f"{fields['dataset']}/{fields['model']}/{loss}/seed{fields['seed']}/{fields.get('precision', 'fp32')}"


def spec_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """A job's fields as an ExperimentSpec takes them (without this script's own marks)."""
    return {k: v for k, v in fields.items() if k != "extra"}


def extra_lam(text: str) -> tuple[str, float]:
    """``LOSS=LAM`` of --extra-lam."""
    loss, _, lam = text.partition("=")
    if loss not in LOSSES or not lam:
        raise argparse.ArgumentTypeError(f"{text!r}: give LOSS=LAM, LOSS one of {', '.join(LOSSES)}")
    return loss, float(lam)


@dataclass
class Stop:
    """When a process ends its runs: at the deadline ``at`` (seconds since the epoch), or
    after epoch ``until``; an epoch under way finishes first."""

    at: float | None = None
    until: int | None = None

    def now(self, epoch: int) -> bool:
        return ((self.at is not None and time.time() >= self.at)
                or (self.until is not None and epoch >= self.until))


class State:
    """One process's runs (a run, or a row's seeds stacked), resumable: ``DIR/<row>.pt``
    holds their checkpoints of the last finished epoch (``Run.checkpoint()``'s format) and
    the wall time of the sessions that trained them."""

    def __init__(self, directory: str | os.PathLike[str], names: list[str]) -> None:
        self.names = names
        self.path = Path(directory) / state_file(names)
        self.earlier = [0.0] * len(names)  # wall seconds of earlier sessions, per run
        self.started = time.perf_counter()

    def load(self) -> list[dict[str, Any]] | None:
        """The saved checkpoints, one per run, or None where this row has no state yet."""
        if not self.path.exists():
            return None
        import torch

        saved = torch.load(self.path, map_location="cpu", weights_only=True)
        if saved["jobs"] != self.names:
            raise ValueError(f"{self.path} holds the state of {saved['jobs']}, not of {self.names}")
        self.earlier = [float(w) for w in saved["wall_s"]]
        checkpoints: list[dict[str, Any]] = saved["checkpoints"]
        return checkpoints

    def wall(self) -> list[float]:
        """Each run's wall time so far, earlier sessions included."""
        return [w + time.perf_counter() - self.started for w in self.earlier]

    def save(self, checkpoints: list[dict[str, Any]]) -> None:
        """Replace the file in one step: a process killed while writing leaves the last one."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        import torch

        torch.save({"jobs": self.names, "wall_s": self.wall(), "checkpoints": checkpoints}, tmp)
        os.replace(tmp, self.path)


    def split(self) -> None:
        """The saved state, if any, as each run's own (a stacked group's, for its runs to go
        on alone)."""
        checkpoints = self.load()
        if checkpoints is None:
            return
        for name, wall, checkpoint in zip(self.names, self.earlier, checkpoints, strict=True):
            alone = State(self.path.parent, [name])
            alone.earlier = [wall]
            alone.save([checkpoint])


def state_file(names: list[str]) -> str:
    """The state's file name for these runs (letters, digits, '.', '_', '-')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "+".join(names)) + ".pt"


def append(out: Path, row: dict[str, Any]) -> None:
    # One write of one line to a file opened for appending: lines of processes that write
    # at once do not interleave.
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")


def run_one(fields: dict[str, Any], out: Path, stop: Stop, data_dir: str | None,
            state_dir: str | None, engine: EngineOptions) -> None:
    import torch

    from corel.data import load_dataset
    from corel.spec import ExperimentSpec
    from corel.train import Callback, NotLearningError, fit

    class Progress(Callback):
        """Appends each epoch to the results file, saves the run's state (``--state``) and
        ends the run where ``stop`` says."""

        def on_epoch_end(self, metrics: EpochMetrics, run: Any) -> bool:
            append(out, {"job": name, **metrics.to_dict()})
            if state is not None:
                state.save([run.checkpoint()])
            return stop.now(metrics.epoch)

    torch.set_num_threads(1)  # many of these share the machine's cores
    name = job_name(fields)
    spec = ExperimentSpec(**spec_fields(fields))
    state = State(state_dir, [name]) if state_dir else None
    checkpoint = state.load() if state else None
    resumed = int(checkpoint[0]["epoch"]) if checkpoint else 0
    data = load_dataset(spec, data_dir)
    started = time.perf_counter()
    try:
        result = fit(spec, [Progress()], data=data,
                     checkpoint=checkpoint[0] if checkpoint else None, options=engine)
    except NotLearningError as exc:
        append(out, {"job": name, "final": True, **fields, "failed": str(exc),
                     "wall_s": state.wall()[0] if state else time.perf_counter() - started,
                     "resumed_at_epoch": resumed})
        return
    wall = state.wall()[0] if state else time.perf_counter() - started
    append(out, {**final_row(fields, result, wall, stop.at), "resumed_at_epoch": resumed})


def run_group(members: list[dict[str, Any]], out: Path, stop: Stop, data_dir: str | None,
              state_dir: str | None, engine: EngineOptions) -> None:
    """The members (one row's seeds) as one stacked group; if the group fails, each member
    in a process of its own (the plain launch), so that a fault of the stacked path costs
    time, not the row."""
    import torch

    from corel.data import load_dataset
    from corel.spec import ExperimentSpec
    from corel.train import GroupCallback, fit_group

    class GroupProgress(GroupCallback):
        """A line per member and epoch, the group's state saved (``--state``), the group
        ended where ``stop`` says."""

        def on_epoch_end(self, metrics: list[EpochMetrics], group: Any) -> bool:
            for name, m in zip(names, metrics, strict=True):
                append(out, {"job": name, **m.to_dict()})
            if state is not None:
                state.save(group.checkpoints())
            return stop.now(group.epoch)

    torch.set_num_threads(1)
    names = [job_name(fields) for fields in members]
    specs = [ExperimentSpec(**spec_fields(fields)) for fields in members]
    state = State(state_dir, names) if state_dir else None
    checkpoints = state.load() if state else None
    started = time.perf_counter()
    try:
        data = load_dataset(specs[0], data_dir)
        results = fit_group(specs, [GroupProgress()], data=data, checkpoints=checkpoints,
                            options=engine)
    except Exception as exc:  # any fault: the runs go on alone
        print(f"stacked group {names} failed ({type(exc).__name__}: {exc}); its runs go on alone",
              flush=True)
        if state is not None:
            state.split()  # each run resumes from its member's last saved epoch
        wait_all([(name, start_one(fields, out, stop, data_dir, state_dir=state_dir))
                  for name, fields in zip(names, members, strict=True)])
        return
    wall = state.wall() if state else [time.perf_counter() - started] * len(members)
    resumed = int(checkpoints[0]["epoch"]) if checkpoints else 0
    for fields, result, seconds in zip(members, results, wall, strict=True):
        if result.failed:
            append(out, {"job": job_name(fields), "final": True, **fields, "failed": result.failed,
                         "wall_s": seconds, "stacked": len(members), "resumed_at_epoch": resumed})
        else:
            append(out, {**final_row(fields, result, seconds, stop.at), "stacked": len(members),
                         "resumed_at_epoch": resumed})


def final_row(fields: dict[str, Any], result: FitResult, wall: float, stop_at: float | None) -> dict[str, Any]:
    """A run's final line: its test accuracy at the best-validation epoch, how long it
    trained and where, and (a CNN) the K-Means scores of its test latent space."""
    import torch

    from corel.clustering import default_metric, evaluate_clustering
    from corel.train import represent
    from corel.train.steps import pass_mode

    run = result.run
    row: dict[str, Any] = {
        "job": job_name(fields), "final": True, **fields, "test_accuracy": result.test_accuracy,
        "best_epoch": result.best_epoch, "epochs_done": len(result.history), "wall_s": wall,
        "device": str(run.device), "precision_used": run.precision,
        "cuda_graphs": pass_mode(run.options, run.device, run.data.x_train) == "capture",
        "gpu": torch.cuda.get_device_name(run.device) if run.device.type == "cuda" else None,
        "seconds_per_epoch": statistics.median(m.seconds for m in result.history)}
    if fields["model"] == "cnn" and (stop_at is None or time.time() < stop_at + 60):
        h = represent(result.model, run.data.x_test).float().cpu().numpy()
        y = run.data.y_test.cpu().numpy()
        scores = evaluate_clustering(h, y, metric=default_metric(result.spec.loss), algorithms=("kmeans",))
        row["clustering"] = {k: v for k, v in scores["kmeans"].items() if isinstance(v, (int, float))}
    return row


def start_one(fields: dict[str, Any] | list[dict[str, Any]], out: Path, stop: Stop,
              data_dir: str | None, command: str = "run", state_dir: str | None = None
              ) -> subprocess.Popen[bytes]:
    """This script's ``run`` (or ``run-group``, ``fields`` a list) in a process of its own."""
    cmd = [sys.executable, __file__, command, "--out", str(out), "--fields", json.dumps(fields)]
    if stop.at:
        cmd += ["--stop-at", str(stop.at)]
    if stop.until:
        cmd += ["--until-epoch", str(stop.until)]
    if data_dir:
        cmd += ["--data-dir", data_dir]
    if state_dir:
        cmd += ["--state", state_dir]
    return subprocess.Popen(cmd)


def wait_all(procs: list[tuple[str, subprocess.Popen[bytes]]]) -> None:
    for name, proc in procs:
        if proc.wait() != 0:
            print(f"{name}: exit status {proc.returncode}", flush=True)


def by_row(todo: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The runs grouped by everything but the seed: a row's seeds."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for fields in todo:
        rows.setdefault(json.dumps({k: v for k, v in fields.items() if k != "seed"}, sort_keys=True),
                        []).append(fields)
    return list(rows.values())


def device_name() -> str:
    """The GPU the runs train on, or CPU. torch (seconds of every launch) is imported only
    where an NVIDIA driver is."""
    if shutil.which("nvidia-smi") is None and not Path("/dev/nvidiactl").exists():
        return "CPU"
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"


def launch(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    todo = jobs(args.datasets, args.seeds, args.epochs, args.precision_check, args.train_subset,
                args.extra_lam, args.losses)
    stop = Stop(time.time() + args.stop_after if args.stop_after else None, args.until_epoch)
    rows = by_row(todo) if args.stack_seeds else [[fields] for fields in todo]
    if args.state:
        Path(args.state).mkdir(parents=True, exist_ok=True)
        ours = {state_file([job_name(f) for f in members]) for members in rows}
        others = sorted(p.name for p in Path(args.state).glob("*.pt") if p.name not in ours)
        if others:  # e.g. saved with(out) --stack-seeds: those runs would start again
            print(f"{args.state}: left alone, of no process of this launch: {', '.join(others)}", flush=True)
    where = (f"{len(rows)} processes' runs one after another in this one" if args.in_process
             else f"{len(rows)} processes at once")
    print(f"{len(todo)} runs in {where} on "
          f"{device_name()}"
          + (f", stopping any still training after {args.stop_after:.0f} s" if stop.at else "")
          + (f", ending every run at epoch {stop.until}" if stop.until else "")
          + (f", resumable from {args.state}" if args.state else ""), flush=True)
    started = time.perf_counter()
    if args.in_process:
        in_process(rows, out, stop, args.data_dir, args.state)
    else:
        wait_all([(job_name(members[0]), start_one(members[0], out, stop, args.data_dir, state_dir=args.state))
                  if len(members) == 1
                  else ("+".join(job_name(f) for f in members),
                        start_one(members, out, stop, args.data_dir, "run-group", args.state)) for members in rows])
    print(f"all {len(todo)} runs ended after {time.perf_counter() - started:.0f} s", flush=True)
    print(table(out))


def in_process(rows: list[list[dict[str, Any]]], out: Path, stop: Stop, data_dir: str | None,
               state_dir: str | None) -> None:
    """What each process of a launch runs (``run``, or ``run-group`` for a row's stacked
    seeds), in this process, one after another, on its one thread as theirs: the runs a
    test compares a stopped and resumed launch with, without a process a row."""
    import torch

    threads, engine = torch.get_num_threads(), options()
    try:
        with engine.applied():
            for members in rows:
                if len(members) == 1:
                    run_one(members[0], out, stop, data_dir, state_dir, engine)
                else:
                    run_group(members, out, stop, data_dir, state_dir, engine)
    finally:
        torch.set_num_threads(threads)


def finals(path: Path) -> list[dict[str, Any]]:
    """The last final line of each run (a resumed run writes one at each session's end)."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return list({r["job"]: r for r in rows if r.get("final")}.values())


def table(path: Path) -> str:
    """Markdown: the CNN rows (mean +- std over seeds against the paper's Table 1), their
    clustering (Tables 3-4) and the bf16 check, from the final lines of ``path``."""
    rows = finals(path)
    cells: dict[tuple[str, str, float], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["model"] == "cnn":  # an extra row's lambda keeps it apart from the paper's row
            cells[(r["dataset"], r["loss"], r["lam"] if r.get("extra") else -1.0)].append(r)
    lines = ["| setting | loss | lambda | test accuracy (%) | seeds | epochs | paper | difference | wall (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (dataset, loss, extra), runs in sorted(cells.items()):
        title = TITLES[loss] + (" (extra)" if extra >= 0 else "")
        done = [r for r in runs if r.get("test_accuracy") is not None]
        accs = [100 * r["test_accuracy"] for r in done]
        paper = PAPER_TABLE1.get((dataset, "cnn"), {}).get(loss)
        lam = "-" if loss == "cce" else f"{runs[0]['lam']:g}"
        epochs = sorted({r["epochs_done"] for r in done}) or [0]
        span = f"{epochs[0]}" if len(epochs) == 1 else f"{epochs[0]}-{epochs[-1]}"
        if not accs:
            lines.append(f"| {dataset}/cnn | {title} | {lam} | did not train | 0 | - | "
                         f"{paper if paper is not None else '-'} | - | - |")
            continue
        mean = statistics.mean(accs)
        std = statistics.stdev(accs) if len(accs) > 1 else 0.0
        wall = statistics.median(r["wall_s"] for r in done)
        diff = f"{mean - paper:+.2f}" if paper is not None else "-"
        lines.append(f"| {dataset}/cnn | {title} | {lam} | {mean:.2f} +- {std:.2f} | {len(accs)} | "
                     f"{span} of {runs[0]['epochs']} | {paper if paper is not None else '-'} | {diff} | {wall:.0f} |")
    clustered = [(k, [r["clustering"] for r in v if r.get("clustering")]) for k, v in sorted(cells.items())]
    if any(c for _, c in clustered):
        lines += ["", "K-Means on the test latent space at the best-validation epoch (mean over seeds; "
                  "paper's Tables 3-4 in brackets):", "",
                  "| setting | loss | accuracy | ARI | V-measure | silhouette |", "|---|---|---|---|---|---|"]
        for (dataset, loss, extra), scores in clustered:
            if not scores:
                continue
            paper_row = PAPER_CLUSTERING.get((dataset, "cnn"), {}).get((loss, "kmeans"), {})
            cols = []
            for key in ("accuracy", "ari", "v_measure", "silhouette"):
                mean = statistics.mean(s[key] for s in scores)
                ref = paper_row.get(key)
                cols.append(f"{mean:.3f}" + (f" ({ref:.3f})" if ref is not None else ""))
            title = TITLES[loss] + (f" (extra, lambda {extra:g})" if extra >= 0 else "")
            lines.append(f"| {dataset}/cnn | {title} | " + " | ".join(cols) + " |")
    checks = [r for r in rows if r["model"] == "ffnn" and r.get("test_accuracy") is not None]
    if checks:
        by_seed: dict[int, dict[str, float]] = defaultdict(dict)
        for r in checks:
            by_seed[r["seed"]][r["precision"]] = 100 * r["test_accuracy"]
        diffs = [p["bf16"] - p["fp32"] for p in by_seed.values() if {"bf16", "fp32"} <= p.keys()]
        lines += ["", "bf16 against fp32, Fashion-MNIST FFNN, Gaussian-COREL (test accuracy %, epochs "
                  f"{sorted({r['epochs_done'] for r in checks})}):", ""]
        lines += [f"- seed {seed}: fp32 {p.get('fp32', float('nan')):.2f}, bf16 {p.get('bf16', float('nan')):.2f}"
                  for seed, p in sorted(by_seed.items())]
        if diffs:
            lines.append(f"- bf16 - fp32 test accuracy: mean {statistics.mean(diffs):+.2f} points "
                         f"(max |d| {max(abs(d) for d in diffs):.2f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="a few seconds: launch one stacked row (digits, two seeds, five epochs) "
                        "and print its table, to check that the benchmark runs")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("launch", help="every run at once, one process each")
    p.add_argument("--out", required=True)
    p.add_argument("--datasets", nargs="+", default=["mnist", "fashion-mnist"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=150)
    p.add_argument("--stop-after", type=float, default=None)
    p.add_argument("--precision-check", action="store_true")
    p.add_argument("--train-subset", type=int, default=None, help="a smoke test's smaller training set")
    p.add_argument("--stack-seeds", action="store_true", help="a row's seeds as one stacked group")
    p.add_argument("--extra-lam", type=extra_lam, nargs="*", default=[], metavar="LOSS=LAM",
                   help="a row more per dataset of LOSS at LAM (beside the paper's lambda), e.g. gaussian=0.6")
    p.add_argument("--losses", nargs="*", choices=LOSSES, default=list(LOSSES),
                   help="the paper's rows to train (default all four; none: only the --extra-lam rows)")
    p.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR"))
    p.add_argument("--until-epoch", type=int, default=None,
                   help="end every run after this epoch (of --epochs)")
    p.add_argument("--state", default=None,
                   help="a folder of the runs' resumable state: saved after each epoch, resumed from")
    p.add_argument("--in-process", action="store_true",
                   help="each process's runs in this one, one after another (the tests' reference runs)")
    for command, what in (("run", "one run (launch starts these)"),
                          ("run-group", "a row's seeds stacked (launch --stack-seeds starts these)")):
        p = sub.add_parser(command, help=what)
        p.add_argument("--out", required=True)
        p.add_argument("--fields", required=True)
        p.add_argument("--stop-at", type=float, default=None)
        p.add_argument("--until-epoch", type=int, default=None)
        p.add_argument("--data-dir", default=None)
        p.add_argument("--state", default=None)
    p = sub.add_parser("table", help="the Markdown of a results file")
    p.add_argument("path")
    args = parser.parse_args(argv)
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="corel-cnn-rows-") as tmp:
            out = Path(tmp) / "rows.jsonl"
            launch(parser.parse_args(["launch", "--out", str(out), "--datasets", "digits", "--epochs", "5",
                                      "--seeds", "0", "1", "--stack-seeds", "--losses", "cosine"]))
    elif args.command is None:
        parser.error("a command is needed: launch, run, run-group or table")
    elif args.command == "launch":
        launch(args)
    elif args.command in ("run", "run-group"):
        engine = options()
        with engine.applied():  # the switches that act below the loop, for the whole process
            (run_one if args.command == "run" else run_group)(
                json.loads(args.fields), Path(args.out), Stop(args.stop_at, args.until_epoch),
                args.data_dir, args.state, engine)
    else:
        print(table(Path(args.path)))


if __name__ == "__main__":
    main()
