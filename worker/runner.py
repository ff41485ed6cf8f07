"""What a training task does, kept apart from Celery so it reads top to bottom.

A run is *claimed* (app/jobs/lifecycle.py) with one conditional UPDATE (queued, or running with a stale
heartbeat), so duplicate deliveries are harmless: only one worker trains an
experiment at a time. The epochs' metrics and the resumable checkpoint of the last
are written in one transaction, after every epoch or, for epochs shorter than
``COREL_EPOCH_COMMIT_SECONDS``, after those that end within it; a redelivered run
continues from that checkpoint and ends exactly as an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import kombu.exceptions
import numpy as np
import redis.exceptions
import sqlalchemy.exc
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import DATABASE_UNAVAILABLE, session_scope
from app.core.models import (
    Checkpoint,
    EncoderUpload,
    EpochMetric,
    Experiment,
    LatentSpace,
    Status,
    Sweep,
    utcnow,
)
from app.core.settings import Settings, engine_options
from app.jobs import lifecycle
from app.jobs.lifecycle import WORKER_ID, LostLease
from app.services import builtin
from app.storage import Artifact, StoreUnavailable, release_after_commit, store_of
from app.storage import ensure as ensure_store
from app.storage import read as read_artifact
from app.storage.artifacts import put_array
from app.storage.features import StoredFeatures
from app.storage.local_copies import local_files, materialise_upload
from corel.device import device_name
from corel.encoders.record import EncoderRecord
from corel.spec import ExperimentSpec
from corel.train import (
    Callback,
    EngineOptions,
    EpochMetrics,
    FitResult,
    GroupCallback,
    GroupView,
    NotLearningError,
    Prune,
    RunView,
    checkpoint_from_bytes,
    checkpoint_to_bytes,
    fit,
    fit_group,
    group_key,
)
from worker import host_share
from worker.metrics import METRICS

log = logging.getLogger("corel.worker")

T = TypeVar("T")

# Errors of the service around a run, not of the run: a database or broker that
# restarts, fails over, or drops a connection (pgbouncer, idle reapers). The task
# waits and tries again; the run continues from its last checkpoint.
_TRANSIENT = (
    *DATABASE_UNAVAILABLE,
    kombu.exceptions.OperationalError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    ConnectionError,
    TimeoutError,
    StoreUnavailable,  # an S3 endpoint that did not answer within COREL_S3_WAIT_SECONDS
)


def is_transient(exc: BaseException) -> bool:
    """True for a database or broker error that a later attempt may not meet."""
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, _TRANSIENT)


def with_retries(attempt: Callable[[], T], settings: Settings, what: str) -> T:
    """``attempt()``, tried again after transient errors with a doubling pause (at most
    ``settings.retry_max_pause`` seconds) for up to ``settings.transient_retry_seconds``.

    Past that the error propagates: the row stays queued or running, and the reconciler
    sends it again later, so an accepted run is still never lost.
    """
    deadline = time.monotonic() + settings.transient_retry_seconds
    pause = 0.25
    while True:
        try:
            return attempt()
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() + pause > deadline:
                raise
            log.warning("transient error; trying again", extra={
                "task": what, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                "pause": pause})
            time.sleep(pause)
            pause = min(pause * 2, settings.retry_max_pause)


def store_checkpoint(factory: sessionmaker[Session], blob: bytes) -> Artifact:
    """A checkpoint's bytes into the artifact store, before any row names them; an
    unreachable store is waited out there (``COREL_S3_WAIT_SECONDS``)."""
    with factory() as session:
        return store_of(session).put_bytes(blob)


def store_leased(factory: sessionmaker[Session], settings: Settings, ids: list[int],
                 blobs: list[bytes]) -> list[Artifact]:
    """:func:`store_checkpoint` for each of ``blobs`` while a :class:`LeaseKeeper` beats for
    the runs ``ids``: a slow write (a large checkpoint, an S3 outage waited out) does not
    let the lease run out and another worker take the runs over."""
    keeper = LeaseKeeper(ids, factory, settings).start()
    try:
        return [store_checkpoint(factory, blob) for blob in blobs]
    finally:
        keeper.stop()


def _upsert_checkpoint(session: Session, experiment_id: int, kind: str, epoch: int,
                       art: Artifact) -> None:
    """Point the experiment's ``kind`` checkpoint at the stored artifact ``art``; the one
    it pointed at before is freed once this commits, if nothing else references it."""
    row = session.scalar(
        select(Checkpoint).where(Checkpoint.experiment_id == experiment_id, Checkpoint.kind == kind)
    )
    if row is None:
        row = Checkpoint(experiment_id=experiment_id, kind=kind)
        session.add(row)
    elif row.sha256 != art.sha256:
        release_after_commit(session, [row.sha256])
    row.epoch, row.size, row.sha256, row.created_at = epoch, art.size, art.sha256, utcnow()


class CancelledInSetup(Exception):
    """Every run of a setup (a frozen encoder's features being computed) was cancelled:
    raised from the features' progress callback, so that the runs end ``cancelled`` within
    about a second of the request, not after the last row."""


STOPPING = threading.Event()
"""Set when this worker begins a warm shutdown (a SIGTERM: worker/tasks.py): a run hands
itself back at its next epoch's end, queued again from its checkpoint for the next worker,
rather than training on until the shutdown's end (about 30 s) and then waiting out its
lease (37 s more before a restarted worker took it)."""

HANDED_BACK = "handed-back"
"""What a task returns for runs it handed back (worker/tasks.py sends them again)."""


class HandBack(Exception):
    """Raised after an epoch is recorded, while the worker stops: the run goes back."""


def hand_back(factory: sessionmaker[Session], ids: list[int]) -> None:
    """The runs ``ids`` queued again, no worker's, from their last recorded epoch (their
    resume checkpoint): the next worker to get their message claims them at once."""
    with session_scope(factory) as session:
        session.execute(update(Experiment).where(
            Experiment.id.in_(ids), Experiment.worker == WORKER_ID, Experiment.status == Status.RUNNING,
        ).values(status=Status.QUEUED, worker=None, heartbeat_at=None, phase=None, phase_detail=None))
        lifecycle.announce(session, Experiment, ids)
    log.info("handed back: this worker is stopping", extra={"experiments": ids})


CANCEL_CHECK_SECONDS = 1.0
"""How often a setup's progress reads whether its runs were cancelled."""

