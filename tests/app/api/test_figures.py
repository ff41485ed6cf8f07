"""The latent picture's class-vector labels do not overlap, however close the vectors
(they did in latent.png when two class vectors projected near each other)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from app.services.figures import LABEL_SIZE, LATENT_SIZE, _new_figure, spread_labels


@pytest.mark.parametrize("layout", ["one point", "a tight cluster", "apart"])
def test_class_vector_labels_do_not_overlap(layout):
    rng = np.random.default_rng(0)
    spread = {"one point": 0.0, "a tight cluster": 0.01, "apart": 5.0}[layout]
    w2 = rng.normal(size=(10, 2)) * spread
    fig = _new_figure(LATENT_SIZE)
    ax = fig.add_subplot()
    ax.scatter(rng.normal(size=200), rng.normal(size=200), s=4)
    ax.scatter(w2[:, 0], w2[:, 1], s=260, marker="*")
    texts = [f"w: {name}" for name in ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                        "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]]
    offsets = spread_labels(ax, w2, texts)
    notes = [ax.annotate(t, p, xytext=o, textcoords="offset points", fontsize=LABEL_SIZE,
                         weight="bold") for t, p, o in zip(texts, w2, offsets, strict=True)]
    fig.canvas.draw()
    boxes = [n.get_window_extent() for n in notes]  # as matplotlib really drew them
    for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2):
        assert not a.overlaps(b), (texts[i], texts[j], a, b)
    if layout == "apart":  # labels far apart stay where they were
        assert sum(o == (6.0, 6.0) for o in offsets) >= 8
