"""Moved: the training engine is :mod:`corel.train` (import from there). This module stays
for one release so that old imports keep working; ``embed_all`` is now
:func:`corel.train.represent` (:meth:`corel.serving.ServedModel.embed_all` embeds raw inputs)."""

from __future__ import annotations

from corel.train import *  # noqa: F403
from corel.train import __all__ as _moved
from corel.train import represent as embed_all

__all__ = [*_moved, "embed_all"]