PHASE_EVERY_SECONDS = 0.5
"""A phase's progress (features computed, bytes downloaded) is written at most this often,
and at its end."""


class LeaseKeeper:
    """Keeps the claimed rows ``ids`` leased from a thread, every heartbeat interval, while
    the work cannot beat itself: from the claim to the first batch (a download or the wait
    for another worker's, the data's load, the model's build, a cold process's first step),
    which on a loaded machine can outlast the lease, so that another worker took the run
    over while this one was about to train it. Stopped at the first batch: from there the
    loop's own beats hold the lease, and stop holding it if the loop hangs."""

    def __init__(self, ids: Iterable[int], factory: sessionmaker[Session], settings: Settings):
        self.ids, self.factory, self.every = list(ids), factory, settings.heartbeat_seconds
        self.phase_shown = False
        self.training = False  # from the first batch on
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="corel-lease", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def options(self, settings: Settings) -> EngineOptions:
        """The engine's options for these runs, with their frozen encoder's features pass
        shown as the runs' phase (``computing features``, how many rows of how many),
        at most twice a second; :meth:`stop` (at the first batch) clears it."""
        last = checked = 0.0

        def on_features(name: str, done: int, total: int) -> None:
            # (name, 0, 0): the encoder loads and its path is chosen, no row computed yet.
            # Heard during the first epoch too (a fine-tune's frozen blocks' outputs), when
            # the loop's own beats see a cancel: not read here then.
            nonlocal last, checked
            if not self.training and time.monotonic() - checked >= CANCEL_CHECK_SECONDS:
                checked = time.monotonic()
                if self.all_cancelled():
                    raise CancelledInSetup(f"runs {self.ids} cancelled while computing features")
            if time.monotonic() - last < PHASE_EVERY_SECONDS and done != total:
                return
            last = time.monotonic()
            self.phase_shown = True
            detail = (f"{name} features of {done:,} of {total:,} rows" if total
                      else f"loading {name} and choosing its features' CPU path")
            with_retries(lambda: show_phase(self.factory, self.ids, "computing features", detail),
                         settings, "features progress")

        def on_read(name: str, size: int) -> None:
            self.phase_shown = True
            what = "the parity gate's verdict" if name.endswith(".json") else "features"
            amount = f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"
            with_retries(lambda: show_phase(self.factory, self.ids, "reading features",
                                            f"{what} ({amount}) from the artifact store"),
                         settings, "features progress")

        # The features are kept in the artifact store too: a run on another host reads them.
        return dataclasses.replace(engine_options(settings), on_features=on_features,
                                   features_store=StoredFeatures(self.factory, on_read))

    def all_cancelled(self) -> bool:
        """Whether a cancel was asked of every one of these runs (False where the database
        cannot say now: the next check asks again)."""
        try:
            with session_scope(self.factory) as session:
                asked = session.scalars(select(Experiment.id).where(
                    Experiment.id.in_(self.ids), Experiment.cancel_requested.is_(True))).all()
        except Exception as exc:
            if not is_transient(exc):
                raise
            return False
        return len(set(asked)) == len(set(self.ids))

    def first_batch(self) -> None:
        """Stop keeping the lease (the loop's beats hold it now), and clear a phase shown
        while the data was prepared."""
        self.training = True
        self.stop()
        if self.phase_shown:
            self.phase_shown = False
            try:
                show_phase(self.factory, self.ids, None)
            except Exception as exc:  # shown until the epoch's own beat; not worth the batch
                log.warning("phase not cleared", extra={"error": type(exc).__name__})

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                with session_scope(self.factory) as session:
                    lifecycle.heartbeat_many(session, self.ids)
            except Exception as exc:  # the next beat, or the lease's expiry, deals with it
                log.warning("heartbeat failed", extra={"error": str(exc)[:200]})


