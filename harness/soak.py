"""A randomized fault soak: runs submitted to the real service while its processes and its
PostgreSQL and Redis are killed, stopped, frozen, restarted and flushed.

Used by ``bench/fault_soak.py`` (the full soak) and ``tests/app/processes/test_fault_soak.py`` (a
short one in ``make test``). Everything runs on this machine: a PostgreSQL cluster and a
Redis server of the soak's own (harness/servers.py, stopped by pid or data directory,
never the shared ones), the API as ``corel serve --no-worker`` and the workers as
``corel worker`` processes, each in a process group of its own so that a SIGKILL takes the
whole process as a crash would. A killed API or worker is started again after a pause, as a
supervisor (compose's ``restart:``, systemd, Kubernetes) would.

The six kinds of fault (seven with the artifacts on S3: the S3 server stopped) are dealt from a shuffled deck, one every ``fault_gap`` seconds, for
``fault_seconds``; then the soak waits for every accepted run to finish and checks:

* every accepted run ended ``succeeded`` within ``deadline`` seconds of the last fault,
  beyond the time the training left at that moment takes at the rate the cluster trained at
  until then (faults included): the drain, which depends on the machine (this check used to
  fail on a machine half as fast whose recovery was as quick), while the deadline measures
  the recovery;
* each of its epochs is recorded once (1..epochs, no gap, no repeat);
* its figures equal those of the same spec trained once, uninterrupted, in this process,
  on the torch threads the run recorded (``experiments.threads``: its worker's share of the
  host when it first started, kept when it resumed elsewhere);
* no row exists that the client was not told about: every row in the database is an
  accepted submission.

The deck also holds a card that is not a fault, ``promotion``: the model "soak" (two
succeeded runs its versions, a collection of 600 digits rows) has its alias production
flipped to its other version, forced, the collection embedded and indexed by it, while the
next cards' faults come; at the end every promotion has flipped (or met a conflict), the
alias names the last card's version, its history holds one move per flip, and a search by
alias answers with that version.

With ``sweep_lams``, a pruned sweep is submitted too, before the first fault (one stacked
group of cosine runs over those lambdas, successive halving with eta 3 from epoch 2), and it
must end as the library's uninterrupted ``fit_group(..., prune=...)`` of the same specs ends
in this process: the same members pruned at the same rungs, every other one succeeded, each
member's epochs recorded once up to its rung or the last, the survivors' validation figures
those of the uninterrupted group (within a row or two: float32 in the worker's stack and in
this process's).
"""

from __future__ import annotations

import io
import json
import random
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
import redis

from app.core.migrate import upgrade
from app.core.settings import Settings
from harness.servers import PrivatePostgres, PrivateRedis, PrivateSeaweed, free_port
from harness.stack import Stack
from harness.wait import http_status, wait_until

FINISHED = ("succeeded", "failed", "cancelled", "pruned")
FAULTS = ("worker-kill", "api-kill", "postgres-stop", "postgres-freeze", "redis-restart",
          "redis-flush")
# With its artifacts on S3 (SoakConfig.s3), the deck holds a seventh kind: the S3 server
# stopped for an outage's length (a checkpoint written meanwhile waits it out).
S3_FAULTS = ("s3-stop",)


# Not a fault: a model's alias promoted (its collection embedded and indexed by the version
# it flips to) while the next faults come. The first card makes the model "soak" of two
# succeeded runs and a collection of digits rows; each card flips production to the other
# version (forced: the gate is tested elsewhere).
PROMOTION = "promotion"
SOAK_MODEL = "soak"


def faults_of(config: SoakConfig) -> tuple[str, ...]:
    return FAULTS + S3_FAULTS + (PROMOTION,) if config.s3 else (*FAULTS, PROMOTION)
LOSSES = ("cce", "center", "cosine", "gaussian")


