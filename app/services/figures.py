"""Pictures of an experiment (PNG), rendered once and kept in ``figures``.

Drawing uses matplotlib's object API (``Figure`` + ``FigureCanvasAgg``), never
pyplot: pyplot keeps global state that concurrent requests would share.
"""

from __future__ import annotations

import csv
import io
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection
from matplotlib.colors import Colormap
from matplotlib.figure import Figure as MplFigure
from sqlalchemy import Select, select
from sqlalchemy.orm import Session
from threadpoolctl import threadpool_limits

from app.core.errors import Conflict
from app.core.lookup import best_checkpoint, store_once, succeeded_experiment
from app.core.models import FINISHED, Checkpoint, EpochMetric, Experiment, Figure
from app.services.experiments import get_experiment
from app.storage import read, release_after_commit, store_of
from app.storage.artifacts import best_checkpoint_dict, load_latent
from corel.loss_catalog import DECLARATIONS, declaration

DPI = 100
LATENT_SIZE = (800, 600)  # pixels
CURVES_SIZE = (1000, 400)
MAX_POINTS = 5000



def _stored(experiment_id: int, name: str) -> Select[Figure]:
    return select(Figure).where(Figure.experiment_id == experiment_id, Figure.name == name)


def _cached(session: Session, experiment_id: int, name: str) -> bytes | None:
    row = session.scalars(_stored(experiment_id, name)).one_or_none()
    return None if row is None else read(session, row.sha256)


def _keep(session: Session, experiment_id: int, name: str, png: bytes) -> bytes:
    """Keep a rendered figure: the PNG into the artifact store, then its row (once: a
    concurrent first request's row wins, and this one's artifact is released)."""
    art = store_of(session).put_bytes(png)
    kept = store_once(session, Figure(experiment_id=experiment_id, name=name, sha256=art.sha256),
                      _stored(experiment_id, name))
    if kept.sha256 != art.sha256:
        release_after_commit(session, [art.sha256])
    return png


def _new_figure(size: tuple[int, int]) -> MplFigure:
    fig = MplFigure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: MplFigure) -> bytes:
    # No bbox_inches="tight": it would change the pixel size the callers rely on.
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _loss_label(spec: dict[str, Any]) -> str:
    decl = DECLARATIONS.get(spec["loss"])
    return decl.label(spec["lam"]) if decl is not None else str(spec["loss"])


# --------------------------------------------------------------------------- latent space


def latent_png(session: Session, experiment_id: int) -> bytes:
    """PCA of the test latent space by true class, with the class vectors W (Figure 1)."""
    exp = succeeded_experiment(session, experiment_id, "the latent-space picture")
    cached = _cached(session, experiment_id, "latent")
    if cached is not None:
        return cached
    reps, labels = load_latent(session, experiment_id, "test")
    ckpt = best_checkpoint_dict(session, experiment_id)
    W = ckpt["model"]["head.W"].detach().cpu().double().numpy()
    class_names = [str(c) for c in ckpt["class_names"]]
    png = draw_latent(
        reps, labels, W, class_names,
        similarity=declaration(exp.loss).similarity, title=_loss_label(exp.spec),
        test_accuracy=exp.test_accuracy, seed=int(exp.spec["seed"]),
    )
    return _keep(session, experiment_id, "latent", png)


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def pca_2d(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, 2 x dim components, explained-variance ratios) by SVD of the centred rows.

    Each component's sign is fixed (largest loading positive) so that the same
    data always gives the same picture.
    """
    mean = x.mean(axis=0)
    _, s, vt = np.linalg.svd(x - mean, full_matrices=False)
    components = vt[:2].copy()
    for c in components:
        if c[np.argmax(np.abs(c))] < 0:
            c *= -1
    var = s**2
    ratio = var[:2] / var.sum() if var.sum() > 0 else np.zeros(2)
    if components.shape[0] < 2:  # a 1-d space: the second axis is flat
        components = np.vstack([components, np.zeros_like(components)])
        ratio = np.append(ratio, 0.0)
    return mean, components, ratio


def _colours(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap: Colormap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


W_NOTE = {
    "cosine": "rows and W L2-normalised",
    "dot": "each w drawn along its direction at the rows' median norm",
    "gaussian": "",
}


def latent_projection(
    reps: np.ndarray, W: np.ndarray, similarity: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, class vectors, explained-variance ratios) in the picture's two PCA axes.

    How W is drawn follows what the head's similarity makes of it: Gaussian-COREL
    scores distances to W, so W is shown where it lies; cosine scores directions, so
    rows and W are shown on the unit sphere; a dot product (CCE, Center loss) scores
    h . w, which ranks classes by w's direction scaled by its norm, and W trained
    with CCE is often orders of magnitude shorter than h: each w is drawn along its
    direction at the rows' median norm, so that the stars do not sit in one heap at
    the origin.
    """
    projected, w2, ratio, _ = _project(reps, W, similarity)
    return projected, w2, ratio