class DatabaseRecorder(Callback):
    """Writes a run's epochs (metrics + resumable checkpoint) in one transaction at most
    every ``settings.epoch_commit_seconds`` (an epoch that ends sooner is held until the
    next commit: its last epoch, a cancel, a hand-back and :meth:`flush` commit at once),
    keeps the heartbeat fresh, and stops the run when a cancel is requested. ``setup``:
    the lease kept until the first batch, stopped there."""

    def __init__(self, experiment_id: int, factory: sessionmaker[Session], settings: Settings,
                 setup: LeaseKeeper | None = None):
        self.experiment_id = experiment_id
        self.factory = factory
        self.settings = settings
        self.heartbeat_every = settings.heartbeat_seconds
        self.commit_every = settings.epoch_commit_seconds
        self.last_beat = self.last_commit = time.monotonic()
        self.cancelled = False
        self.setup = setup
        self.held: list[EpochMetrics] = []  # epochs ended since the last commit
        self.run: RunView | None = None
        self.mid_epoch = False  # a batch has trained since the last epoch's end

    def _beat(self, session: Session, **values: Any) -> None:
        """Heartbeat (with the epoch's figures in ``values``, then published); LostLease
        when the run is no longer ours."""
        lifecycle.progress(session, self.experiment_id, **values)
        self.last_beat = time.monotonic()
        self.cancelled = lifecycle.cancel_requested(session, self.experiment_id)

    def on_batch_end(self, step: int) -> bool:
        self.mid_epoch = True
        if self.setup is not None:
            self.setup.first_batch()
            self.setup = None
        if time.monotonic() - self.last_beat >= self.heartbeat_every:
            try:
                with session_scope(self.factory) as session:
                    self._beat(session)
            except Exception as exc:
                # A missed beat is not worth the epoch: the epoch's own commit decides.
                if not is_transient(exc):
                    raise
                log.warning("heartbeat missed", extra={"experiment": self.experiment_id,
                                                       "error": type(exc).__name__})
                self.last_beat = time.monotonic()
        return self.cancelled

    def on_epoch_end(self, metrics: EpochMetrics, run: RunView) -> bool:
        self.held.append(metrics)
        self.run, self.mid_epoch = run, False
        METRICS.epoch_done(metrics.seconds, len(run.data.y_train))
        log.info("epoch done", extra={"experiment": self.experiment_id, **metrics.to_dict()})
        hand_back = STOPPING.is_set() and not self.cancelled and metrics.epoch < run.spec.epochs
        if (self.cancelled or hand_back or metrics.epoch >= run.spec.epochs
                or time.monotonic() - self.last_commit >= self.commit_every):
            self.flush()
        if hand_back:
            raise HandBack
        return self.cancelled

    def flush(self) -> None:
        """Commit the epochs held since the last commit, in one transaction: their rows, the
        run's figures and, where the run stands at the last one's end, its resume
        checkpoint (a run stopped between batches keeps the checkpoint it had: it is not
        resumed from a part of an epoch)."""
        if not self.held or self.run is None:
            return
        run, last = self.run, self.held[-1]
        art = None if self.mid_epoch else store_leased(
            self.factory, self.settings, [self.experiment_id], [checkpoint_to_bytes(run.checkpoint())])[0]
        with session_scope(self.factory) as session:
            self._beat(
                session,
                current_epoch=last.epoch,
                device=device_name(run.device),
                precision=run.precision,
                features=features_record(run.data.preprocessing, run.data.features_source),
                best_epoch=run.best_epoch,
                best_val_accuracy=run.best_val_accuracy,
                test_accuracy=run.test_accuracy,
                train_seconds=Experiment.train_seconds + sum(m.seconds for m in self.held),
                # A phase the epoch showed (a fine-tune's frozen blocks' outputs) ends with it.
                phase=None, phase_detail=None,
            )
            session.add_all([EpochMetric(experiment_id=self.experiment_id, **m.to_dict()) for m in self.held])
            if art is not None:
                _upsert_checkpoint(session, self.experiment_id, "resume", last.epoch, art)
        self.held = []
        self.last_commit = time.monotonic()


def features_record(preprocessing: dict[str, Any] | None, source: str | None = None) -> dict[str, Any] | None:
    """What a run records of its frozen encoder's features: their path, and where this
    attempt's came from (``source``: computed, from the store, cached; None: none such)."""
    record = EncoderRecord.of(preprocessing)
    if record is None or record.features_path is None:
        return None
    found = dict(record.features_path)
    return {**found, "source": source} if source is not None else found


def _finish(factory: sessionmaker[Session], experiment_id: int, status: Status, **values: Any) -> None:
    if lifecycle.finish(factory, experiment_id, status, **values):
        METRICS.experiment_finished(status)


def _latent(factory: sessionmaker[Session], result: FitResult, y: Any, experiment_id: int,
            split: str) -> LatentSpace:
    """A split's latent space: its two arrays into the artifact store, the row naming them."""
    reps = result.latent(split).cpu().numpy().astype(np.float32)
    rows = (result.run.data.rows or {}).get("val" if split == "validation" else split)
    with factory() as session:
        stored = put_array(session, reps)
        labels = put_array(session, y.cpu().numpy().astype(np.int64))
        positions = None if rows is None else put_array(session, np.asarray(rows, np.int64))
    return LatentSpace(
        experiment_id=experiment_id, split=split, n=int(reps.shape[0]), dim=int(reps.shape[1]),
        representations_sha256=stored.sha256, labels_sha256=labels.sha256,
        rows_sha256=None if positions is None else positions.sha256)


@dataclass
class Claimed:
    experiment_id: int
    spec: ExperimentSpec
    checkpoint: dict[str, Any] | None
    threads: int  # the run's own torch threads (experiments.threads)