@dataclass
class SoakConfig:
    seed: int = 7
    runs: int = 24
    epochs: int = 100
    # Small batches and a wider layer: about 15 s a run here, so that the queue stays deep
    # through the faults and work is left when they stop.
    batch_size: int = 4
    hidden: int = 256
    submit_seconds: float = 120.0
    fault_seconds: float = 240.0
    fault_gap: tuple[float, float] = (10.0, 25.0)
    outage: tuple[float, float] = (2.0, 8.0)  # how long a stopped or frozen service stays so
    deadline: float = 120.0  # every accepted run finished this long after the last fault
    wait: float = 300.0  # how long to watch after the last fault before giving up
    workers: int = 2
    lease_seconds: float = 10.0
    heartbeat_seconds: float = 2.0
    redis_aof: bool = True  # as docker-compose.yml runs it
    # Torch threads per worker (COREL_WORKER_TORCH_THREADS). None, as users run them: the
    # product's default, the workers of a host dividing its cores (app/jobs/workers.py).
    worker_threads: int | None = None
    unique_specs: int = 8  # runs cycle through this many specs (the references' cost)
    # The faults in this order instead of shuffled decks (a test that must meet each kind
    # while work is queued); the soak stops dealing when it runs out.
    deck: tuple[str, ...] | None = None
    # With a deck: before each fault, this many runs more are submitted, and the fault waits
    # until the workers are training (as many runs as there are workers, or every run left),
    # so that every fault, the last one included, strikes work in training on a machine of
    # any speed. (Paced instead by the share of epochs trained, a fast machine had trained
    # every run before the deck's last card was dealt.) 0: off.
    feed: int = 0
    logdir: Path | None = None
    # Artifacts (checkpoints) in an S3 server of the soak's own (SeaweedFS), not a local
    # folder; its deck then deals S3_FAULTS too.
    s3: bool = False
    # A pruned sweep over these lambdas beside the runs (see the module's docstring); () none.
    sweep_lams: tuple[float, ...] = ()

    @property
    def total_runs(self) -> int:
        """The runs submitted in all: ``runs`` at the start, ``feed`` before each fault."""
        return self.runs + self.feed * sum(1 for kind in self.deck or () if kind != PROMOTION)


@dataclass
class SoakReport:
    config: SoakConfig
    accepted: list[int] = field(default_factory=list)
    spec_index: dict[int, int] = field(default_factory=dict)  # accepted id -> spec_of's index
    refused: list[str] = field(default_factory=list)  # answers that told the client to retry
    faults: list[tuple[float, str]] = field(default_factory=list)
    statuses: dict[int, str] = field(default_factory=dict)
    unfinished: dict[int, str] = field(default_factory=dict)
    stray_rows: list[int] = field(default_factory=list)
    duplicated_epochs: int = 0
    missing_epochs: int = 0
    unequal: list[int] = field(default_factory=list)
    last_fault_at: float = 0.0
    # Seconds the epochs left at the last fault take at the soak's own rate until then.
    drain_seconds: float = 0.0
    all_finished_after: float | None = None  # seconds after the last fault
    redis_state: dict[str, Any] = field(default_factory=dict)
    logdir: Path | None = None
    sweep_id: int | None = None
    # The pruned sweep's members: id -> (status, the rung it was pruned at or None).
    sweep_members: dict[int, tuple[str, int | None]] = field(default_factory=dict)
    sweep_unequal: list[str] = field(default_factory=list)  # how it differs from the library's
    # The promotion cards': the version each asked production to name, in order, and what
    # the end found wrong (a promotion not ended, the alias or its history not as asked).
    promotion_targets: list[int] = field(default_factory=list)
    promotion_wrong: list[str] = field(default_factory=list)
    promotion_summary: str = ""

    @property
    def succeeded(self) -> int:
        return sum(1 for s in self.statuses.values() if s == "succeeded")

    @property
    def ok(self) -> bool:
        sweep_ok = not self.config.sweep_lams or (
            len(self.sweep_members) == len(self.config.sweep_lams) and not self.sweep_unequal)
        return (sweep_ok and not self.promotion_wrong and len(self.accepted) == self.config.total_runs and self.succeeded == len(self.accepted)
                and self.all_finished_after is not None
                and self.all_finished_after <= self.config.deadline + self.drain_seconds
                and not self.stray_rows and not self.duplicated_epochs
                and not self.missing_epochs and not self.unequal)

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for _, kind in self.faults:
            counts[kind] = counts.get(kind, 0) + 1
        after = ("never" if self.all_finished_after is None
                 else f"{self.all_finished_after:.1f} s after the last fault")
        lines = [
            f"seed {self.config.seed}: {len(self.accepted)} accepted, {self.succeeded} succeeded, "
            f"{len(self.unfinished)} unfinished, {len(self.stray_rows)} stray rows; "
            f"all finished {after} (the work left then: {self.drain_seconds:.0f} s at the soak's "
            f"own rate; deadline {self.config.deadline:.0f} s beyond it)",
            f"  faults ({len(self.faults)}): " + ", ".join(f"{k} x{n}" for k, n in sorted(counts.items())),
            f"  epochs recorded twice: {self.duplicated_epochs}; missing: {self.missing_epochs}; "
            f"runs whose figures differ from an uninterrupted run: {len(self.unequal)}",
            f"  submissions answered 'retry': {len(self.refused)}",
        ]
        reasons: dict[str, int] = {}
        for answer in self.refused:
            reason = answer.split(": ", 1)[1][:90]
            reasons[reason] = reasons.get(reason, 0) + 1
        lines += [f"    {n} x {reason}" for reason, n in sorted(reasons.items())]
        if self.unfinished:
            lines.append("  unfinished: " + ", ".join(f"{i} {s}" for i, s in sorted(self.unfinished.items())))
        if self.stray_rows:
            lines.append(f"  rows nobody was told about: {self.stray_rows}")
        if self.unequal:
            lines.append(f"  figures differ: {self.unequal}")
        if self.config.sweep_lams:
            counts = {}
            for status, _ in self.sweep_members.values():
                counts[status] = counts.get(status, 0) + 1
            lines.append(f"  pruned sweep {self.sweep_id}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                         + f"; rungs {sorted(r for _, r in self.sweep_members.values() if r)}; "
                         + ("as the uninterrupted pruned group" if not self.sweep_unequal
                            else "differs: " + "; ".join(self.sweep_unequal)))
        if self.promotion_targets or self.promotion_wrong:
            lines.append(f"  promotions: {self.promotion_summary}"
                         + ("; wrong: " + "; ".join(self.promotion_wrong) if self.promotion_wrong else ""))
        if self.redis_state:
            lines.append(f"  redis at the end: {self.redis_state}")
        lines.append(f"  verdict: {'PASS' if self.ok else 'FAIL'}")
        return "\n".join(lines)


