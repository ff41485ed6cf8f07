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
from typing import Any

from fastapi.concurrency import run_in_threadpool

from app.core.db import session_scope
from app.core.errors import Conflict, InvalidInput
from app.core.schemas import NeighborsRequest
from app.services.indexes import index_to_search, load_index
from app.services.retrieval import training_rows
from app.serving import inference
from app.storage.artifacts import class_names
from corel.clustering import default_metric
from corel.device import pick_device
from corel.index import VectorIndex


def _exact_over_training(state: Any, experiment_id: int, loss: str) -> VectorIndex:
    with session_scope(state.sessionmaker) as session:
        reps, labels = training_rows(session, experiment_id, "/neighbors")
        names = class_names(session, experiment_id)
    limit = state.settings.exact_search_max_rows
    if len(labels) > limit:
        raise Conflict(f"experiment {experiment_id} has {len(labels)} training rows, more than "
                       f"exact search takes (COREL_EXACT_SEARCH_MAX_ROWS, {limit}), and no index; "
                       f"build one with POST /experiments/{experiment_id}/index, then search again")
    index = VectorIndex.build(reps, labels, default_metric(loss), "exact", class_names=names)
    return index.to(pick_device(state.settings.device))  # exact search on the GPU, where there is one


def _reference(state: Any, experiment_id: int, loss: str, index_id: int | None) -> tuple[int | None, VectorIndex]:
    """(the index's id or None, the index) that this request searches."""
    with session_scope(state.sessionmaker) as session:
        row = index_to_search(session, experiment_id, index_id)
        chosen = None if row is None else row.id
    if chosen is None:
        return None, state.references.get(("train", experiment_id),
                                          lambda: _exact_over_training(state, experiment_id, loss))

    def load() -> VectorIndex:
        with session_scope(state.sessionmaker) as session:
            return load_index(session, chosen).to(pick_device(state.settings.device))
    return chosen, state.references.get(("index", chosen), load)


def _knn_vote(labels: list[int]) -> int:
    """The majority class of the neighbours (nearest first); a tie goes to the class
    whose nearest member is nearer."""
    counts = Counter(labels)
    top = max(counts.values())
    return next(label for label in labels if counts[label] == top)


def _name(names: list[str] | None, label: int) -> str:
    return names[label] if names is not None and 0 <= label < len(names) else str(label)


async def search(state: Any, req: NeighborsRequest) -> dict[str, Any]:
    loaded, h, sims = await inference.infer(state, req, similarities=True)
    assert sims is not None
    index_id, index = await run_in_threadpool(_reference, state, loaded.experiment_id,
                                              loaded.spec.loss, req.index_id)
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
            "neighbors": [{"row": r, "label": y, "class_name": _name(row_names, y), "distance": max(d, 0.0)}
                          for r, y, d in zip(r_row, y_row, d_row, strict=True)],
            "knn_prediction": {"class_index": vote, "class_name": _name(row_names, vote)},
            "prediction": {"class_index": predicted[i], "class_name": names[predicted[i]]},
        }
        if req._names is not None:
            result["input"] = req._names[i]
        results.append(result)
    return {"experiment_id": loaded.experiment_id, "index_id": index_id, "k": req.k,
            "geometry": index.geometry, "n_reference": n, "results": results}