def _claim_and_prepare(
    session: Session, experiment_id: int, settings: Settings
) -> Claimed | str:
    """Claim the experiment and read what training needs; a status string if not to train."""
    exp = session.get(Experiment, experiment_id)
    if exp is None:
        log.warning("experiment does not exist", extra={"experiment": experiment_id})
        return "missing"
    if not lifecycle.claim(session, experiment_id, settings):
        log.info("not claimed (finished, or running elsewhere)",
                 extra={"experiment": experiment_id, "status": exp.status})
        return "skipped"
    session.refresh(exp)
    if exp.threads is None:  # its first start: the share now, kept for good
        exp.threads = host_share.threads_now()
    if exp.cancel_requested:
        lifecycle.end(session, experiment_id, Status.CANCELLED)
        METRICS.experiment_finished(Status.CANCELLED)
        return Status.CANCELLED
    spec_data = dict(exp.spec)
    if exp.dataset_id is not None:
        spec_data["dataset_path"] = str(materialise_upload(session, exp.dataset_id, settings))
    encoder_id = spec_data.pop("encoder_id", None)
    if encoder_id is not None:  # the user's own encoder: its files from the database, once
        row = session.get(EncoderUpload, encoder_id)
        if row is None:
            raise ValueError(f"encoder {encoder_id} no longer exists")
        spec_data["encoder_path"] = str(local_files(session, settings, row))
    resume = session.scalar(
        select(Checkpoint.sha256).where(
            Checkpoint.experiment_id == experiment_id, Checkpoint.kind == "resume"
        )
    )
    return Claimed(experiment_id, ExperimentSpec.model_validate(spec_data),
                   checkpoint_from_bytes(read_artifact(session, resume)) if resume else None,
                   int(exp.threads))


def _fail(factory: sessionmaker[Session], experiment_id: int, exc: Exception) -> str:
    if isinstance(exc, ValueError | FileNotFoundError):
        # The user's spec or data is at fault: say what is wrong, no traceback.
        _finish(factory, experiment_id, status=Status.FAILED, error=f"{type(exc).__name__}: {exc}")
    else:
        log.error("training failed", exc_info=exc, extra={"experiment": experiment_id})
        _finish(factory, experiment_id, status=Status.FAILED,
                error=f"internal error: {type(exc).__name__}: {exc}")
    return Status.FAILED


def show_phase(factory: sessionmaker[Session], ids: list[int], phase: str | None,
               detail: str | None = None) -> None:
    """The runs' ``phase`` (and how far it is), with a heartbeat, published."""
    with session_scope(factory) as session:
        lifecycle.heartbeat_many(session, ids, phase=phase, phase_detail=detail)
        lifecycle.announce(session, Experiment, ids)


def _cancel_asked(factory: sessionmaker[Session], experiment_id: int) -> bool:
    with session_scope(factory) as session:
        return lifecycle.cancel_requested(session, experiment_id)


def _store_results(factory: sessionmaker[Session], experiment_id: int, result: FitResult,
                   settings: Settings, status: Status = Status.SUCCEEDED) -> str:
    """Best checkpoint (into the artifact store first), test, validation and training
    latent spaces, and ``status`` (`succeeded`; `cancelled` for a run cancelled after an
    epoch, which serves /neighbors as a succeeded one does), in one transaction. The run shows ``storing results`` meanwhile, and
    its lease is kept (a slow store, a large model's latent spaces): no other worker takes
    it over while it finishes."""
    keeper = LeaseKeeper([experiment_id], factory, settings).start()
    try:
        show_phase(factory, [experiment_id], "storing results", "the best checkpoint")
        return _store_results_leased(factory, experiment_id, result, status)
    finally:
        keeper.stop()


def _store_results_leased(factory: sessionmaker[Session], experiment_id: int,
                          result: FitResult, status: Status = Status.SUCCEEDED) -> str:
    # Everything computed and stored before the transaction, which then only writes rows:
    # on SQLite a transaction that writes holds the file's one write lock, and one held
    # through the latent spaces' computation (minutes over a large encoder) stopped every
    # other writer (heartbeats, the API's submissions, the reconciler) meanwhile.
    best = store_checkpoint(factory, checkpoint_to_bytes(result.run.best_checkpoint()))
    data = result.run.data
    # The training split too: the reference rows of retrieval and nearest-neighbour search.
    latents = []
    for split, y in (("test", data.y_test), ("validation", data.y_val), ("train", data.y_train)):
        if status != Status.CANCELLED and _cancel_asked(factory, experiment_id):
            # Cancelled while its latent spaces were computed (a fine-tune's take a minute):
            # it ends now, serving its best checkpoint, without them.
            with session_scope(factory) as session:
                _upsert_checkpoint(session, experiment_id, "best", result.best_epoch, best)
                ended = lifecycle.end(session, experiment_id, Status.CANCELLED, phase=None, phase_detail=None,
                                      best_epoch=result.best_epoch, best_val_accuracy=result.best_val_accuracy,
                                      test_accuracy=result.test_accuracy)
            if ended:
                METRICS.experiment_finished(Status.CANCELLED)
            return Status.CANCELLED
        show_phase(factory, [experiment_id], "storing results", f"the {split} split's latent space")
        latents.append(_latent(factory, result, y, experiment_id, split))
    with session_scope(factory) as session:
        _upsert_checkpoint(session, experiment_id, "best", result.best_epoch, best)
        replaced = session.scalars(select(LatentSpace).where(LatentSpace.experiment_id == experiment_id)).all()
        release_after_commit(session, [d for row in replaced
                                       for d in (row.representations_sha256, row.labels_sha256,
                                                 row.rows_sha256) if d])
        session.execute(delete(LatentSpace).where(LatentSpace.experiment_id == experiment_id))
        session.add_all(latents)
        # Its resume checkpoint: no one resumes a finished run, and it is the largest thing
        # it stored (the latest weights, the best ones again and Adam's moments: 211 MB for
        # MiniLM fine-tuned on 2 blocks, beside the 91 MB best checkpoint of then).
        resume = session.scalar(select(Checkpoint).where(Checkpoint.experiment_id == experiment_id,
                                                         Checkpoint.kind == "resume"))
        if resume is not None:
            release_after_commit(session, [resume.sha256])
            session.delete(resume)
        if not lifecycle.end(session, experiment_id, status, phase=None, phase_detail=None,
                             best_epoch=result.best_epoch,
                             best_val_accuracy=result.best_val_accuracy,
                             test_accuracy=result.test_accuracy):
            raise LostLease(f"experiment {experiment_id} was taken over before it could finish")
    METRICS.experiment_finished(status)
    log.info(str(status), extra={"experiment": experiment_id, "test_accuracy": result.test_accuracy})
    return status