def spec_of(config: SoakConfig, index: int) -> dict[str, Any]:
    """The run's spec: the runs cycle through ``unique_specs`` specs (loss and seed)."""
    k = index % config.unique_specs
    return {"dataset": "digits", "epochs": config.epochs, "batch_size": config.batch_size,
            "hidden": config.hidden, "lr": 1e-3, "loss": LOSSES[k % len(LOSSES)], "lam": 0.8,
            "seed": k // len(LOSSES)}


SWEEP_PRUNE = {"metric": "val_accuracy", "eta": 3, "min_epochs": 2}


def sweep_of(config: SoakConfig) -> dict[str, Any]:
    """The pruned sweep's body: one stacked group of cosine runs over ``sweep_lams``."""
    base = {**spec_of(config, 0), "loss": "cosine", "seed": 0}
    del base["lam"]
    return {"base": base, "grid": {"lam": list(config.sweep_lams)}, "prune": SWEEP_PRUNE}


def _submit_sweep(cluster: Cluster, report: SoakReport, stop_at: float) -> None:
    with httpx.Client(timeout=15) as http:
        report.sweep_id = _accepted(http, f"{cluster.url}/sweeps", sweep_of(cluster.config), "sweep",
                                    report, stop_at)


def _accepted(http: httpx.Client, url: str, body: dict[str, Any], what: str, report: SoakReport,
              stop_at: float) -> int | None:
    """POST ``body`` until it is accepted (its id) or ``stop_at``; each refusal noted, as a
    client that retries would see it."""
    r = _until(http, "POST", url, report, stop_at, (202,), what=what, json=body)
    return None if r is None else int(r.json()["id"])


def _until(http: httpx.Client, method: str, url: str, report: SoakReport, stop_at: float, done: tuple[int, ...],
           what: str | None = None, **kwargs: Any) -> httpx.Response | None:
    """``method url`` until an answer of ``done``'s statuses (or ``stop_at``: None), each
    other answer noted as a retry (as ``what``, else the method and path), as a client that
    retries would see it: the API down is a retry too."""
    what = what or f"{method} /{url.split('/', 3)[-1]}"
    while time.monotonic() < stop_at:
        try:
            r = http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            report.refused.append(f"{what}: {type(exc).__name__}")
            time.sleep(1.0)
            continue
        if r.status_code in done:
            return r
        report.refused.append(f"{what}: {r.status_code} {r.text[:300]}")
        time.sleep(1.0)
    return None


def _soak_model(cluster: Cluster, http: httpx.Client, report: SoakReport, stop_at: float) -> bool:
    """The model "soak": two succeeded runs its versions 1 and 2, and a collection of digits
    rows; each step checked against what is there first, so a retried one is not repeated."""
    from corel.data.digits import digits_arrays

    url = f"{cluster.url}/models"
    runs: list[int] = []
    while len(runs) < 2 and time.monotonic() < stop_at:
        try:
            rows = _rows(cluster)
        except psycopg.Error:
            rows = {}
        runs = [i for i in report.accepted if rows.get(i, ("",))[0] == "succeeded"][:2]
        time.sleep(0.5)
    if len(runs) < 2 or _until(http, "POST", url, report, stop_at, (201, 409), json={"name": SOAK_MODEL}) is None:
        return False
    for run in runs:
        got = _until(http, "GET", f"{url}/{SOAK_MODEL}", report, stop_at, (200,))
        if got is None:
            return False
        if run not in [v["experiment_id"] for v in got.json()["versions"]] and _until(
                http, "POST", f"{url}/{SOAK_MODEL}/versions", report, stop_at, (201,),
                json={"experiment_id": run}) is None:
            return False
    images, labels = digits_arrays()
    buf = io.BytesIO()
    np.savez(buf, x=images[:600].astype(np.float32), y=labels[:600])
    up = _until(http, "POST", f"{cluster.url}/datasets", report, stop_at, (201,),
                files={"file": ("collection.npz", buf.getvalue())})
    return up is not None and _until(http, "POST", f"{url}/{SOAK_MODEL}/collections", report, stop_at, (202, 409),
                                     json={"dataset_id": up.json()["id"]}) is not None


def _promotion_card(cluster: Cluster, report: SoakReport, stop_at: float) -> None:
    """Promote production to the model's other version (the first card makes the model)."""
    with httpx.Client(timeout=15) as http:
        if not report.promotion_targets and not _soak_model(cluster, http, report, stop_at):
            report.promotion_wrong.append("the model and its collection were not made in time")
            return
        url = f"{cluster.url}/models/{SOAK_MODEL}"
        got = _until(http, "GET", url, report, stop_at, (200,))
        if got is None:
            report.promotion_wrong.append("the model could not be read")
            return
        now = got.json()["aliases"].get("production")
        target = 2 if now == 1 else 1
        r = _until(http, "POST", f"{url}/aliases/production", report, stop_at, (202, 409, 422),
                   json={"version": target, "expected_version": now, "force": True})
        if r is None:
            report.promotion_wrong.append(f"the promotion to {target} was not accepted")
        elif r.status_code == 202 or target == _alias(http, url):  # a retry of one the first try queued
            report.promotion_targets.append(target)
        else:
            report.promotion_wrong.append(f"the promotion to {target}: {r.status_code} {r.text[:200]}")


def _alias(http: httpx.Client, url: str) -> int | None:
    try:
        return http.get(url).json()["aliases"].get("production")
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def _promotions_ended(cluster: Cluster) -> bool:
    try:
        with psycopg.connect(cluster.pg.url(), connect_timeout=5) as conn:
            return not conn.execute("SELECT 1 FROM promotions WHERE status IN ('queued', 'running') "
                                    "UNION ALL SELECT 1 FROM collection_builds WHERE status IN ('queued', 'running')"
                                    ).fetchall()
    except psycopg.Error:
        return False


def _check_promotions(cluster: Cluster, report: SoakReport) -> None:
    """Every promotion ended, production names the last card's version, its history holds
    one move per promotion that flipped, and a search by alias answers with that version."""
    from corel.data.digits import digits_arrays

    url = f"{cluster.url}/models/{SOAK_MODEL}"
    with httpx.Client(timeout=30) as http:
        promotions = http.get(f"{url}/promotions").json()
        model = http.get(url).json()
        history = http.get(f"{url}/aliases/production/history").json()
        flipped = [p for p in promotions if p["status"] == "succeeded"]
        stuck = [f"{p['promotion_id']} {p['status']}" for p in promotions
                 if p["status"] not in ("succeeded", "conflict")]
        if stuck:
            report.promotion_wrong.append(f"promotions not flipped: {stuck}")
        if len(history) != len(flipped) or [m["promotion_id"] for m in history] != sorted(
                p["promotion_id"] for p in flipped):
            report.promotion_wrong.append(f"history {[(m['from_version'], m['to_version']) for m in history]} "
                                          f"for {len(flipped)} flipped promotions")
        alias = model["aliases"].get("production")
        if alias != report.promotion_targets[-1]:
            report.promotion_wrong.append(f"production names {alias}, the last card asked "
                                          f"{report.promotion_targets[-1]}")
        builds = {b["version"]: b["status"] for b in model["collections"][0]["builds"]} if model["collections"] else {}
        if builds.get(alias) != "succeeded":
            report.promotion_wrong.append(f"the collection's builds: {builds}")
        else:
            rows = digits_arrays()[0][600:603].tolist()
            r = http.post(f"{cluster.url}/models/{SOAK_MODEL}/neighbors", json={
                "alias": "production", "collection": model["collections"][0]["dataset_id"], "arrays": rows, "k": 3})
            if r.status_code != 200 or r.json()["model_version"] != alias:
                report.promotion_wrong.append(f"search by alias: {r.status_code} {r.text[:200]}")
        report.promotion_summary = (f"{len(report.promotion_targets)} cards, {len(promotions)} promotions "
                                    f"({len(flipped)} flipped), production at {alias}, builds {builds}")


def _sweep_rows(cluster: Cluster, sweep_id: int | None) -> dict[int, tuple[str, int | None]]:
    """The sweep's members: id -> (status, the rung it was pruned at)."""
    if sweep_id is None:
        return {}
    with psycopg.connect(cluster.pg.url(), connect_timeout=5) as conn:
        rows = conn.execute("SELECT id, status, pruned FROM experiments WHERE sweep_id = %s", (sweep_id,)).fetchall()
    return {int(i): (s, None if p is None else int(_json(p)["rung"])) for i, s, p in rows}


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _check_sweep(config: SoakConfig, report: SoakReport, metrics: dict[int, list[tuple[int, float, float]]],
                 specs: dict[int, dict[str, Any]], threads: dict[int, int | None]) -> None:
    """The sweep against the library's uninterrupted pruned group of the same specs, on the
    threads its stack recorded."""
    import torch

    from corel.spec import ExperimentSpec
    from corel.train import fit_group

    ids = sorted(specs)
    mine = torch.get_num_threads()
    torch.set_num_threads(threads.get(ids[0]) or config.worker_threads or mine)
    try:
        whole = fit_group([ExperimentSpec(**specs[i]) for i in ids], prune=SWEEP_PRUNE)
    finally:
        torch.set_num_threads(mine)
    for eid, result in zip(ids, whole, strict=True):
        status, rung = report.sweep_members[eid]
        want_rung = None if result.pruned is None else result.pruned["rung"]
        if (status, rung) != ("succeeded" if want_rung is None else "pruned", want_rung):
            report.sweep_unequal.append(f"{eid} {status} at rung {rung}, the library's {want_rung}")
            continue
        got = metrics.get(eid, [])
        if [e for e, _, _ in got] != list(range(1, len(result.history) + 1)):
            report.sweep_unequal.append(f"{eid} epochs {[e for e, _, _ in got]}")
        elif any(abs(v - h.val_accuracy) > 0.005 for (_, _, v), h in zip(got, result.history, strict=True)):
            report.sweep_unequal.append(f"{eid} validation accuracy {[v for _, _, v in got]}")


class Cluster:
    """The service's processes over the soak's own PostgreSQL and Redis."""

    def __init__(self, config: SoakConfig, root: Path) -> None:
        self.config = config
        self.root = root
        self.logdir = config.logdir or root / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.pg = PrivatePostgres()
        self.redis = PrivateRedis(appendonly=config.redis_aof)
        self.s3 = PrivateSeaweed() if config.s3 else None
        s3 = self.s3.settings_kwargs() if self.s3 else {}
        self.settings = Settings(
            database_url=self.pg.url(), broker_url=self.redis.url, var_dir=root / "var",
            queue=f"corel-soak-{uuid.uuid4().hex[:8]}", lease_seconds=config.lease_seconds,
            heartbeat_seconds=config.heartbeat_seconds, log_level="INFO", **s3)
        upgrade(self.settings)
        self.port = free_port()
        self.api: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes] | None] = [None] * config.workers
        # corel's processes: harness's stack on the soak's own servers, its logs in logdir.
        self.stack = Stack.on(self.settings, self.logdir)
        self.lock = threading.Lock()

    def _extra(self) -> dict[str, str]:
        """COREL_* beside the settings: the soak's log level, a worker's torch threads, S3's."""
        extra = {"COREL_LOG_LEVEL": "INFO"}
        if self.config.worker_threads:
            extra["COREL_WORKER_TORCH_THREADS"] = str(self.config.worker_threads)
        if self.s3 is not None:
            extra.update(self.s3.settings())
        return extra

    def start_api(self) -> None:
        self.api = self.stack.start_api(self.port, ready_timeout=None, env=self._extra())

    def start_worker(self, i: int) -> None:
        self.workers[i] = self.stack.start_worker(ready_timeout=None, env=self._extra())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_api(self, timeout: float = 60.0) -> None:
        wait_until(lambda: http_status(f"{self.url}/health", timeout=1) == 200,
                   timeout, "the API to answer /health", ignore=(httpx.HTTPError,))

    @staticmethod
    def kill(proc: subprocess.Popen[bytes] | None) -> None:
        Stack.kill(proc)

    @staticmethod
    def terminate(proc: subprocess.Popen[bytes] | None) -> None:
        Stack.stop(proc, grace=20)

    def close(self) -> None:
        self.terminate(self.api)
        for proc in self.workers:
            self.terminate(proc)
        self.pg.close()
        self.redis.close()
        if self.s3 is not None:
            self.s3.close()


