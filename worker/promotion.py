"""Promotions on a worker: the gate, then the flip (issue 72).

Claimed with a lease as every job is (lifecycle.claim), so a promotion whose worker is lost
is taken over and run again from its start: the gate reads only stored rows and writes
nothing until the end, and the flip is one transaction. Phases: ``gating`` (both versions'
runs evaluated on the same rows, the model's evaluation upload if it has one (each run
embeds it: a batch embedding job, kept, so a promotion taken over goes on from it), else
their shared stored test rows: each row's prediction from the run's own head
over its stored representation, and its average precision at R against the run's own
training split; corel.gate compares them), then the flip: the alias is compared and
swapped in one transaction with its history row, only if it still names the version the
promotion expected (else the outcome is ``conflict``).

Between the gate and the flip, the ``embedding`` phase: every collection of the model
embedded and indexed by the candidate's run (:func:`embed_collections`: a collection build
per version, a batch embedding job and an index of its rows, each run here as its own worker
would run it, so that a promotion taken over after a lost worker goes on from the jobs it
made). A version's builds are kept, so a rollback embeds nothing.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import session_scope
from app.core.errors import DomainError
from app.core.models import (
    AliasMove,
    CollectionBuild,
    DatasetUpload,
    EmbeddingJob,
    EmbeddingResult,
    LatentSpace,
    ModelAlias,
    ModelCollection,
    ModelVersion,
    NeighborIndex,
    Promotion,
    RegisteredModel,
    Status,
    utcnow,
)
from app.core.schemas.indexes import IndexCreate
from app.core.settings import Settings
from app.jobs import events, lifecycle
from app.jobs.lifecycle import LostLease
from app.storage import ensure as ensure_store
from app.storage import release_after_commit
from app.storage.artifacts import best_checkpoint_dict, load_latent, read_array
from app.storage.local_copies import files_for_model, materialise_upload
from corel.clustering import default_metric
from corel.gate import Evaluated, compare
from corel.retrieval import per_query
from corel.serving import ServedModel
from worker.leases import lease_kept

log = logging.getLogger("corel.worker")


class NoSharedRows(ValueError):
    """The two versions' runs were not tested on the same rows."""


def _served(session: Session, settings: Settings, experiment_id: int) -> ServedModel:
    """The run's best checkpoint as the API serves it, on the CPU."""
    checkpoint = best_checkpoint_dict(session, experiment_id)
    return ServedModel.from_checkpoint(checkpoint, "cpu", files_for_model(
        session, settings, json.loads(checkpoint["preprocessing"])))


def _scored(session: Session, served: ServedModel, experiment_id: int, h: np.ndarray, y: np.ndarray) -> Evaluated:
    """Rows of representations ``h`` and labels ``y`` scored for the gate: each right or not
    (the run's head over ``h``), and its AP@R against the run's stored training split."""
    h_train, y_train = load_latent(session, experiment_id, "train")
    sims = served.similarities(torch.from_numpy(np.ascontiguousarray(h)))
    correct = (sims.argmax(1).numpy() == y).astype(np.float64)
    ap = per_query(h, y, h_train, y_train, default_metric(served.spec.loss))["average_precision_at_r"]
    return Evaluated(correct, ap, np.asarray(y))


def _evaluated(session: Session, settings: Settings, experiment_id: int) -> tuple[Evaluated, str | None, list[str]]:
    """A run on its stored test split (:func:`_scored`); the rows' digest, the class names."""
    h_test, y_test = load_latent(session, experiment_id, "test")
    served = _served(session, settings, experiment_id)
    rows = session.scalar(select(LatentSpace.rows_sha256).where(
        LatentSpace.experiment_id == experiment_id, LatentSpace.split == "test"))
    return _scored(session, served, experiment_id, h_test, y_test), rows, list(served.class_names)