def prepare_data(ids: list[int], dataset: str, factory: sessionmaker[Session],
                 settings: Settings) -> None:
    """Download the built-in dataset these claimed runs need, if it is not here: the runs
    show ``preparing data`` and how far the download is. Their lease is the caller's
    :class:`LeaseKeeper`'s, which beats from the claim to the first batch, through the
    download (or the wait for another worker's download of it)."""
    if not builtin.needs_download(settings, dataset):
        return

    def show(phase: str | None, detail: str | None) -> None:
        show_phase(factory, ids, phase, detail)

    last = 0.0

    def progress(what: str, done: int, total: int | None) -> None:
        nonlocal last
        if time.monotonic() - last < PHASE_EVERY_SECONDS and done != total:
            return
        last = time.monotonic()
        size = f"{done / 1e6:.1f} of {total / 1e6:.1f} MB" if total else f"{done / 1e6:.1f} MB"
        with_retries(lambda: show("preparing data", f"downloading {what}: {size}"[:300]),
                     settings, "download progress")

    log.info("downloading a dataset", extra={"dataset": dataset, "experiments": ids})
    show("preparing data", f"downloading {dataset}")
    try:
        builtin.prepare(settings, dataset, progress)
    finally:
        show(None, None)


def _train_claimed(job: Claimed, factory: sessionmaker[Session], settings: Settings) -> str:
    experiment_id = job.experiment_id
    host_share.pin(job.threads)  # its own threads, whatever the host's share is now
    setup = LeaseKeeper([experiment_id], factory, settings).start()
    recorder = DatabaseRecorder(experiment_id, factory, settings, setup)
    try:
        prepare_data([experiment_id], job.spec.dataset, factory, settings)
        log.info("training", extra={"experiment": experiment_id, "worker": WORKER_ID,
                                    "resume_epoch": job.checkpoint["epoch"] if job.checkpoint else 0})
        result = fit(job.spec, [recorder], checkpoint=job.checkpoint, device=settings.device,
                     data_dir=builtin.data_dir_for(settings, job.spec.dataset),
                     chance_epochs=settings.chance_epochs, options=setup.options(settings))
        recorder.flush()  # epochs held when a cancel stopped it between batches
        if result.stopped:
            if result.best_epoch >= 1:  # what it learned serves as a succeeded run's does
                return _store_results(factory, experiment_id, result, settings, Status.CANCELLED)
            _finish(factory, experiment_id, status=Status.CANCELLED)
            return Status.CANCELLED
        return _store_results(factory, experiment_id, result, settings)
    except HandBack:
        hand_back(factory, [experiment_id])
        return HANDED_BACK
    except CancelledInSetup:
        log.info("cancelled while computing features", extra={"experiment": experiment_id})
        _finish(factory, experiment_id, status=Status.CANCELLED, phase=None, phase_detail=None)
        return Status.CANCELLED
    except LostLease:
        log.warning("lost the lease; another worker continues", extra={"experiment": experiment_id})
        return "lost"
    except Exception as exc:
        if is_transient(exc):
            raise  # with_retries resumes it from its last checkpoint
        _flush_failed(recorder)
        return _fail(factory, experiment_id, exc)
    finally:
        setup.stop()


def _flush_failed(recorder: DatabaseRecorder | GroupRecorder) -> None:
    """A failed run's held epochs (the one the guard failed it at among them), recorded
    as every epoch was before it failed; a flush that fails too leaves them out."""
    try:
        recorder.flush()
    except Exception as exc:
        log.warning("a failed run's last epochs not recorded",
                    extra={"experiments": getattr(recorder, "ids", [getattr(recorder, "experiment_id", None)]),
                           "error": str(exc)[:200]})