def _fault(cluster: Cluster, kind: str, rng: random.Random) -> None:
    """Inject one fault and, for outages, end it after a random pause."""
    config = cluster.config
    pause = rng.uniform(*config.outage)
    if kind == "worker-kill":
        i = rng.randrange(config.workers)
        cluster.kill(cluster.workers[i])
        time.sleep(min(pause, 3.0))
        cluster.start_worker(i)
    elif kind == "api-kill":
        cluster.kill(cluster.api)
        time.sleep(min(pause, 3.0))
        cluster.start_api()
    elif kind == "postgres-stop":
        cluster.pg.stop()
        time.sleep(pause)
        cluster.pg.start()
    elif kind == "postgres-freeze":
        cluster.pg.freeze()
        time.sleep(pause)
        cluster.pg.thaw()
    elif kind == "redis-restart":
        cluster.redis.stop()
        time.sleep(min(pause, 3.0))
        cluster.redis.start()
    elif kind == "redis-flush":
        cluster.redis.flush()
    elif kind == "s3-stop" and cluster.s3 is not None:
        cluster.s3.stop()
        time.sleep(pause)
        cluster.s3.start()
    else:
        raise ValueError(f"unknown fault {kind!r}")


def _submit(cluster: Cluster, report: SoakReport, stop_at: float, indices: range,
            seconds: float = 0.0) -> None:
    """Submit the runs of ``indices`` evenly over ``seconds``, each retried until accepted."""
    started = time.monotonic()
    with httpx.Client(timeout=15) as http:
        for n, index in enumerate(indices):
            time.sleep(max(0.0, started + n * seconds / len(indices) - time.monotonic()))
            eid = _accepted(http, f"{cluster.url}/experiments", spec_of(cluster.config, index), f"run {index}",
                            report, stop_at)
            if eid is not None:
                report.spec_index[eid] = index
                report.accepted.append(eid)


