"""A nearest-neighbour index over stored representations: exact or approximate.

* ``exact``: batched matrix products in torch over every row (the squared norms kept),
  Euclidean distances of the best candidates recomputed directly, as
  :func:`corel.retrieval.neighbours` does;
* ``hnsw``: faiss's ``IndexHNSWFlat`` (chosen over hnswlib and usearch by
  ``bench/ann_choice.py``: the best recall at the same efSearch, and the fastest build of
  the three; faiss also reads and writes an index as bytes, which is how the service
  keeps it). Its ``efSearch`` is chosen at build time: the smallest that reaches
  ``target_recall`` on a sample of the indexed rows (leave-one-out recall@10 against
  exact search), stored with the index.

Both answer the same thing for the same geometry: distances nearest first, Euclidean,
or 1 - cosine similarity (the cosine geometry searches unit vectors, where
``|a - b|^2 / 2 = 1 - cos(a, b)``). The index is bytes (:meth:`VectorIndex.to_bytes`,
:meth:`VectorIndex.from_bytes`) and holds the rows' labels; it knows nothing of where
it is stored.
"""

from __future__ import annotations

import copy
import json
import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from corel.geometry import GEOMETRIES, Geometry

KINDS = ("exact", "hnsw")
K_CALIBRATE = 10
CALIBRATION_ROWS = 1000
EF_SEARCH_STEPS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
_MAGIC = b"COREL-INDEX-1\n"


class BuildCancelled(Exception):
    """The progress callback asked the build to stop."""


@dataclass(frozen=True)
class HnswParams:
    """HNSW's graph degree and construction breadth (faiss's ``M`` and ``efConstruction``)."""

    m: int = 16
    ef_construction: int = 100

    def __post_init__(self) -> None:
        if not 4 <= self.m <= 128:
            raise ValueError(f"HNSW m must be between 4 and 128; got {self.m}")
        if not 8 <= self.ef_construction <= 2048:
            raise ValueError(f"HNSW ef_construction must be between 8 and 2048; got {self.ef_construction}")


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - the service installs it
        raise ImportError("an approximate (hnsw) index needs faiss: pip install 'corel[search]'") from exc
    return faiss


READ_PIECE = 1 << 26
"""The most bytes faiss asks of :func:`_read_faiss`'s reader at once (an array is read whole
below it)."""


def _read_faiss(payload: memoryview) -> Any:
    """A faiss index from its serialized bytes, read by faiss from slices of ``payload``
    (``PyCallbackIOReader``): each array copied once, into the index. faiss's own
    ``deserialize_index`` first copies the whole payload into a vector of its own, then
    from it: a 40 MB HNSW index of 100,000 rows took 38-55 ms that way and 20-24 ms this
    way (a 2-core Intel Xeon), which a promotion's flip waits for. A payload cut short is
    faiss's RuntimeError."""
    faiss = _faiss()
    at = 0

    def read(n: int) -> bytes:
        nonlocal at
        piece = payload[at:at + n]
        at += len(piece)
        return bytes(piece)

    return faiss.read_index(faiss.PyCallbackIOReader(read, READ_PIECE))


def _read_faiss_file(path: str | os.PathLike[str], offset: int) -> Any:
    """A faiss index over the file ``path``, its serialized bytes starting at ``offset``,
    read in place: the file is mapped into memory (copy-on-write, private to this
    process) and faiss's zero-copy reader makes the index's large arrays (the vectors, the
    graph's neighbour lists) views of the mapping rather than copies, in one call that
    lets go of the GIL. The mapping lives as long as the index (``referenced_objects``);
    the pages are the page cache's, shared by every process that serves the same file.
    A content-addressed file is never rewritten in place (a store writes a new file and
    renames it over it; one deleted while mapped stays readable until unmapped). An 80 MB
    HNSW index (100,000 x 128, M 32): 9-11 ms, against 62-77 ms read into copies of its
    own by faiss's file reader (a 2-core Intel Xeon, alone). A file cut short is faiss's
    RuntimeError."""
    faiss = _faiss()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size <= offset:
            raise RuntimeError(f"{os.fspath(path)} is shorter than its header ({offset} bytes)")
        mapping = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY)
    data = np.frombuffer(mapping, dtype=np.uint8)[offset:]
    index = faiss.read_index(faiss.ZeroCopyIOReader(faiss.swig_ptr(data), data.size))
    index.referenced_objects = [mapping, data]  # faiss's own idiom: kept as long as the index
    return index