def train_experiment(experiment_id: int, factory: sessionmaker[Session], settings: Settings) -> str:
    """Train (or resume) one experiment; returns the status it ended in. A member of a
    pruned sweep sent on its own (the reconciler's resend after a lost worker) resumes with
    the members of its group still to finish, as a group: pruning goes on at its rungs."""
    factory = ensure_store(factory, settings)
    together = _pruned_group_of(factory, experiment_id)
    if len(together) > 1:
        return str(train_group(together, factory, settings).get(experiment_id, "skipped"))
    try:
        with session_scope(factory) as session:
            job = _claim_and_prepare(session, experiment_id, settings)
    except ValueError as exc:  # a stored spec that no longer validates
        return _fail(factory, experiment_id, exc)
    if isinstance(job, str):
        return job
    return _train_claimed(job, factory, settings)


class GroupRecorder(GroupCallback):
    """Like DatabaseRecorder, for a stacked group: one transaction holds every member's
    epochs (metrics and resumable checkpoint) since the last, at most every
    ``settings.epoch_commit_seconds`` (the last epoch, a rung of a pruned sweep, a member's
    cancel or failure and a hand-back commit at once). A cancelled member is marked
    cancelled at the next commit (its computation rides along until then; its epochs are
    recorded, and its best checkpoint kept), a member the sweep's pruning drops ends pruned
    (:meth:`on_prune`), a member that ``fit_group``'s guard found not learning
    (``group.failed``) failed, with its verdict; the group stops when no member is left."""

    def __init__(self, ids: list[int], factory: sessionmaker[Session], settings: Settings,
                 setup: LeaseKeeper | None = None):
        self.ids = ids
        self.active = set(ids)
        self.factory = factory
        self.settings = settings
        self.heartbeat_every = settings.heartbeat_seconds
        self.commit_every = settings.epoch_commit_seconds
        self.last_beat = self.last_commit = time.monotonic()
        self.setup = setup
        self.pruned: set[int] = set()
        self.rungs: set[int] = set()  # epochs a pruned sweep judges its members at
        self.held: list[dict[int, EpochMetrics]] = []  # each epoch since the last commit, by member
        self.group: GroupView | None = None
        self.mid_epoch = False
        self.cancel_seen = False  # a heartbeat found a member cancelled

    def _cancelled(self, session: Session) -> set[int]:
        return set(session.scalars(select(Experiment.id).where(
            Experiment.id.in_(self.active), Experiment.cancel_requested.is_(True))))

    def on_batch_end(self, step: int) -> bool:
        self.mid_epoch = True
        if self.setup is not None:
            self.setup.first_batch()
            self.setup = None
        if time.monotonic() - self.last_beat < self.heartbeat_every:
            return False
        with session_scope(self.factory) as session:
            lifecycle.heartbeat_many(session, self.active)
            cancelled = self._cancelled(session)
        self.last_beat = time.monotonic()
        self.cancel_seen = bool(cancelled)
        return bool(self.active) and cancelled == self.active

    def on_epoch_end(self, metrics: list[EpochMetrics], group: GroupView) -> bool:
        self.group, self.mid_epoch = group, False
        self.held.append({eid: metrics[i] for i, eid in enumerate(self.ids) if eid in self.active})
        METRICS.epoch_done(metrics[0].seconds, len(group.data.y_train), members=len(self.held[-1]))
        epoch = metrics[0].epoch
        last = epoch >= group.specs[0].epochs
        hand_back = STOPPING.is_set() and bool(self.active) and not last
        verdict = any(self.ids[i] in self.active for i in group.failed)
        if (last or hand_back or verdict or self.cancel_seen or epoch in self.rungs
                or time.monotonic() - self.last_commit >= self.commit_every):
            self.flush()
        if hand_back:
            raise HandBack
        return not self.active

    def flush(self, end: bool = True) -> None:
        """Commit the epochs held since the last commit: each member's rows, figures and (where
        the group stands at an epoch's end) resume checkpoint, in one transaction; a member
        the guard failed ends failed, and with ``end`` one cancelled meanwhile ends cancelled
        (``end=False``: the group has stopped, and train_group ends them)."""
        group = self.group
        if not self.held or group is None:
            return
        ended: list[str] = []
        # Every active member's checkpoint into the store first, outside the transaction
        # (one cancelled meanwhile leaves an orphan, which gc removes).
        members = [(i, eid) for i, eid in enumerate(self.ids) if eid in self.active]
        arts = [] if self.mid_epoch else store_leased(
            self.factory, self.settings, [eid for _, eid in members],
            [checkpoint_to_bytes(group.member_run(i).checkpoint()) for i, _ in members])
        stored = {eid: art for (_, eid), art in zip(members, arts, strict=False)}
        # A member cancelled meanwhile leaves now, its epochs recorded: its best checkpoint
        # so far too, so that it serves what it learned (as a solo run cancelled between
        # batches does).
        cancelled: set[int] = set()
        if end:
            with session_scope(self.factory) as session:
                cancelled = self._cancelled(session)  # one cancelled after this read leaves next commit
        keep = [(i, eid) for i, eid in members if eid in cancelled and group.member_run(i).best_epoch >= 1]
        best_arts = store_leased(self.factory, self.settings, [eid for _, eid in keep],
                                 [checkpoint_to_bytes(group.member_run(i).best_checkpoint())
                                  for i, _ in keep]) if keep else []
        best = {eid: (group.member_run(i).best_epoch, art) for (i, eid), art in zip(keep, best_arts, strict=True)}
        with session_scope(self.factory) as session:
            lifecycle.announce(session, Experiment, self.active)  # every member this commit may touch
            for i, experiment_id in members:
                epochs = [h[experiment_id] for h in self.held if experiment_id in h]
                if not epochs:
                    continue
                m, run = epochs[-1], group.member_run(i)
                mine = lifecycle.heartbeat(
                    session, experiment_id, current_epoch=m.epoch, device=device_name(group.device),
                    precision=group.precision, features=features_record(group.data.preprocessing,
                                                                            group.data.features_source),
                    best_epoch=run.best_epoch,
                    best_val_accuracy=run.best_val_accuracy, test_accuracy=run.test_accuracy,
                    train_seconds=Experiment.train_seconds + sum(e.seconds for e in epochs))
                if not mine:
                    self.active.discard(experiment_id)  # taken over elsewhere
                    continue
                session.add_all([EpochMetric(experiment_id=experiment_id, **e.to_dict()) for e in epochs])
                if experiment_id in stored:
                    _upsert_checkpoint(session, experiment_id, "resume", m.epoch, stored[experiment_id])
                if experiment_id in cancelled:  # its epochs recorded, with its best so far
                    if experiment_id in best:
                        _upsert_checkpoint(session, experiment_id, "best", *best[experiment_id])
                    lifecycle.end(session, experiment_id, Status.CANCELLED)
                    ended.append(Status.CANCELLED)
                    self.active.discard(experiment_id)
                    continue
                verdict = group.failed.get(i)
                if verdict is not None:  # this member has failed; the others go on
                    lifecycle.end(session, experiment_id, Status.FAILED,
                                  error=f"{NotLearningError.__name__}: {verdict}")
                    ended.append(Status.FAILED)
                    self.active.discard(experiment_id)
        for status in ended:
            METRICS.experiment_finished(status)
        self.held = []
        self.cancel_seen = False
        self.last_beat = self.last_commit = time.monotonic()

    def on_prune(self, group: GroupView, kept: list[int], why: dict[int, str], rung: int) -> None:
        """Members the sweep's successive halving drops at this rung: their best checkpoints
        into the store, then (one transaction, before the stack is rebuilt) each ends
        ``pruned`` with its rung and reason; a resumed group finds the same survivors."""
        going = [(j, self.ids[j]) for j in sorted(why) if self.ids[j] in self.active]
        keep = [(j, eid) for j, eid in going if group.member_run(j).best_epoch >= 1]
        arts = store_leased(self.factory, self.settings, [eid for _, eid in keep],
                            [checkpoint_to_bytes(group.member_run(j).best_checkpoint()) for j, _ in keep])
        best = {eid: (group.member_run(j).best_epoch, art) for (j, eid), art in zip(keep, arts, strict=True)}
        with session_scope(self.factory) as session:
            for j, experiment_id in going:
                if experiment_id in best:
                    _upsert_checkpoint(session, experiment_id, "best", *best[experiment_id])
                lifecycle.end(session, experiment_id, Status.PRUNED,
                              pruned={"rung": rung, "reason": why[j]})
        for _, experiment_id in going:
            self.active.discard(experiment_id)
            self.pruned.add(experiment_id)
            METRICS.experiment_finished(Status.PRUNED)
        self.ids = [self.ids[i] for i in kept]
        log.info("pruned", extra={"experiments": [eid for _, eid in going], "rung": rung})


