"""The geometries a representation is clustered and searched in, declared once.

``euclidean``: the raw space and its distances (CCE, Center loss, Gaussian-COREL);
``cosine``: the unit-length rows, where only directions count (Cosine-COREL and the losses
that score by cosine). Each loss's own is its declaration's ``geometry``
(:mod:`corel.loss_catalog`); clustering calls it ``metric``, retrieval and the index
``geometry``.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["GEOMETRIES", "Geometry"]

Geometry = Literal["euclidean", "cosine"]
GEOMETRIES: tuple[Geometry, ...] = get_args(Geometry)