def _feed(cluster: Cluster, report: SoakReport, until: float) -> None:
    """``feed`` runs more, then wait until the workers are training (as many runs running as
    there are workers, the pruned sweep's group counted as one, or every unfinished run:
    none, where the fed runs have finished already); the database down meanwhile counts as
    not yet. (Without the sweep's group counted, a worker that trained it left the condition
    unmet until the queue had drained to one run: each card waited for the runs before it.)"""
    config = cluster.config
    first = config.runs + config.feed * sum(1 for _, kind in report.faults if kind != PROMOTION)
    _submit(cluster, report, until, range(first, first + config.feed))
    while time.monotonic() < until:
        try:
            rows = _rows(cluster)
            sweep = _sweep_rows(cluster, report.sweep_id)
        except psycopg.Error:
            time.sleep(0.2)
            continue
        states = [rows[i][0] for i in report.accepted if i in rows]
        unfinished = [s for s in states if s not in ("succeeded", "failed", "cancelled")]
        group = any(status == "running" for status, _ in sweep.values())
        if states.count("running") + group >= min(config.workers, len(unfinished) + group):
            return
        time.sleep(0.2)


def _drain(cluster: Cluster, report: SoakReport, elapsed: float) -> float:
    """Seconds the epochs still to train take at the rate epochs were trained so far (0
    where the database cannot say: the deadline alone then)."""
    try:
        rows = _rows(cluster)
    except psycopg.Error:
        return 0.0
    epochs = report.config.epochs
    done = _epochs_done(report, rows)
    left = sum(epochs - rows[i][1] for i in report.accepted
               if i in rows and rows[i][0] not in ("succeeded", "failed", "cancelled"))
    return left / (done / elapsed) if done and elapsed > 0 else 0.0