def _pruned_group_of(factory: sessionmaker[Session], experiment_id: int) -> list[int]:
    """The members of the experiment's pruned sweep that would stack with it and have not
    finished (itself included, in id order); empty for a run of no pruned sweep."""
    with session_scope(factory) as session:
        exp = session.get(Experiment, experiment_id)
        if exp is None or exp.sweep_id is None:
            return []
        sweep = session.get(Sweep, exp.sweep_id)
        if sweep is None or sweep.prune is None or not sweep.vectorize:
            return []
        try:
            key = _stored_group_key(exp.spec, exp.dataset_id)
            rows = session.execute(select(Experiment.id, Experiment.spec, Experiment.dataset_id).where(
                Experiment.sweep_id == exp.sweep_id,
                Experiment.status.in_((Status.QUEUED, Status.RUNNING))).order_by(Experiment.id)).all()
            return [i for i, spec, upload in rows if _stored_group_key(spec, upload) == key]
        except ValueError:  # a stored spec that no longer validates: trained (and failed) alone
            return []


def _stored_group_key(spec: dict[str, Any], dataset_id: int | None) -> Any:
    """:func:`corel.train.group_key` of a stored spec, its upload and encoder named by id
    (what a worker fills in from them is the same for every member)."""
    data = dict(spec)
    if dataset_id is not None:
        data["dataset_path"] = f"dataset-{dataset_id}"
    encoder_id = data.pop("encoder_id", None)
    if encoder_id is not None:
        data["encoder_path"] = f"encoder-{encoder_id}"
    return group_key(ExperimentSpec.model_validate(data))


def _sweep_prune(factory: sessionmaker[Session], experiment_id: int) -> dict[str, Any] | None:
    """The successive halving of the experiment's sweep, if it prunes."""
    with session_scope(factory) as session:
        return session.scalar(select(Sweep.prune).join(Experiment, Experiment.sweep_id == Sweep.id)
                              .where(Experiment.id == experiment_id))