def _project(
    reps: np.ndarray, W: np.ndarray, similarity: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """:func:`latent_projection`, and the transform it applied to the rows."""
    if similarity not in W_NOTE:
        raise ValueError(f"unknown similarity {similarity!r}; expected one of {sorted(W_NOTE)}")
    x = reps.astype(np.float64)
    w = W.astype(np.float64)
    if similarity == "cosine":  # Cosine-COREL constrains directions only: its sphere
        x, w = _unit_rows(x), _unit_rows(w)
    elif similarity == "dot":
        w = _unit_rows(w) * float(np.median(np.linalg.norm(x, axis=1)))
    mean, components, ratio = pca_2d(x)
    transform = {"normalize": similarity == "cosine", "mean": mean.tolist(),
                 "components": components.tolist()}
    return (x - mean) @ components.T, (w - mean) @ components.T, ratio, transform


LABEL_OFFSET = (6.0, 6.0)  # points, up and right of the star
LABEL_SIZE = 8


def spread_labels(ax: Any, xy: np.ndarray, texts: list[str]) -> list[tuple[float, float]]:
    """Offsets (in points) for labels at data points ``xy`` such that no two labels'
    boxes overlap: each starts up and right of its point and moves up, one line at a
    time, past the boxes already placed (lowest points first)."""
    ax.autoscale_view()
    dpi = ax.figure.dpi
    at = ax.transData.transform(np.asarray(xy, dtype=np.float64)) * 72.0 / dpi  # in points
    line = LABEL_SIZE * 1.3
    placed: list[tuple[float, float, float, float]] = []
    out: list[tuple[float, float]] = [LABEL_OFFSET] * len(texts)
    for i in sorted(range(len(texts)), key=lambda i: (at[i][1], at[i][0])):
        width = 0.62 * LABEL_SIZE * len(texts[i])  # bold sans: about 0.6 em a character
        dx, dy = LABEL_OFFSET
        for _ in range(4 * len(texts) + 1):
            x0, y0 = at[i][0] + dx, at[i][1] + dy
            box = (x0, y0, x0 + width, y0 + line)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3]
                       for b in placed):
                break
            dy += line
        placed.append(box)
        out[i] = (dx, dy)
    return out


def draw_latent(
    reps: np.ndarray,
    labels: np.ndarray,
    W: np.ndarray,
    class_names: list[str],
    *,
    similarity: str,
    title: str,
    test_accuracy: float | None,
    seed: int,
) -> bytes:
    projected, w2, ratio = latent_projection(reps, W, similarity)
    shown = np.arange(len(reps))
    if len(reps) > MAX_POINTS:
        shown = np.sort(np.random.default_rng(seed).choice(len(reps), MAX_POINTS, replace=False))
    points = projected[shown]
    shown_labels = labels[shown]

    k = max(len(class_names), int(labels.max()) + 1, len(w2))
    names = class_names + [str(i) for i in range(len(class_names), k)]
    colours = _colours(k)

    fig = _new_figure(LATENT_SIZE)
    ax = fig.add_subplot()
    for c in range(k):
        sel = shown_labels == c
        if sel.any():
            ax.scatter(points[sel, 0], points[sel, 1], s=4, alpha=0.45, color=colours[c],
                       label=names[c], linewidths=0, rasterized=True)
    ax.scatter(w2[:, 0], w2[:, 1], s=260, marker="*", c=[colours[c] for c in range(len(w2))],
               edgecolors="black", linewidths=1.2, zorder=3, label="class vectors W")
    texts = [f"w: {names[c]}" for c in range(len(w2))]
    for c, ((px, py), (dx, dy)) in enumerate(zip(w2, spread_labels(ax, w2, texts), strict=True)):
        moved = (dx, dy) != LABEL_OFFSET
        ax.annotate(texts[c], (px, py), xytext=(dx, dy), textcoords="offset points",
                    fontsize=LABEL_SIZE, weight="bold", zorder=4,
                    arrowprops={"arrowstyle": "-", "lw": 0.6, "color": "#555"} if moved else None)
    ax.set_xlabel(f"PC 1 ({ratio[0]:.0%} of variance)")
    ax.set_ylabel(f"PC 2 ({ratio[1]:.0%} of variance)")
    accuracy = "n/a" if test_accuracy is None else f"{test_accuracy:.3f}"
    note = f"\n{W_NOTE[similarity]}" if W_NOTE[similarity] else ""
    ax.set_title(f"{title}: test accuracy {accuracy}\nPCA of the test latent space "
                 f"({len(shown)} of {len(reps)} points){note}", fontsize=9)
    legend = ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    for handle in legend.legend_handles:  # legible class dots, a star no bigger than a line
        if isinstance(handle, PathCollection):
            star = handle.get_label() == "class vectors W"
            handle.set_sizes([120 if star else 25])
            handle.set_alpha(1.0)
            if star:
                handle.set_facecolor("white")
    fig.tight_layout()
    return _png(fig)


