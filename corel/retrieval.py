"""Retrieval metrics of a representation: precision@1, R-precision and MAP@R.

As "A Metric Learning Reality Check" (Musgrave et al., 2020) defines them and
pytorch-metric-learning's ``AccuracyCalculator`` computes them: each query's
neighbours are ranked among the reference rows (by Euclidean distance, or by cosine
similarity), and R is the number of reference rows of the query's class.

* precision@1: the share of queries whose nearest reference row has their class;
* R-precision: the share of the first R neighbours that have the query's class;
* MAP@R: the mean over the first R neighbours of the precision at each one that has
  the query's class, counting those that have not as 0.

Queries and reference are distinct rows (the service's queries are the test split,
its reference the training split), so no row is its own neighbour.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from corel.geometry import GEOMETRIES, Geometry


def neighbours(queries: torch.Tensor, reference: torch.Tensor, k: int, geometry: Geometry,
               chunk: int = 1024, refine: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` nearest reference rows of each query, nearest first: (distances,
    indices), each (n_queries, k). Distance: Euclidean, or 1 - cosine similarity.

    Euclidean distances come from matrix products (as ``torch.cdist`` computes them for
    large inputs), which lose the small ones to cancellation (a row's distance to itself
    reads 1e-3 in float32). ``refine`` recomputes the distances of twice ``k``
    candidates directly and ranks them by those (what /neighbors answers)."""
    if geometry not in GEOMETRIES:
        raise ValueError(f"unknown geometry {geometry!r}; allowed: {', '.join(GEOMETRIES)}")
    if geometry == "cosine":
        queries = torch.nn.functional.normalize(queries, dim=1)
        reference = torch.nn.functional.normalize(reference, dim=1)
    dists, idx = [], []
    for start in range(0, len(queries), chunk):
        q = queries[start:start + chunk]
        d = 1.0 - q @ reference.T if geometry == "cosine" else torch.cdist(q, reference)
        if refine and geometry == "euclidean":
            wide = torch.topk(d, min(2 * k, d.shape[1]), dim=1, largest=False).indices
            exact = (q[:, None, :] - reference[wide]).norm(dim=2)
            order = torch.argsort(exact, dim=1, stable=True)[:, :k]
            dists.append(torch.gather(exact, 1, order))
            idx.append(torch.gather(wide, 1, order))
            continue
        top = torch.topk(d, k, dim=1, largest=False, sorted=True)
        dists.append(top.values)
        idx.append(top.indices)
    return torch.cat(dists), torch.cat(idx)


def _tensor(values: ArrayLike) -> torch.Tensor:
    """``values`` as a tensor, sharing a writable array's memory; a read-only array (a
    cached latent space, a memory map) is copied, which torch would otherwise share with a
    warning that writes through it are undefined."""
    array = np.asarray(values)
    return torch.as_tensor(array if array.flags.writeable else array.copy())


def _checked(queries: ArrayLike, query_labels: ArrayLike, reference: ArrayLike,
             reference_labels: ArrayLike) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    q, r = _tensor(queries), _tensor(reference)
    qy, ry = _tensor(query_labels).long().reshape(-1), _tensor(reference_labels).long().reshape(-1)
    if q.ndim != 2 or r.ndim != 2 or q.shape[1] != r.shape[1]:
        raise ValueError(f"queries and reference must be (N, D) with the same D; got "
                         f"{tuple(q.shape)} and {tuple(r.shape)}")
    if len(qy) != len(q) or len(ry) != len(r):
        raise ValueError("one label per row: queries, reference and their labels must match")
    if len(q) == 0 or len(r) == 0:
        raise ValueError("retrieval needs at least one query and one reference row")
    if q.dtype != r.dtype:
        q, r = q.double(), r.double()
    return q, qy, r, ry


def per_query(queries: ArrayLike, query_labels: ArrayLike, reference: ArrayLike,
              reference_labels: ArrayLike, geometry: Geometry = "euclidean",
              chunk: int = 1024) -> dict[str, np.ndarray]:
    """Each query's own figures (float64 arrays, one entry per query): ``hit_at_1`` (its
    nearest reference row is of its class), ``r_precision`` and ``average_precision_at_r``
    (their means are :func:`retrieval_metrics`'). ValueError as there."""
    q, qy, r, ry = _checked(queries, query_labels, reference, reference_labels)
    counts = torch.bincount(ry, minlength=int(max(qy.max(), ry.max())) + 1)
    per_query_r = counts[qy]
    if bool((per_query_r == 0).any()):
        missing = sorted(set(qy[per_query_r == 0].tolist()))
        raise ValueError(f"class(es) {missing} have queries but no reference row")
    k = int(per_query_r.max())
    ranks = torch.arange(1, k + 1, dtype=torch.float64)
    hit1, r_prec, ap = [], [], []
    for start in range(0, len(q), chunk):  # a chunk of queries at a time: memory stays small
        stop = start + chunk
        _, idx = neighbours(q[start:stop], r, k, geometry, chunk)
        rr = per_query_r[start:stop]
        hits = (ry[idx] == qy[start:stop, None]).double()  # a neighbour of the query's class
        hits_r = hits * (ranks[None, :] <= rr[:, None])  # ... among the first R
        precision_at_i = torch.cumsum(hits_r, dim=1) / ranks
        hit1.append(hits[:, 0])
        r_prec.append(hits_r.sum(1) / rr)
        ap.append((precision_at_i * hits_r).sum(1) / rr)
    return {"hit_at_1": torch.cat(hit1).numpy(), "r_precision": torch.cat(r_prec).numpy(),
            "average_precision_at_r": torch.cat(ap).numpy()}


def retrieval_metrics(queries: ArrayLike, query_labels: ArrayLike, reference: ArrayLike,
                      reference_labels: ArrayLike, geometry: Geometry = "euclidean",
                      chunk: int = 1024) -> dict[str, Any]:
    """precision@1, R-precision and MAP@R of ``queries`` against ``reference`` (see the
    module). Raises ValueError for shapes that do not match or a query class with no
    reference row."""
    each = per_query(queries, query_labels, reference, reference_labels, geometry, chunk)
    n, n_reference = len(each["hit_at_1"]), len(_tensor(reference))
    p1, r_prec, map_r = (float(each[key].sum()) for key in
                         ("hit_at_1", "r_precision", "average_precision_at_r"))
    return {
        "precision_at_1": p1 / n,
        "r_precision": r_prec / n,
        "mean_average_precision_at_r": map_r / n,
        "geometry": geometry,
        "n_queries": n,
        "n_reference": n_reference,
    }