def _epochs_done(report: SoakReport, rows: dict[int, tuple[str, int, str | None]]) -> int:
    """Epochs the accepted runs have trained (all of a succeeded run's)."""
    epochs = report.config.epochs
    return sum(epochs if rows[i][0] == "succeeded" else rows[i][1] for i in report.accepted if i in rows)


def _rows(cluster: Cluster) -> dict[int, tuple[str, int, str | None]]:
    with psycopg.connect(cluster.pg.url(), connect_timeout=5) as conn:
        return {int(i): (s, int(e), err) for i, s, e, err in conn.execute(
            "SELECT id, status, current_epoch, error FROM experiments").fetchall()}


def _metrics(cluster: Cluster) -> dict[int, list[tuple[int, float, float]]]:
    out: dict[int, list[tuple[int, float, float]]] = {}
    with psycopg.connect(cluster.pg.url(), connect_timeout=5) as conn:
        for eid, epoch, loss, val in conn.execute(
                "SELECT experiment_id, epoch, train_loss, val_accuracy FROM epoch_metrics "
                "ORDER BY experiment_id, epoch").fetchall():
            out.setdefault(int(eid), []).append((int(epoch), float(loss), float(val)))
    return out


def _threads(cluster: Cluster) -> dict[int, int | None]:
    """Each run's recorded torch threads."""
    with psycopg.connect(cluster.pg.url(), connect_timeout=5) as conn:
        return {int(i): None if t is None else int(t)
                for i, t in conn.execute("SELECT id, threads FROM experiments").fetchall()}