def _rungs(prune: dict[str, Any] | None, epochs: int) -> set[int]:
    """The epochs a pruned sweep's group is judged at (every epoch if its settings do not
    parse here: fit_group then says why)."""
    if not prune:
        return set()
    try:
        return set(Prune.of(prune, epochs, 2).rungs(epochs))
    except ValueError:
        return set(range(1, epochs + 1))


def _rung_judged(factory: sessionmaker[Session], experiment_id: int, epoch: int) -> bool:
    """Whether the experiment's sweep recorded a member pruned at ``epoch``: a group that
    resumes there resumes the survivors of a rung already judged, and does not judge it
    again (otherwise the worker was lost between the epoch and its rung, and the resumed
    group judges it first)."""
    with session_scope(factory) as session:
        sweep_id = session.scalar(select(Experiment.sweep_id).where(Experiment.id == experiment_id))
        pruned = session.scalars(select(Experiment.pruned).where(
            Experiment.sweep_id == sweep_id, Experiment.status == Status.PRUNED))
        return any(int(why["rung"]) == epoch for why in pruned if why)


def train_group(ids: list[int], factory: sessionmaker[Session], settings: Settings) -> dict[int, str]:
    """Train a group of experiments that share dataset, model, batch size and data order
    as one stacked model (corel.train.stacked). Members that cannot go together (one is
    already further along than the others) are trained one after another instead."""
    factory = ensure_store(factory, settings)
    outcome: dict[int, str] = {}
    jobs: list[Claimed] = []
    for experiment_id in ids:
        try:
            with session_scope(factory) as session:
                job = _claim_and_prepare(session, experiment_id, settings)
        except ValueError as exc:
            outcome[experiment_id] = _fail(factory, experiment_id, exc)
            continue
        if isinstance(job, str):
            outcome[experiment_id] = job
        else:
            jobs.append(job)
    epochs = {job.checkpoint["epoch"] if job.checkpoint else 0 for job in jobs}
    keys = {group_key(job.spec) for job in jobs}
    if len(jobs) < 2 or len(epochs) != 1 or len(keys) != 1 or None in keys:
        for job in jobs:
            outcome[job.experiment_id] = _train_claimed(job, factory, settings)
        return outcome
    members = [job.experiment_id for job in jobs]
    # One stack, one thread count: the first member's (claimed together, they took the
    # same share; a group that resumes had it recorded for each).
    threads = jobs[0].threads
    if any(job.threads != threads for job in jobs):
        with session_scope(factory) as session:
            session.execute(update(Experiment).where(Experiment.id.in_(members)).values(threads=threads))
    host_share.pin(threads)
    setup = LeaseKeeper(members, factory, settings).start()
    recorder = GroupRecorder(members, factory, settings, setup)
    log.info("training a stacked group", extra={"experiments": members, "worker": WORKER_ID})
    try:
        prepare_data(members, jobs[0].spec.dataset, factory, settings)
        checkpoints = None if epochs == {0} else [job.checkpoint for job in jobs if job.checkpoint]
        prune = _sweep_prune(factory, members[0])
        recorder.rungs = _rungs(prune, jobs[0].spec.epochs)
        judged = bool(prune and checkpoints and _rung_judged(factory, members[0], next(iter(epochs))))
        results = fit_group([job.spec for job in jobs], [recorder], checkpoints=checkpoints,
                            device=settings.device, chance_epochs=settings.chance_epochs,
                            data_dir=builtin.data_dir_for(settings, jobs[0].spec.dataset),
                            options=setup.options(settings), prune=prune, rung_judged=judged)
        recorder.flush(end=False)  # epochs held when every member's cancel stopped it between batches
    except HandBack:
        going = sorted(recorder.active)
        hand_back(factory, going)
        outcome.update({experiment_id: HANDED_BACK for experiment_id in going})
        return outcome
    except CancelledInSetup:
        log.info("cancelled while computing features", extra={"experiments": members})
        for experiment_id in members:
            _finish(factory, experiment_id, status=Status.CANCELLED, phase=None, phase_detail=None)
            outcome[experiment_id] = Status.CANCELLED
        return outcome
    except Exception as exc:
        if is_transient(exc):
            raise
        _flush_failed(recorder)
        for experiment_id in recorder.active:
            outcome[experiment_id] = _fail(factory, experiment_id, exc)
        return outcome
    finally:
        setup.stop()
    for experiment_id, result in zip(members, results, strict=True):
        if experiment_id in recorder.pruned:
            outcome[experiment_id] = Status.PRUNED
            continue
        if experiment_id not in recorder.active:
            outcome[experiment_id] = "cancelled-or-lost"
            continue
        # Every member left cancelled between batches: each that ended an epoch serves what
        # it learned, /neighbors too, as a solo run cancelled so does.
        if result.stopped and result.best_epoch < 1:
            _finish(factory, experiment_id, status=Status.CANCELLED)
            outcome[experiment_id] = Status.CANCELLED
            continue
        try:
            outcome[experiment_id] = _store_results(
                factory, experiment_id, result, settings,
                Status.CANCELLED if result.stopped else Status.SUCCEEDED)
        except LostLease:
            outcome[experiment_id] = "lost"
    return outcome