def _check(vectors: np.ndarray, labels: np.ndarray, geometry: Geometry, kind: str) -> None:
    if geometry not in GEOMETRIES:
        raise ValueError(f"unknown geometry {geometry!r}; allowed: {', '.join(GEOMETRIES)}")
    if kind not in KINDS:
        raise ValueError(f"unknown index kind {kind!r}; allowed: {', '.join(KINDS)}")
    if vectors.ndim != 2 or len(vectors) == 0 or vectors.shape[1] == 0:
        raise ValueError(f"an index needs (N, D) vectors with N, D >= 1; got shape {vectors.shape}")
    if labels.shape != (len(vectors),):
        raise ValueError(f"one label per row: {len(vectors)} rows, labels of shape {labels.shape}")
    if not np.isfinite(vectors).all():
        raise ValueError("the vectors hold NaN or infinite values; an index needs finite ones")


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, 1e-12), dtype=np.float32)


class VectorIndex:
    """Rows (float32) with their labels, searchable by :meth:`search`. Build with
    :meth:`build`; read-only afterwards, and safe to search from several threads."""

    def __init__(self, kind: str, geometry: Geometry, labels: np.ndarray, *, exact: torch.Tensor | None = None,
                 faiss_index: Any = None, ef_search: int | None = None, recall: float | None = None,
                 params: HnswParams | None = None, order: np.ndarray | None = None,
                 class_names: list[str] | None = None) -> None:
        self.kind, self.geometry, self.labels = kind, geometry, labels
        self.class_names = class_names  # of the labels, where they have names
        self._order = order  # the graph's position -> the row's, where they differ
        self.ef_search, self.recall, self.params = ef_search, recall, params
        self._exact = exact
        # Squared norms without a temporary the size of the rows.
        self._norms = (torch.einsum("ij,ij->i", exact, exact)
                       if exact is not None and geometry == "euclidean" else None)
        self._faiss = faiss_index
        self._dim = int(exact.shape[1]) if exact is not None else int(faiss_index.d)
        if faiss_index is not None and ef_search is not None:
            # Set on the index, not passed per call: faiss.contrib.torch_utils (which
            # pytorch-metric-learning imports) replaces search() with one that takes no
            # search parameters. Searching never changes it, so threads may share it.
            faiss_index.hnsw.efSearch = ef_search

    @property
    def n(self) -> int:
        return len(self.labels)

    @property
    def device(self) -> torch.device:
        """Where exact search runs: the rows' device (an HNSW graph searches on the CPU)."""
        return self._exact.device if self._exact is not None else torch.device("cpu")

    def to(self, device: str | torch.device) -> VectorIndex:
        """This index with its exact rows on ``device`` (a GPU searches them there); the
        same object where nothing moves (already there, or an HNSW graph: faiss here is
        its CPU build)."""
        device = torch.device(device)
        if self._exact is None or self._exact.device == device:
            return self
        moved = copy.copy(self)
        moved._exact = self._exact.to(device)
        moved._norms = self._norms.to(device) if self._norms is not None else None
        return moved

    @property
    def dim(self) -> int:
        return self._dim

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def build(cls, vectors: np.ndarray, labels: np.ndarray, geometry: Geometry, kind: str = "exact", *,
              params: HnswParams | None = None, target_recall: float = 0.95, chunk: int = 50_000,
              progress: Callable[[int, int], bool] | None = None, seed: int = 0,
              class_names: list[str] | None = None) -> VectorIndex:
        """Index ``vectors`` (N, D) with ``labels`` (N,) (named by ``class_names``, if given). ``progress(done, total)`` is called
        after each ``chunk`` of rows is added; returning False stops the build
        (:class:`BuildCancelled`)."""
        vectors = np.asarray(vectors)
        labels = np.asarray(labels).reshape(-1).astype(np.int64)
        _check(vectors, labels, geometry, kind)
        if not 0.0 < target_recall <= 1.0:
            raise ValueError(f"target_recall must be in (0, 1]; got {target_recall}")
        x = _unit(vectors) if geometry == "cosine" else np.ascontiguousarray(vectors, dtype=np.float32)
        n = len(x)
        if kind == "exact":
            if progress is not None and not progress(n, n):
                raise BuildCancelled("stopped")
            if not x.flags.writeable:  # rows read from bytes: torch wants memory of its own
                x = x.copy()
            return cls("exact", geometry, labels, exact=torch.from_numpy(x), class_names=class_names)
        params = params or HnswParams()
        faiss = _faiss()
        # The calibration queries are held out (added last, after calibrating): rows
        # already in the graph are found more easily than new inputs are.
        held = (np.random.default_rng(seed).choice(n, size=min(CALIBRATION_ROWS, n // 10), replace=False)
                if n >= 100 else np.zeros(0, np.int64))
        mask = np.ones(n, bool)
        mask[held] = False
        order = np.concatenate([np.flatnonzero(mask), np.sort(held)]).astype(np.int64)
        index = faiss.IndexHNSWFlat(x.shape[1], params.m)
        index.hnsw.efConstruction = params.ef_construction
        done = 0

        def add(rows: np.ndarray) -> None:
            nonlocal done
            for start in range(0, len(rows), chunk):
                index.add(x[rows[start:start + chunk]])
                done += len(rows[start:start + chunk])
                if progress is not None and not progress(done, n):
                    raise BuildCancelled("stopped")

        first = n - len(held)
        add(order[:first])
        ef, recall = (_calibrate(index, x[order[:first]], x[order[first:]], target_recall)
                      if len(held) else (EF_SEARCH_STEPS[-1], None))
        add(order[first:])
        identity = bool((order == np.arange(n)).all())
        return cls("hnsw", geometry, labels, faiss_index=index, ef_search=ef, recall=recall,
                   params=params, order=None if identity else order, class_names=class_names)

    # -- searching --------------------------------------------------------------------------
    def search(self, queries: np.ndarray | torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest rows of each query, nearest first: (distances float32,
        rows int64), each (n_queries, k)."""
        # Lean on purpose: for one query this path's own work is a few microseconds, next
        # to a tenth of a millisecond in faiss (bench/neighbors.py measures the ratio).
        q = queries.detach().cpu().numpy() if isinstance(queries, torch.Tensor) else queries
        if type(q) is not np.ndarray:
            q = np.asarray(q)
        if q.ndim != 2 or q.shape[1] != self._dim:
            raise ValueError(f"queries must be (N, {self._dim}); got shape {q.shape}")
        if not 1 <= k <= len(self.labels):
            raise ValueError(f"k must be between 1 and the {self.n} indexed rows; got {k}")
        if self.geometry == "cosine":
            q = _unit(q)
        elif q.dtype != np.float32 or not q.flags.c_contiguous:
            q = np.ascontiguousarray(q, dtype=np.float32)
        if self._faiss is not None:
            d, rows = self._faiss.search(q, k)
            if self._order is not None:
                rows = self._order.take(rows)
            # Squared distances, summed squares (never negative): halved on unit vectors
            # (1 - cosine), else their roots.
            if self.geometry == "cosine":
                d *= 0.5
            else:
                np.sqrt(d, out=d)
            return d, rows
        return self._search_exact(torch.from_numpy(q), k)

    def _search_exact(self, q: torch.Tensor, k: int, chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
        assert self._exact is not None
        ref = self._exact
        q = q.to(ref.device)
        dists, rows = [], []
        for start in range(0, len(q), chunk):
            part = q[start:start + chunk]
            if self.geometry == "cosine":
                top = torch.topk(1.0 - part @ ref.T, k, dim=1, largest=False, sorted=True)
                dists.append(top.values.clamp_min(0.0))
                rows.append(top.indices)
                continue
            assert self._norms is not None
            # Squared distances up to the query's own norm, enough to rank; the best 2k
            # candidates are measured again directly (no cancellation in small distances).
            wide = torch.topk(self._norms[None, :] - 2.0 * part @ ref.T, min(2 * k, len(ref)),
                              dim=1, largest=False).indices
            exact = (part[:, None, :] - ref[wide]).norm(dim=2)
            order = torch.argsort(exact, dim=1, stable=True)[:, :k]
            dists.append(torch.gather(exact, 1, order))
            rows.append(torch.gather(wide, 1, order))
        return torch.cat(dists).cpu().numpy(), torch.cat(rows).cpu().numpy()

    # -- bytes ------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        header = {"kind": self.kind, "geometry": self.geometry, "n": self.n, "dim": self.dim,
                  "ef_search": self.ef_search, "recall": self.recall, "class_names": self.class_names,
                  "params": None if self.params is None else
                  {"m": self.params.m, "ef_construction": self.params.ef_construction}}
        if self._faiss is not None:
            payload = _faiss().serialize_index(self._faiss).tobytes()
        else:
            assert self._exact is not None
            payload = self._exact.cpu().numpy().tobytes()
        header["ordered"] = self._order is not None
        head = json.dumps(header).encode()
        order = self._order.tobytes() if self._order is not None else b""
        return b"".join((_MAGIC, struct.pack("<Q", len(head)), head, self.labels.tobytes(), order, payload))

    @classmethod
    def from_bytes(cls, blob: bytes | bytearray | memoryview,
                   file: str | os.PathLike[str] | None = None) -> VectorIndex:
        """The index :meth:`to_bytes` wrote. ``file``: a file that holds exactly these bytes
        (an artifact store's, being read), from which faiss reads an approximate index's
        part itself (:func:`_read_faiss_file`)."""
        view = memoryview(blob)
        if bytes(view[:len(_MAGIC)]) != _MAGIC:
            raise ValueError("these bytes are not a corel index")
        at = len(_MAGIC)
        (size,) = struct.unpack("<Q", view[at:at + 8])
        header = json.loads(bytes(view[at + 8:at + 8 + size]))
        at += 8 + size
        n, dim = int(header["n"]), int(header["dim"])
        labels = np.frombuffer(view[at:at + 8 * n], dtype=np.int64).copy()
        at += 8 * n
        order = None
        if header.get("ordered"):
            order = np.frombuffer(view[at:at + 8 * n], dtype=np.int64).copy()
            at += 8 * n
        payload = view[at:]
        params = HnswParams(**header["params"]) if header.get("params") else None
        if header["kind"] == "exact":
            x = np.frombuffer(payload, dtype=np.float32).reshape(n, dim)
            if not x.flags.writeable:  # bytes: copied; a bytearray's memory is used as it is
                x = x.copy()
            return cls("exact", header["geometry"], labels, exact=torch.from_numpy(x),
                       class_names=header.get("class_names"))
        if file is not None:
            if os.stat(file).st_size != len(view):
                raise ValueError(f"{os.fspath(file)} does not hold these {len(view)} bytes")
            index = _read_faiss_file(file, at)
        else:
            index = _read_faiss(payload)
        return cls("hnsw", header["geometry"], labels, faiss_index=index, ef_search=header["ef_search"],
                   recall=header["recall"], params=params, order=order,
                   class_names=header.get("class_names"))

    @property
    def library_index(self) -> Any:
        """The faiss index itself (None for an exact index): what a benchmark calls directly."""
        return self._faiss


def recall_at_k(found_d: np.ndarray, true_d: np.ndarray) -> float:
    """Recall@k by distance: the share of the found neighbours no farther than the true
    k-th nearest (ties between rows at the same distance count as found)."""
    threshold = true_d[:, -1:] * (1 + 1e-4) + 1e-6
    return float((found_d <= threshold).mean())


def _calibrate(index: Any, base: np.ndarray, queries: np.ndarray, target: float) -> tuple[int, float]:
    """The smallest efSearch whose recall@10 for ``queries`` (rows not in the index)
    against exact search over ``base`` (the rows in it) reaches ``target``, else the
    largest tried; and that recall."""
    k = min(K_CALIBRATE, len(base))
    ref = torch.from_numpy(base)
    norms = (ref * ref).sum(1)
    true_d = []
    for start in range(0, len(queries), 64):
        part = torch.from_numpy(queries[start:start + 64])
        d2 = (norms[None, :] - 2.0 * part @ ref.T + (part * part).sum(1, keepdim=True)).clamp_min(0)
        true_d.append(torch.topk(d2, k, dim=1, largest=False, sorted=True).values.numpy())
    exact_d = np.concatenate(true_d)
    recall = 0.0
    for ef in EF_SEARCH_STEPS:
        if ef < k:
            continue
        index.hnsw.efSearch = ef
        found_d, _ = index.search(queries, k)
        recall = recall_at_k(found_d, exact_d)
        if recall >= target:
            return ef, recall
    return EF_SEARCH_STEPS[-1], recall