def gate(session: Session, settings: Settings, candidate: int, incumbent: int, margin: float) -> dict[str, Any]:
    """corel.gate's report of run ``candidate`` against run ``incumbent`` on their shared
    test rows; NoSharedRows when they have none."""
    cand, cand_rows, names = _evaluated(session, settings, candidate)
    inc, inc_rows, _ = _evaluated(session, settings, incumbent)
    if (len(cand.labels) != len(inc.labels) or not np.array_equal(cand.labels, inc.labels)
            or (cand_rows is not None and inc_rows is not None and cand_rows != inc_rows)):
        raise NoSharedRows(f"experiments {candidate} and {incumbent} were not tested on the same rows "
                           f"({len(cand.labels)} and {len(inc.labels)} test rows), so the gate cannot "
                           "compare them")
    report = compare(cand, inc, names, margin=margin)
    report["candidate_experiment"], report["incumbent_experiment"] = candidate, incumbent
    report["evaluated_on"] = {"dataset_id": None, "split": "test"}
    return report


def _embedded(factory: sessionmaker[Session], settings: Settings, experiment_id: int,
              dataset_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The upload's rows embedded by the run (a batch embedding job: the run's own from
    before, or one made and run here) and the upload's labels as stored, in file order."""
    from app.services.embedding_jobs import create_job
    from worker.embedding import embed_dataset

    with session_scope(factory) as session:
        job_id = session.scalar(select(EmbeddingJob.id).where(
            EmbeddingJob.experiment_id == experiment_id, EmbeddingJob.dataset_id == dataset_id,
            EmbeddingJob.status.not_in((Status.FAILED, Status.CANCELLED))).order_by(EmbeddingJob.id))
        if job_id is None:
            job_id = create_job(session, experiment_id, dataset_id).id
    _inline(functools.partial(embed_dataset, job_id, factory, settings), factory, EmbeddingJob, job_id, settings)
    with session_scope(factory) as session:
        job = session.get(EmbeddingJob, job_id)
        result = session.get(EmbeddingResult, job_id)
        assert job is not None and result is not None and job.dim is not None
        reps = read_array(session, result.representations_sha256, np.float32, (job.n_total, job.dim))
        return reps, read_array(session, result.labels_sha256, np.int64)


def _class_indices(session: Session, settings: Settings, dataset_id: int, stored: np.ndarray,
                   names: list[str]) -> np.ndarray:
    """The upload's labels as the model's class indices: by name where every label is one of
    the classes, else integers taken as indices; ValueError naming labels of neither."""
    from worker.embedding import upload_rows

    kind = session.scalar(select(DatasetUpload.kind).where(DatasetUpload.id == dataset_id))
    _, raw = upload_rows(materialise_upload(session, dataset_id, settings), str(kind))
    position = {name: i for i, name in enumerate(names)}
    texts = [str(v) for v in raw.tolist()]
    if all(t in position for t in texts):
        return np.asarray([position[t] for t in texts], np.int64)
    if raw.dtype.kind in "iu" and len(stored) and stored.min() >= 0 and stored.max() < len(names):
        return stored
    unknown = sorted({t for t in texts if t not in position})[:5]
    raise ValueError(f"the model's evaluation dataset {dataset_id} has labels that are not among its "
                     f"classes ({', '.join(unknown)}; the classes: {', '.join(names[:10])}"
                     f"{', ...' if len(names) > 10 else ''}); set an evaluation dataset of the model's "
                     "classes (PATCH /models/{name})")


def gate_on_dataset(factory: sessionmaker[Session], settings: Settings, candidate: int, incumbent: int,
                    dataset_id: int, margin: float) -> dict[str, Any]:
    """corel.gate's report of run ``candidate`` against run ``incumbent`` on the model's
    evaluation upload (both embed its rows: batch embedding jobs, kept; its labels read once,
    as the model's classes, which every version keeps)."""
    h_cand, stored = _embedded(factory, settings, candidate, dataset_id)
    h_inc, _ = _embedded(factory, settings, incumbent, dataset_id)
    with session_scope(factory) as session:
        served = _served(session, settings, candidate)
        names = [str(c) for c in served.class_names]
        y = _class_indices(session, settings, dataset_id, stored, names)
        cand = _scored(session, served, candidate, h_cand, y)
        inc = _scored(session, _served(session, settings, incumbent), incumbent, h_inc, y)
    report = compare(cand, inc, names, margin=margin)
    report["candidate_experiment"], report["incumbent_experiment"] = candidate, incumbent
    report["evaluated_on"] = {"dataset_id": dataset_id}
    return report


