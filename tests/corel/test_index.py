"""corel.index: the exact index is brute force (float64, by definition), the HNSW index
(faiss) finds what exact search finds on clustered vectors at the recall it measured for
itself, both survive their bytes, and bad input is a ValueError that says what is allowed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from corel.index import BuildCancelled, HnswParams, VectorIndex, recall_at_k


def clustered(n: int, dim: int = 32, seed: int = 0, centres: int = 20) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    c = np.random.default_rng(123).normal(size=(centres, dim)) * 3
    labels = rng.integers(0, centres, n)
    return (c[labels] + rng.normal(size=(n, dim))).astype(np.float32), labels % 10


def brute_force(q: np.ndarray, x: np.ndarray, geometry: str) -> np.ndarray:
    q, x = q.astype(np.float64), x.astype(np.float64)
    if geometry == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        return 1 - q @ x.T
    return np.sqrt(((q[:, None, :] - x[None, :, :]) ** 2).sum(-1))


@pytest.mark.parametrize("geometry", ["euclidean", "cosine"])
def test_exact_index_is_brute_force(geometry):
    x, y = clustered(3000)
    q, _ = clustered(40, seed=1)
    index = VectorIndex.build(x, y, geometry, "exact")
    d, rows = index.search(q, 7)
    want = brute_force(q, x, geometry)
    for i in range(len(q)):
        order = np.argsort(want[i], kind="stable")[:7]
        assert set(rows[i].tolist()) == set(order.tolist())
        np.testing.assert_allclose(d[i], want[i][order], atol=2e-5)
        assert (np.diff(d[i]) >= -1e-6).all()  # nearest first
    # A row's own vector finds itself, at distance 0 (no cancellation in small distances).
    d_self, rows_self = index.search(x[:5], 1)
    assert rows_self[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert float(np.abs(d_self).max()) < 1e-6


@pytest.mark.parametrize("geometry", ["euclidean", "cosine"])
def test_hnsw_reaches_its_measured_recall_against_exact_search(geometry):
    x, y = clustered(20000, dim=48, centres=50)
    q, _ = clustered(300, dim=48, seed=2, centres=50)
    exact = VectorIndex.build(x, y, geometry, "exact")
    hnsw = VectorIndex.build(x, y, geometry, "hnsw", params=HnswParams(m=16, ef_construction=64),
                             target_recall=0.95)
    assert hnsw.kind == "hnsw" and hnsw.ef_search is not None and hnsw.recall is not None
    assert hnsw.recall >= 0.95
    true_d, _ = exact.search(q, 10)
    found_d, found_rows = hnsw.search(q, 10)
    measured = recall_at_k(found_d, true_d)
    # New queries meet the recall measured at build time on held-out rows, within noise.
    assert measured >= 0.93, (measured, hnsw.recall, hnsw.ef_search)
    # Its distances are the true distances of the rows it returns (in the index's geometry).
    want = brute_force(q, x, geometry)
    np.testing.assert_allclose(found_d, np.take_along_axis(want, found_rows, 1), atol=2e-4)
    # Rows keep their positions: each indexed row finds itself first.
    _d_self, rows_self = hnsw.search(x[:50], 1)
    assert (rows_self[:, 0] == np.arange(50)).mean() >= 0.98
    assert hnsw.labels[rows_self[:, 0]].tolist() == y[rows_self[:, 0]].tolist()


@pytest.mark.parametrize("kind", ["exact", "hnsw"])
def test_an_index_survives_its_bytes(kind):
    x, y = clustered(2000)
    q, _ = clustered(20, seed=3)
    index = VectorIndex.build(x, y, "euclidean", kind, class_names=[f"c{i}" for i in range(10)])
    again = VectorIndex.from_bytes(index.to_bytes())
    assert (again.kind, again.geometry, again.n, again.dim) == (kind, "euclidean", 2000, 32)
    assert (again.ef_search, again.recall, again.class_names) == (index.ef_search, index.recall,
                                                                 index.class_names)
    np.testing.assert_array_equal(again.labels, index.labels)
    for a, b in zip(index.search(q, 5), again.search(q, 5), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_graph_read_in_small_pieces_is_the_graph_written_and_a_cut_one_is_refused(monkeypatch):
    """faiss reads an HNSW index's arrays from slices of the stored bytes: in pieces of 1,000
    bytes (every array split across reads) the index read is byte for byte the one written;
    bytes cut short are an error, not a smaller index."""
    import faiss

    import corel.index

    x, y = clustered(2000)
    index = VectorIndex.build(x, y, "cosine", "hnsw")
    blob = index.to_bytes()
    monkeypatch.setattr(corel.index, "READ_PIECE", 1000)
    again = VectorIndex.from_bytes(blob)
    assert np.array_equal(faiss.serialize_index(again.library_index), faiss.serialize_index(index.library_index))
    assert again.to_bytes() == blob
    with pytest.raises(RuntimeError, match="read error"):
        VectorIndex.from_bytes(blob[:-1000])


def test_a_graph_read_from_its_file_is_the_graph_written_and_another_file_is_refused(tmp_path):
    """Given the file that holds the bytes (an artifact store's), faiss reads the graph from
    it itself (past corel's header): the index read is byte for byte the one written; a file
    that does not hold these bytes, or is cut short, is an error, not another index."""
    import faiss

    x, y = clustered(2000)
    index = VectorIndex.build(x, y, "cosine", "hnsw", class_names=[f"c{i}" for i in range(10)])
    blob = index.to_bytes()
    stored = tmp_path / "index"
    stored.write_bytes(blob)
    again = VectorIndex.from_bytes(blob, file=stored)
    assert np.array_equal(faiss.serialize_index(again.library_index), faiss.serialize_index(index.library_index))
    assert again.to_bytes() == blob and again.class_names == index.class_names
    cut = tmp_path / "cut"
    cut.write_bytes(blob[:-1000])
    with pytest.raises(ValueError, match="does not hold these"):
        VectorIndex.from_bytes(blob, file=cut)
    with pytest.raises(RuntimeError):
        VectorIndex.from_bytes(blob[:-1000], file=cut)


def test_a_graph_read_in_place_searches_as_the_one_built_after_its_file_is_gone(tmp_path):
    """An index read from its file keeps its vectors and graph in the file's mapped pages
    (faiss's zero-copy reader), not in copies: the mapping lives as long as faiss's index,
    so it searches as the one built after the file is deleted (a store's gc) and after the
    VectorIndex that read it is gone, holding only its library index."""
    import gc

    x, y = clustered(3000)
    index = VectorIndex.build(x, y, "euclidean", "hnsw")
    stored = tmp_path / "index"
    stored.write_bytes(index.to_bytes())
    again = VectorIndex.from_bytes(stored.read_bytes(), file=stored)
    stored.unlink()
    queries = np.ascontiguousarray(x[:50] + 0.01, dtype=np.float32)
    expected = index.library_index.search(queries, 10)
    assert np.array_equal(again.search(queries, 10)[1], index.search(queries, 10)[1])
    library = again.library_index
    del again
    gc.collect()
    found = library.search(queries, 10)
    assert np.array_equal(found[1], expected[1]) and np.allclose(found[0], expected[0])


def test_progress_reports_every_chunk_and_can_stop_the_build():
    x, y = clustered(1000)
    seen: list[tuple[int, int]] = []
    VectorIndex.build(x, y, "euclidean", "hnsw", chunk=300,
                      progress=lambda done, total: seen.append((done, total)) or True)
    assert seen[-1] == (1000, 1000) and len(seen) >= 4
    assert all(b[0] > a[0] for a, b in itertools.pairwise(seen))
    with pytest.raises(BuildCancelled):
        VectorIndex.build(x, y, "euclidean", "hnsw", chunk=300, progress=lambda done, total: done < 600)


def test_bad_input_is_a_value_error_that_says_what_is_allowed():
    x, y = clustered(200)
    for args, kwargs, words in (
        ((x, y, "manhattan"), {}, "allowed: euclidean, cosine"),
        ((x, y, "euclidean", "ivf"), {}, "allowed: exact, hnsw"),
        ((x[0], y, "euclidean"), {}, "(N, D)"),
        ((x, y[:-1], "euclidean"), {}, "one label per row"),
        ((np.where(np.eye(200, 32) > 0, np.nan, x), y, "euclidean"), {}, "NaN"),
        ((x, y, "euclidean", "hnsw"), {"target_recall": 1.5}, "target_recall"),
    ):
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            VectorIndex.build(*args, **kwargs)
    with pytest.raises(ValueError, match="between 4 and 128"):
        HnswParams(m=2)
    index = VectorIndex.build(x, y, "euclidean")
    with pytest.raises(ValueError, match=r"k must be between 1 and the 200 indexed rows"):
        index.search(x[:1], 201)
    with pytest.raises(ValueError, match=r"queries must be \(N, 32\)"):
        index.search(x[:1, :5], 3)
    with pytest.raises(ValueError, match="not a corel index"):
        VectorIndex.from_bytes(b"nonsense" * 10)


def test_an_exact_index_moves_to_a_device_and_a_graph_stays():
    from corel.index import VectorIndex

    rng = np.random.default_rng(0)
    rows, labels = rng.normal(size=(40, 6)).astype(np.float32), rng.integers(0, 3, 40)
    exact = VectorIndex.build(rows, labels, "euclidean", "exact")
    assert exact.device.type == "cpu" and exact.to("cpu") is exact
    moved = exact.to("meta")  # a device without data: where a GPU would be
    assert moved.device.type == "meta" and exact.device.type == "cpu"
    assert moved is not exact and moved.labels is exact.labels
    graph = VectorIndex.build(rows, labels, "euclidean", "hnsw")
    assert graph.to("meta") is graph and graph.device.type == "cpu"
