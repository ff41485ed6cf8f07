"""Moved: the stacked loop (:func:`fit_group`, :class:`StackedRun`) is in :mod:`corel.train`
(import from there). This module stays for one release so that old imports keep working."""

from __future__ import annotations

from corel.train import GroupCallback, StackedRun, fit_group, group_key, group_specs

__all__ = ["GroupCallback", "StackedRun", "fit_group", "group_key", "group_specs"]
