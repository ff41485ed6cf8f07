"""Nearest neighbours of new inputs among an experiment's stored training rows.

The inputs go through the same pipeline as /embed (app.services.inference, corel.serving);
their representations are searched, exactly (batched matrix products in torch), among the
experiment's training split as its worker stored it, in the loss's own geometry (cosine
for Cosine-COREL, else Euclidean: the clustering report's). The reference rows are read
once per API process and kept in a small LRU, as the models are (LoadOnceCache).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from fastapi.concurrency import run_in_threadpool

from app.db import session_scope
from app.errors import Conflict, InvalidInput
from app.schemas import NeighborsRequest
from app.services import inference
from app.services.retrieval import training_rows
from corel.clustering import default_metric
from corel.retrieval import neighbours


@dataclass(frozen=True)
class Reference:
    """An experiment's training rows, ready to search."""

    reps: torch.Tensor  # (n, dim) float32
    labels: np.ndarray  # (n,) int64
    geometry: str


def _load_reference(state: Any, experiment_id: int, loss: str) -> Reference:
    with session_scope(state.sessionmaker) as session:
        reps, labels = training_rows(session, experiment_id, "/neighbors")
    return Reference(torch.from_numpy(reps.copy()), labels.copy(), default_metric(loss))


def _knn_vote(labels: list[int]) -> int:
    """The majority class of the neighbours (nearest first); a tie goes to the class
    whose nearest member is nearer."""
    counts = Counter(labels)
    top = max(counts.values())
    return next(label for label in labels if counts[label] == top)


async def search(state: Any, req: NeighborsRequest) -> dict[str, Any]:
    loaded, h, sims = await inference.infer(state, req, similarities=True)
    assert sims is not None
    ref = await run_in_threadpool(state.references.get, loaded.experiment_id,
                                  lambda: _load_reference(state, loaded.experiment_id, loaded.spec.loss))
    n = len(ref.labels)
    limit = state.settings.exact_search_max_rows
    if n > limit:
        raise Conflict(f"experiment {loaded.experiment_id} has {n} training rows, more than exact "
                       f"search takes (COREL_EXACT_SEARCH_MAX_ROWS, {limit})")
    if req.k > n:
        raise InvalidInput(f"k is {req.k}, but experiment {loaded.experiment_id} has {n} training "
                           f"rows to search; k must be at most {n}")
    distances, rows = await run_in_threadpool(neighbours, h, ref.reps, req.k, ref.geometry,
                                              1024, True)
    names = loaded.class_names
    predicted = sims.argmax(1).tolist()
    results = []
    for i, (d_row, r_row) in enumerate(zip(distances.tolist(), rows.tolist(), strict=True)):
        labels = [int(ref.labels[r]) for r in r_row]
        vote = _knn_vote(labels)
        result: dict[str, Any] = {
            "neighbors": [{"row": r, "label": y, "class_name": names[y], "distance": max(d, 0.0)}
                          for r, y, d in zip(r_row, labels, d_row, strict=True)],
            "knn_prediction": {"class_index": vote, "class_name": names[vote]},
            "prediction": {"class_index": predicted[i], "class_name": names[predicted[i]]},
        }
        if req._names is not None:
            result["input"] = req._names[i]
        results.append(result)
    return {"experiment_id": loaded.experiment_id, "index_id": None, "k": req.k,
            "geometry": ref.geometry, "n_reference": n, "results": results}