def _inline(run: Callable[[], str], factory: sessionmaker[Session], model: lifecycle.Job, row_id: int,
            settings: Settings) -> bool:
    """Run a job here (``run`` claims it); when another worker holds it, wait for its end
    (taking it over if that worker is lost meanwhile). ValueError unless it succeeded; True
    when this call's ``run`` ended it, False when it had ended already or another did."""
    if run() == Status.SUCCEEDED:
        return True
    while True:
        with session_scope(factory) as session:
            status, error = session.execute(select(model.status, model.error).where(model.id == row_id)).one()
        if status == Status.SUCCEEDED:
            return False
        if status in (Status.FAILED, Status.CANCELLED):
            what = next(kind.name for kind in lifecycle.JOB_KINDS if kind.model is model)
            raise ValueError(f"{what} {row_id} is {status}" + (f": {error}" if error else ""))
        time.sleep(min(settings.heartbeat_seconds, 1.0))
        if run() == Status.SUCCEEDED:
            return True


def build_collection(build_id: int, factory: sessionmaker[Session], settings: Settings) -> str:
    """Claim the build; embed the collection's dataset by the version's run (a batch
    embedding job) and index its rows, each run here as its own job would run; returns the
    status. Resumable: a lost worker's build is taken over and goes on from the jobs it made."""
    factory = ensure_store(factory, settings)
    with session_scope(factory) as session:
        if session.get(CollectionBuild, build_id) is None:
            return "gone"
        if not lifecycle.claim(session, build_id, settings, CollectionBuild):
            return "skipped"
    try:
        with lease_kept(factory, build_id, settings, CollectionBuild):
            _build_collection(build_id, factory, settings)
        with session_scope(factory) as session:
            if not lifecycle.end(session, build_id, Status.SUCCEEDED, CollectionBuild):
                raise LostLease(f"collection build {build_id} is no longer ours")
    except LostLease:
        return "lost"
    except (ValueError, DomainError) as exc:
        log.warning("collection build failed", extra={"build": build_id, "error": str(exc)})
        lifecycle.finish(factory, build_id, Status.FAILED, CollectionBuild, error=str(exc))
        return Status.FAILED
    return Status.SUCCEEDED


def _build_collection(build_id: int, factory: sessionmaker[Session], settings: Settings) -> None:
    """The build's embedding job, then its index, each made if missing and run here;
    ValueError saying which failed and why."""
    from app.services.embedding_jobs import create_job
    from app.services.indexes import create_index
    from worker.embedding import embed_dataset
    from worker.indexing import build_index

    with session_scope(factory) as session:
        row = session.get(CollectionBuild, build_id)
        assert row is not None
        if row.embedding_job_id is None:
            dataset = session.scalar(select(ModelCollection.dataset_id).where(
                ModelCollection.id == row.collection_id))
            assert dataset is not None
            row.embedding_job_id = create_job(session, row.experiment_id, dataset).id
        job_id, experiment_id = row.embedding_job_id, row.experiment_id
    _inline(functools.partial(embed_dataset, job_id, factory, settings), factory, EmbeddingJob, job_id, settings)
    with session_scope(factory) as session:
        row = session.get(CollectionBuild, build_id)
        assert row is not None
        if row.index_id is None:
            row.index_id = create_index(session, experiment_id, IndexCreate(embedding_job_id=job_id), settings).id
        index_id = row.index_id
    # The API processes load the index while the flip is made: told by the commit that marks
    # it built. An index built already (a build resumed after it) is loaded when it is told here.
    if not _inline(functools.partial(build_index, index_id, factory, settings, warm=True), factory, NeighborIndex,
                   index_id, settings):
        with session_scope(factory) as session:
            events.publish_warm(session, experiment_id, index_id)


