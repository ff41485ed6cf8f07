"""Nearest neighbours of new inputs among stored rows: an experiment's index, or its
training split searched exactly.

The inputs go through the same pipeline as /embed (app.serving.inference,
corel.serving); their representations are searched in the loss's own geometry (cosine
for Cosine-COREL, else Euclidean: the clustering report's) with a
``corel.index.VectorIndex``: the index asked for, else the experiment's latest built one
(app.services.indexes), else an exact one over the training split when it is small
enough. Either is read from the database once per API process and kept in a small LRU,
as the models are (LoadOnceCache).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from app.core.db import session_scope
from app.core.errors import Conflict, InvalidInput
from app.core.models import DatasetUpload, EmbeddingJob, Experiment, NeighborIndex
from app.core.schemas.inference import NeighborsRequest
from app.services.indexes import index_to_search, load_index
from app.services.retrieval import training_rows
from app.services.rows import RowSource, training_positions
from app.serving import inference
from app.serving.state import ServingState
from app.storage.artifacts import class_names
from corel.clustering import default_metric
from corel.device import pick_device
from corel.index import VectorIndex


@dataclass(frozen=True)
class Reference:
    """What /neighbors searches, and what its rows are: their positions in the file they
    were read from (None for a run stored before they were kept) and that file."""

    index: VectorIndex
    positions: np.ndarray | None
    source: RowSource
    texts: list[str] | None  # every row's text of a text source, read once with the reference


def _experiment_source(session: Session, experiment_id: int) -> RowSource:
    exp = session.get(Experiment, experiment_id)
    assert exp is not None
    return RowSource(exp.dataset, exp.dataset_id)


def _exact_over_training(state: ServingState, experiment_id: int, loss: str) -> Reference:
    with session_scope(state.sessionmaker) as session:
        reps, labels = training_rows(session, experiment_id, "/neighbors")
        names = class_names(session, experiment_id)
        positions = training_positions(session, experiment_id)
        source = _experiment_source(session, experiment_id)
        texts = _texts(session, state.settings, source, positions)
    limit = state.settings.exact_search_max_rows
    if len(labels) > limit:
        raise Conflict(f"experiment {experiment_id} has {len(labels)} training rows, more than "
                       f"exact search takes (COREL_EXACT_SEARCH_MAX_ROWS, {limit}), and no index; "
                       f"build one with POST /experiments/{experiment_id}/index, then search again")
    index = VectorIndex.build(reps, labels, default_metric(loss), "exact", class_names=names)
    # exact search on the GPU, where there is one
    return Reference(index.to(pick_device(state.settings.device)), positions, source, texts)


def _reference(state: ServingState, experiment_id: int, loss: str, index_id: int | None) -> tuple[int | None, Reference]:
    """(the index's id or None, what this request searches)."""
    with session_scope(state.sessionmaker) as session:
        row = index_to_search(session, experiment_id, index_id)
        chosen = None if row is None else row.id
    if chosen is None:
        return None, state.references.get(("train", experiment_id),
                                          lambda: _exact_over_training(state, experiment_id, loss))
    return chosen, indexed_reference(state, experiment_id, chosen)


def indexed_reference(state: ServingState, experiment_id: int, index_id: int) -> Reference:
    """Index ``index_id`` (one of run ``experiment_id``'s) as /neighbors searches it: from the
    process's cache, or loaded once."""
    return state.references.get(("index", index_id), lambda: _load_reference(state, experiment_id, index_id))


def _load_reference(state: ServingState, experiment_id: int, index_id: int) -> Reference:
    with session_scope(state.sessionmaker) as session:
        index = load_index(session, index_id).to(pick_device(state.settings.device))
        built = session.get(NeighborIndex, index_id)
        assert built is not None
        if built.embedding_job_id is None:  # the training split's rows
            positions = training_positions(session, experiment_id)
            source = _experiment_source(session, experiment_id)
        else:
            job = session.get(EmbeddingJob, built.embedding_job_id)
            upload = None if job is None else session.get(DatasetUpload, job.dataset_id)
            # A job embeds every row of its upload, in order.
            positions = np.arange(index.n, dtype=np.int64)
            source = RowSource("npz" if upload is None or upload.kind == "npz" else upload.kind,
                               None if job is None else job.dataset_id)
        return Reference(index, positions, source, _texts(session, state.settings, source, positions))


def warm(state: ServingState, experiment_id: int, index_id: int | None) -> None:
    """Run ``experiment_id``'s model, and its index ``index_id``, loaded into this process's
    caches before a request asks (app.jobs.events.publish_warm: a promotion's candidate,
    before its flip), so that no request after the flip waits for their loading."""
    inference.load_model(state, experiment_id)
    if index_id is not None:
        indexed_reference(state, experiment_id, index_id)


def _texts(session: Session, settings: Any, source: RowSource, positions: np.ndarray | None) -> list[str] | None:
    """A text source's texts, where the rows' positions are known (none to name otherwise)."""
    return None if positions is None else source.texts(session, settings)


def _knn_vote(labels: list[int]) -> int:
    """The majority class of the neighbours (nearest first); a tie goes to the class
    whose nearest member is nearer."""
    counts = Counter(labels)
    top = max(counts.values())
    return next(label for label in labels if counts[label] == top)


def _name(names: list[str] | None, label: int) -> str:
    return names[label] if names is not None and 0 <= label < len(names) else str(label)


async def search(state: ServingState, req: NeighborsRequest, index_checked: bool = False) -> dict[str, Any]:
    """``index_checked``: ``req.index_id`` was read as the run's succeeded index in the
    statement that named the run (a model's collection, with its alias): not looked up
    again, and searched from this process's cache where it is there (no thread, no query)."""
    loaded, h, sims = await inference.infer(state, req, similarities=True)
    assert sims is not None
    index_id: int | None
    if index_checked and req.index_id is not None:
        index_id = req.index_id
        cached = state.references.peek(("index", index_id))
        ref = cached if cached is not None else await run_in_threadpool(
            indexed_reference, state, loaded.experiment_id, index_id)
    else:
        index_id, ref = await run_in_threadpool(_reference, state, loaded.experiment_id,
                                                loaded.spec.loss, req.index_id)
    index = ref.index
    n = index.n
    if req.k > n:
        where = f"index {index_id}" if index_id is not None else f"experiment {loaded.experiment_id}'s training split"
        raise InvalidInput(f"k is {req.k}, but {where} has {n} rows to search; k must be at most {n}")
    distances, rows = await run_in_threadpool(index.search, h, req.k)
    names = loaded.class_names
    row_names = index.class_names  # the rows' own (an uploaded dataset's, for a batch job's rows)
    predicted = sims.argmax(1).tolist()
    labels_all = index.labels[rows]
    results = []
    for i, (d_row, r_row, y_row) in enumerate(zip(distances.tolist(), rows.tolist(), labels_all.tolist(),
                                                 strict=True)):
        vote = _knn_vote(y_row)
        result: dict[str, Any] = {
            "neighbors": [_neighbor(ref, r, y, _name(row_names, y), d)
                          for r, y, d in zip(r_row, y_row, d_row, strict=True)],
            "knn_prediction": {"class_index": vote, "class_name": _name(row_names, vote)},
            "prediction": {"class_index": predicted[i], "class_name": names[predicted[i]]},
        }
        if req._names is not None:
            result["input"] = req._names[i]
        results.append(result)
    source = ({"dataset_id": ref.source.dataset_id} if ref.source.dataset_id is not None
              else {"dataset": ref.source.dataset})
    return {"experiment_id": loaded.experiment_id, "index_id": index_id, "k": req.k,
            "geometry": index.geometry, "n_reference": n, "source": source, "results": results}


def _neighbor(ref: Reference, row: int, label: int, name: str, distance: float) -> dict[str, Any]:
    """One neighbour: its row in the reference, its id (its position in the file it was
    read from), label and distance, and its text or the link to its image where it has one."""
    out: dict[str, Any] = {"row": row, "id": None, "label": label, "class_name": name,
                           "distance": max(distance, 0.0)}
    if ref.positions is None:  # a run stored before its rows' positions were kept
        return out
    position = int(ref.positions[row])
    out["id"] = position
    if ref.texts is not None and 0 <= position < len(ref.texts):
        out["text"] = ref.texts[position]
    url = ref.source.image_url(position)
    if url is not None:
        out["image_url"] = url
    return out