# --------------------------------------------------------------------------- learning curves


def curves_png(session: Session, experiment_id: int) -> bytes:
    """Per-epoch train loss, and train/validation accuracy, with the best epoch marked.

    Kept once the experiment is finished; drawn fresh while it still runs.
    """
    exp = get_experiment(session, experiment_id)
    finished = exp.status in FINISHED
    if finished:
        cached = _cached(session, experiment_id, "curves")
        if cached is not None:
            return cached
    rows = list(session.scalars(
        select(EpochMetric).where(EpochMetric.experiment_id == experiment_id).order_by(EpochMetric.epoch)
    ))
    if not rows:
        raise Conflict(
            f"experiment {experiment_id} is {exp.status} and has no finished epoch yet; "
            "the curves need at least one",
            status=exp.status,
        )
    png = draw_curves(rows, exp)
    return _keep(session, experiment_id, "curves", png) if finished else png


def draw_curves(rows: list[EpochMetric], exp: Experiment) -> bytes:
    epochs = [r.epoch for r in rows]
    best = exp.best_epoch or max((r.epoch for r in rows if r.is_best), default=None)
    fig = _new_figure(CURVES_SIZE)
    left, right = fig.subplots(1, 2)
    left.plot(epochs, [r.train_loss for r in rows], marker="o", ms=3, color="tab:blue")
    left.set_xlabel("epoch")
    left.set_ylabel("train loss")
    left.set_title("Training loss", fontsize=10)
    right.plot(epochs, [r.train_accuracy for r in rows], marker="o", ms=3, label="train")
    right.plot(epochs, [r.val_accuracy for r in rows], marker="o", ms=3, label="validation")
    right.set_xlabel("epoch")
    right.set_ylabel("accuracy")
    right.set_title("Accuracy", fontsize=10)
    if best is not None:
        at = next((r for r in rows if r.epoch == best), None)
        for ax in (left, right):
            ax.axvline(best, color="grey", linestyle="--", linewidth=1, label=None)
        if at is not None:
            note = f"best epoch {best}"
            if at.test_accuracy is not None:
                note += f" (test {at.test_accuracy:.3f})"
            right.scatter([best], [at.val_accuracy], s=80, marker="*", color="black", zorder=3,
                          label=note)
    for ax in (left, right):
        ax.grid(alpha=0.3)
        if len(epochs) <= 20:
            ax.set_xticks(epochs)
    right.legend(fontsize=8)
    fig.suptitle(f"Experiment {exp.id}: {_loss_label(exp.spec)}, {exp.dataset} "
                 f"({exp.status}, {len(rows)}/{exp.epochs_total} epochs)", fontsize=11)
    fig.tight_layout()
    return _png(fig)


# --------------------------------------------------------------------------- interactive scatter


_SCATTERS: OrderedDict[tuple[int, str, int], dict[str, Any]] = OrderedDict()
_SCATTERS_LOCK = threading.Lock()
SCATTER_CACHE = 32