def _references(specs: dict[int, dict[str, Any]], threads: dict[int, int | None],
                ) -> dict[tuple[str, int | None], list[tuple[float, float]]]:
    """Each distinct (spec, threads) trained once, uninterrupted, in this process, on the
    threads the runs recorded."""
    import torch

    from corel.spec import ExperimentSpec
    from corel.train import fit

    mine = torch.get_num_threads()
    out: dict[tuple[str, int | None], list[tuple[float, float]]] = {}
    try:
        for eid, spec in specs.items():
            key = (json.dumps(spec, sort_keys=True), threads.get(eid))
            if key not in out:
                torch.set_num_threads(key[1] or mine)
                result = fit(ExperimentSpec(**spec))
                out[key] = [(m.train_loss, m.val_accuracy) for m in result.history]
        return out
    finally:
        torch.set_num_threads(mine)


def run_soak(config: SoakConfig, root: Path) -> SoakReport:
    rng = random.Random(config.seed)
    report = SoakReport(config)
    cluster = Cluster(config, root)
    report.logdir = cluster.logdir
    try:
        cluster.start_api()
        for i in range(config.workers):
            cluster.start_worker(i)
        cluster.wait_api()
        if config.sweep_lams:  # before the faults: its members train through them
            _submit_sweep(cluster, report, time.monotonic() + 60)
        began = time.monotonic()
        submitter = threading.Thread(
            target=_submit, args=(cluster, report, began + config.fault_seconds + config.wait,
                                  range(config.runs), config.submit_seconds),
            daemon=True)
        submitter.start()
        deck: list[str] = list(reversed(config.deck or ()))
        while True:
            time.sleep(rng.uniform(*config.fault_gap))
            if time.monotonic() - began > config.fault_seconds:
                break
            if not deck:
                if config.deck is not None:
                    break
                deck = list(faults_of(config))
                rng.shuffle(deck)
            kind = deck.pop()
            if config.feed and config.deck is not None and kind != PROMOTION:  # a fault strikes training
                _feed(cluster, report, began + config.fault_seconds)
            report.faults.append((round(time.monotonic() - began, 1), kind))
            print(f"  [{time.monotonic() - began:6.1f} s] {kind}", flush=True)
            if kind == PROMOTION:
                _promotion_card(cluster, report, time.monotonic() + 120)
            else:
                _fault(cluster, kind, rng)
        report.last_fault_at = time.monotonic()
        report.drain_seconds = _drain(cluster, report, report.last_fault_at - began)
        submitter.join()
        # Watch until every accepted run has finished, or give up (not before the deadline).
        watch = max(config.wait, config.deadline + report.drain_seconds + 10.0)
        while time.monotonic() - report.last_fault_at < watch:
            rows = _rows(cluster)
            swept = [s for s, _ in _sweep_rows(cluster, report.sweep_id).values()]
            if all(rows.get(i, ("?",))[0] in ("succeeded", "failed", "cancelled") for i in report.accepted) and \
                    len(swept) == len(config.sweep_lams) and all(s in FINISHED for s in swept) and \
                    (not report.promotion_targets or _promotions_ended(cluster)):
                report.all_finished_after = time.monotonic() - report.last_fault_at
                break
            time.sleep(1.0)
        rows = _rows(cluster)
        report.statuses = {i: rows[i][0] if i in rows else "missing" for i in report.accepted}
        report.unfinished = {i: f"{rows[i][0]} at epoch {rows[i][1]}" if i in rows else "missing"
                             for i in report.accepted if report.statuses[i] != "succeeded"}
        for i, (_, _, error) in rows.items():
            if i in report.unfinished and error:
                report.unfinished[i] += f" ({error[:120]})"
        sweep = _sweep_rows(cluster, report.sweep_id)
        report.sweep_members = dict(sweep)
        if report.promotion_targets:
            try:
                _check_promotions(cluster, report)
            except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
                report.promotion_wrong.append(f"the end's check: {type(exc).__name__}: {exc}")
        report.stray_rows = sorted(set(rows) - set(report.accepted) - set(sweep))
        try:
            client = redis.Redis.from_url(cluster.redis.url, socket_connect_timeout=2)
            report.redis_state = {
                "queue_length": client.llen(cluster.settings.queue),
                "unacked": client.hlen("unacked"),
                "binding": bool(client.exists(f"_kombu.binding.{cluster.settings.queue}")),
            }
        except redis.RedisError as exc:
            report.redis_state = {"error": type(exc).__name__}
        metrics = _metrics(cluster)
        threads = _threads(cluster)
        sweep_specs = {}
        if sweep:
            with psycopg.connect(cluster.pg.url(), connect_timeout=5) as conn:
                sweep_specs = {int(i): _json(spec) for i, spec in conn.execute(
                    "SELECT id, spec FROM experiments WHERE sweep_id = %s", (report.sweep_id,)).fetchall()}
    except BaseException:
        cluster.close()
        raise
    # The cluster stops while the references train: they need the cores, its processes little
    # to end once every run has (one after the other, the two took about 7 s and 15 s).
    with ThreadPoolExecutor(1, thread_name_prefix="soak-close") as pool:
        closing = pool.submit(cluster.close)
        try:
            _compare(config, report, metrics, threads, sweep_specs)
        finally:
            closing.result()  # waits for the cluster's end, and raises what its close raised
    return report