def embed_collections(factory: sessionmaker[Session], settings: Settings, model_id: int, version: int) -> None:
    """Every collection of the model embedded and indexed by ``version``'s run (its builds
    made where missing and run here); ValueError naming one that failed."""
    with session_scope(factory) as session:
        run = _run_of(session, model_id, version)
        collections = list(session.scalars(select(ModelCollection.id).where(ModelCollection.model_id == model_id)))
        builds = []
        for collection in collections:
            build = session.scalar(select(CollectionBuild).where(
                CollectionBuild.collection_id == collection, CollectionBuild.version == version))
            if build is None:
                build = CollectionBuild(collection_id=collection, version=version, experiment_id=run,
                                        status=Status.QUEUED, cancel_requested=False, attempts=0)
                session.add(build)
                session.flush()
            builds.append(build.id)
    for build_id in builds:
        _inline(functools.partial(build_collection, build_id, factory, settings), factory, CollectionBuild,
                build_id, settings)


def kept_versions(session: Session, model_id: int, keep: int) -> set[int]:
    """The versions whose collection builds a model keeps: per alias, the last ``keep``
    distinct versions it named (the one it names now first), and every version a promotion
    still queued or running is to flip to."""
    kept: set[int] = set()
    moves = session.execute(select(AliasMove.alias, AliasMove.to_version).where(AliasMove.model_id == model_id)
                            .order_by(AliasMove.id.desc())).all()
    per_alias: dict[str, list[int]] = {}
    for alias, version in moves:
        mine = per_alias.setdefault(alias, [])
        if version not in mine and len(mine) < keep:
            mine.append(version)
    for versions in per_alias.values():
        kept.update(versions)
    kept.update(session.scalars(select(ModelAlias.version).where(ModelAlias.model_id == model_id)))
    kept.update(session.scalars(select(Promotion.version).where(
        Promotion.model_id == model_id, Promotion.status.in_((Status.QUEUED, Status.RUNNING)))))
    return kept


def collect_builds(session: Session, model_id: int, keep: int, promotion_id: int | None = None) -> list[int]:
    """Delete the model's finished collection builds of versions it no longer keeps
    (:func:`kept_versions`), with their embedding jobs and indexes, the artifacts released
    once the transaction commits; the versions collected."""
    kept = kept_versions(session, model_id, keep)
    builds = session.scalars(select(CollectionBuild).join(
        ModelCollection, ModelCollection.id == CollectionBuild.collection_id).where(
        ModelCollection.model_id == model_id, CollectionBuild.version.not_in(kept),
        CollectionBuild.status.in_((Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)))).all()
    digests: list[str | None] = []
    for build in builds:
        index = None if build.index_id is None else session.get(NeighborIndex, build.index_id)
        job = None if build.embedding_job_id is None else session.get(EmbeddingJob, build.embedding_job_id)
        result = None if job is None else session.get(EmbeddingResult, job.id)
        session.delete(build)
        session.flush()
        if index is not None:
            digests.append(index.sha256)
            session.delete(index)
        if result is not None:
            digests += [result.representations_sha256, result.labels_sha256]
            session.delete(result)
        if job is not None:
            session.delete(job)
    session.flush()
    release_after_commit(session, digests)
    versions = sorted({b.version for b in builds})
    if versions:
        log.info("collection builds collected", extra={"model": model_id, "versions": versions,
                                                         "promotion": promotion_id})
    return versions


def _run_of(session: Session, model_id: int, version: int) -> int:
    run = session.scalar(select(ModelVersion.experiment_id).where(
        ModelVersion.model_id == model_id, ModelVersion.version == version))
    if run is None:
        raise ValueError(f"version {version} no longer exists")
    return int(run)