def latent_scatter(session: Session, experiment_id: int, max_points: int) -> dict[str, Any]:
    """The points of the latent-space picture as data, for an interactive chart.

    The same projection as :func:`latent_png`, plus the transform that takes a new
    representation (from ``/embed``) to the chart's axes: normalise it (cosine only),
    subtract ``mean``, multiply by ``components`` transposed. A succeeded experiment's
    latent space never changes, so the answer is kept (by checkpoint digest) for the
    next page that asks.
    """
    exp = succeeded_experiment(session, experiment_id, "the latent-space scatter")
    digest = best_checkpoint(session, experiment_id, Checkpoint.sha256)
    key = (experiment_id, digest, max_points)
    with _SCATTERS_LOCK:
        if key in _SCATTERS:
            _SCATTERS.move_to_end(key)
            return _SCATTERS[key]
    reps, labels = load_latent(session, experiment_id, "test")
    ckpt = best_checkpoint_dict(session, experiment_id)
    W = ckpt["model"]["head.W"].detach().cpu().double().numpy()
    similarity = declaration(exp.loss).similarity
    # One BLAS thread: the API serves many requests at once on few cores, and a
    # multi-threaded SVD fighting them for the CPU took 10x longer (110 ms against 12).
    with threadpool_limits(1):
        projected, w2, ratio, transform = _project(reps, W, similarity)
    shown = np.arange(len(reps))
    if len(reps) > max_points:
        shown = np.sort(np.random.default_rng(int(exp.spec["seed"])).choice(
            len(reps), max_points, replace=False))
    out = {
        "experiment_id": experiment_id,
        "title": _loss_label(exp.spec),
        "similarity": similarity,
        "class_names": [str(c) for c in ckpt["class_names"]],
        "n_total": len(reps),
        "points": np.round(projected[shown], 5).tolist(),
        "labels": labels[shown].tolist(),
        "class_vectors": np.round(w2, 5).tolist(),
        "class_vectors_note": W_NOTE[similarity],
        "explained_variance": [float(r) for r in ratio],
        "transform": transform,
    }
    with _SCATTERS_LOCK:
        _SCATTERS[key] = out
        while len(_SCATTERS) > SCATTER_CACHE:
            _SCATTERS.popitem(last=False)
    return out


def latent_file(reps: np.ndarray, labels: np.ndarray, fmt: str,
                class_names: list[str] | None = None) -> bytes:
    """Representations and labels in one file: ``npy`` holds a structured array with
    fields ``h`` (dim float32) and ``label``; ``csv`` and ``parquet`` have columns
    ``label, class_name, h0, h1, ...`` (``class_name``: the label in the user's words,
    when ``class_names`` is given)."""
    if fmt == "npy":
        table = np.empty(len(reps), dtype=[("h", np.float32, (reps.shape[1],)), ("label", np.int64)])
        table["h"], table["label"] = reps, labels
        buf = io.BytesIO()
        np.save(buf, table, allow_pickle=False)
        return buf.getvalue()
    named = class_names is not None
    words = ([class_names[k] if 0 <= k < len(class_names) else str(k) for k in labels.tolist()]
             if class_names is not None else [])
    columns = ["label", *(["class_name"] if named else []), *(f"h{i}" for i in range(reps.shape[1]))]
    if fmt == "csv":
        out = io.StringIO()
        out.write(",".join(columns) + "\n")
        body = io.StringIO()
        np.savetxt(body, reps.astype(np.float64), delimiter=",", fmt="%.9g")
        lines = body.getvalue().splitlines()
        cell = io.StringIO()
        quote = csv.writer(cell, lineterminator="")
        for i, line in enumerate(lines):
            out.write(f"{int(labels[i])},")
            if named:
                cell.seek(0)
                cell.truncate()
                quote.writerow([words[i]])
                out.write(cell.getvalue() + ",")
            out.write(line + "\n")
        return out.getvalue().encode()
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        arrays = [pa.array(labels), *([pa.array(words, pa.string())] if named else []),
                  *(pa.array(reps[:, i]) for i in range(reps.shape[1]))]
        buf = io.BytesIO()
        pq.write_table(pa.table(arrays, names=columns), buf)
        return buf.getvalue()
    raise ValueError(f"unknown format {fmt!r}; allowed: npy, csv, parquet")