def _compare(config: SoakConfig, report: SoakReport, metrics: dict[int, list[tuple[int, float, float]]],
             threads: dict[int, int | None], sweep_specs: dict[int, dict[str, Any]]) -> None:
    """Each accepted run's epochs and figures, and the pruned sweep's members, against the
    uninterrupted library trained in this process."""
    specs = {}
    for eid in report.accepted:
        epochs = [m[0] for m in metrics.get(eid, [])]
        report.duplicated_epochs += len(epochs) - len(set(epochs))
        if report.statuses.get(eid) == "succeeded":
            report.missing_epochs += len(set(range(1, config.epochs + 1)) - set(epochs))
            specs[eid] = spec_of(config, report.spec_index[eid])
    if config.sweep_lams and len(sweep_specs) == len(config.sweep_lams):
        for eid in sweep_specs:
            epochs = [m[0] for m in metrics.get(eid, [])]
            report.duplicated_epochs += len(epochs) - len(set(epochs))
        _check_sweep(config, report, metrics, sweep_specs, threads)
    elif config.sweep_lams:
        report.sweep_unequal.append(f"{len(sweep_specs)} members, not {len(config.sweep_lams)}")
    references = _references(specs, threads)
    for eid, spec in specs.items():
        want = references[(json.dumps(spec, sort_keys=True), threads.get(eid))]
        got = [(loss, val) for _, loss, val in metrics[eid]]
        if got != want:
            report.unequal.append(eid)
