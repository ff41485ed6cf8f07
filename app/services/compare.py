"""Side-by-side comparison of experiments, in the layout of the paper's Tables 1 and 3.

One row per experiment: id, loss, lambda, the spec fields that differ across the
compared experiments (only those), the best epoch, the test accuracy, and the
K-Means and GMM scores on the test split in each experiment's own geometry.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.access import policy
from app.core.errors import MAX_ID, Conflict, InvalidInput, NotFound
from app.core.models import Experiment, Status
from app.services.clustering import clustering_report
from corel.clustering import ALGORITHMS
from corel.loss_catalog import declaration

MAX_IDS = 50
IDS_PATTERN = rf"^\s*[1-9][0-9]{{0,8}}\s*(,\s*[1-9][0-9]{{0,8}}\s*){{0,{MAX_IDS - 1}}}$"
"""One ``ids`` value: a comma list of experiment ids (as the schema documents it)."""
SCORES: tuple[str, ...] = ("accuracy", "ari", "v_measure", "silhouette")
FIXED_LEADING = ("id", "loss", "lam")
FIXED_TRAILING = ("best_epoch", "test_accuracy", "metric")


def parse_ids(values: Iterable[str]) -> list[int]:
    """``["1,2", "3"]`` (comma lists, repeated parameters or both) -> ``[1, 2, 3]``; each
    value as :data:`IDS_PATTERN` says (at most MAX_IDS ids a value, MAX_IDS values)."""
    ids: list[int] = []
    values = list(values)
    for value in values:
        if not re.fullmatch(IDS_PATTERN, value):
            parts = [p.strip() for p in value.split(",")]
            bad = next((p for p in parts if not re.fullmatch(r"[1-9][0-9]{0,8}", p)), None)
            if not value.strip():
                raise InvalidInput("give the experiments to compare: ?ids=1,2,3 (or ids=1&ids=2)")
            if bad is not None:
                raise InvalidInput(f"ids must be integers from 1 (a comma list); got {bad!r}")
            raise InvalidInput(f"compare at most {MAX_IDS} experiments in one ids value; "
                               f"got {len(parts)}")
        ids += [int(part) for part in value.split(",")]
    if not ids:
        raise InvalidInput("give the experiments to compare: ?ids=1,2,3 (or ids=1&ids=2)")
    return list(dict.fromkeys(ids))  # an experiment listed twice is shown once


def _shown_spec(exp: Experiment) -> dict[str, Any]:
    """The spec as the table shows it: lambda means nothing to a loss without one (CCE)."""
    spec = dict(exp.spec)
    if "lam" not in declaration(exp.loss).params:
        spec["lam"] = None
    return spec


def compare(session: Session, ids: list[int]) -> dict[str, Any]:
    possible = [i for i in ids if 1 <= i <= MAX_ID]  # others cannot exist (and PG refuses them)
    # Another user's private run is as missing as one that does not exist.
    visible = policy.readable(policy.principal_of(session), Experiment)
    found = {e.id: e for e in session.scalars(
        select(Experiment).where(Experiment.id.in_(possible), visible))}
    missing = [i for i in ids if i not in found]
    if missing:
        raise NotFound(
            f"experiment {missing[0]} does not exist" if len(missing) == 1
            else f"experiments {', '.join(map(str, missing))} do not exist",
            missing=missing,
        )
    for i in ids:
        if found[i].status != Status.SUCCEEDED:
            raise Conflict(
                f"experiment {i} is {found[i].status}; comparing needs succeeded experiments",
                experiment_id=i, status=found[i].status,
            )
    # Reports are computed in id order whatever the requested order, so that two
    # requests storing first results for the same experiments take the same
    # unique-key locks in the same order (and cannot deadlock).
    reports = {i: clustering_report(session, i, split="test") for i in sorted(ids)}

    specs = {i: _shown_spec(found[i]) for i in ids}
    keys = sorted({k for s in specs.values() for k in s})
    differing = [k for k in keys if len({repr(s.get(k)) for s in specs.values()}) > 1]
    extra = [k for k in differing if k not in FIXED_LEADING]
    scores = [f"{a}_{s}" for a in ALGORITHMS for s in SCORES]
    columns = [*FIXED_LEADING, *extra, *FIXED_TRAILING, *scores]

    rows = []
    for i in ids:
        exp, report = found[i], reports[i]
        row: dict[str, Any] = {"id": i, "loss": exp.loss, "lam": specs[i]["lam"]}
        row.update({k: specs[i].get(k) for k in extra})
        row.update({"best_epoch": exp.best_epoch, "test_accuracy": exp.test_accuracy,
                    "metric": report["metric"]})
        for algorithm in ALGORITHMS:
            for score in SCORES:
                row[f"{algorithm}_{score}"] = report["results"][algorithm][score]
        rows.append(row)
    return {"columns": columns, "rows": rows, "differing_fields": differing}


def to_csv(table: dict[str, Any]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=table["columns"], lineterminator="\n")
    writer.writeheader()
    for row in table["rows"]:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()