def promote(promotion_id: int, factory: sessionmaker[Session], settings: Settings) -> str:
    """Claim, gate, flip; returns the outcome."""
    factory = ensure_store(factory, settings)
    with session_scope(factory) as session:
        row = session.get(Promotion, promotion_id)
        if row is None:
            return "gone"
        if not lifecycle.claim(session, promotion_id, settings, Promotion):
            log.info("not claimed (finished, or running elsewhere)", extra={"promotion": promotion_id})
            return "skipped"
        session.refresh(row)
        model_id, alias, version, force, margin = row.model_id, row.alias, row.version, row.force, row.margin
        expected, protect, user = row.expected_version, row.protect, row.owner_id
        eval_dataset = session.scalar(select(RegisteredModel.eval_dataset_id).where(RegisteredModel.id == model_id))
        lifecycle.progress(session, promotion_id, Promotion, phase="gating")
    try:
        with session_scope(factory) as session:
            candidate = _run_of(session, model_id, version)
            report: dict[str, Any]
            if force:
                report = {"passed": True, "forced": True}
            elif expected is None:
                report = {"passed": True, "incumbent": None, "candidate_experiment": candidate}
            elif eval_dataset is None:
                try:
                    report = gate(session, settings, candidate, _run_of(session, model_id, expected), margin)
                except NoSharedRows as exc:
                    report = {"passed": False, "reason": str(exc)}
            else:
                incumbent = _run_of(session, model_id, expected)
        if not force and expected is not None and eval_dataset is not None:
            with lease_kept(factory, promotion_id, settings, Promotion):  # both runs embed its rows
                report = gate_on_dataset(factory, settings, candidate, incumbent, eval_dataset, margin)
        if not report["passed"]:
            with session_scope(factory) as session:
                if not lifecycle.end(session, promotion_id, Status.SUCCEEDED, Promotion,
                                     outcome="refused", report=report, phase=None):
                    raise LostLease(f"promotion {promotion_id} is no longer ours")
            log.info("promotion refused", extra={"promotion": promotion_id, "reason": report.get("reason")})
            return "refused"
        with session_scope(factory) as session:
            lifecycle.progress(session, promotion_id, Promotion, phase="embedding")
            # The API processes load the candidate's model while its collections embed.
            events.publish_warm(session, candidate)
        with lease_kept(factory, promotion_id, settings, Promotion):  # the candidate's indexes, before the flip
            embed_collections(factory, settings, model_id, version)
        with session_scope(factory) as session:  # the flip: compare, swap, history, in one transaction
            current = session.scalar(select(ModelAlias).where(
                ModelAlias.model_id == model_id, ModelAlias.name == alias).with_for_update())
            now_at = None if current is None else current.version
            if now_at != expected:
                outcome = "conflict"
                report["conflict"] = (f"the alias names version {now_at} now, not {expected} as the "
                                      "promotion expected: it moved meanwhile")
            else:
                outcome = "succeeded"
                if current is None:
                    session.add(ModelAlias(model_id=model_id, name=alias, version=version,
                                           protected=bool(protect)))
                else:
                    current.version, current.updated_at = version, utcnow()
                    if protect is not None:
                        current.protected = protect
                session.add(AliasMove(model_id=model_id, alias=alias, from_version=now_at, to_version=version,
                                      user_id=user, promotion_id=promotion_id, gate=_summary(report)))
                session.flush()
                collect_builds(session, model_id, settings.model_keep_versions, promotion_id)
            if not lifecycle.end(session, promotion_id, Status.SUCCEEDED, Promotion, outcome=outcome,
                                 report=report, phase=None):
                raise LostLease(f"promotion {promotion_id} is no longer ours")  # rolls the flip back
    except LostLease:
        log.warning("lost the lease; another worker continues", extra={"promotion": promotion_id})
        return "lost"
    except (ValueError, DomainError) as exc:  # a version or a run that is gone
        log.warning("promotion failed", extra={"promotion": promotion_id, "error": str(exc)})
        lifecycle.finish(factory, promotion_id, Status.FAILED, Promotion, outcome="failed", error=str(exc),
                         phase=None)
        return Status.FAILED
    log.info("promotion ended", extra={"promotion": promotion_id, "outcome": outcome})
    return outcome


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    """What the alias's history keeps of the gate: passed or forced, and each figure's
    difference with its interval."""
    out: dict[str, Any] = {"passed": report.get("passed"), "forced": bool(report.get("forced"))}
    for name, figure in (report.get("figures") or {}).items():
        out[name] = {"delta": figure["delta"], "interval": figure["interval"]}
    return out
