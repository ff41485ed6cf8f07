"""Sweeps: a grid of experiments created in one request, queued across workers,
and summarised in the paper's tables."""

from __future__ import annotations

import itertools
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

import app.services.experiments as experiments_service
from app.access import policy
from app.core.errors import Conflict, InvalidInput, describe_errors
from app.core.lookup import get_or_404, page_of
from app.core.models import FINISHED, STATUSES, Experiment, Status, Sweep, utcnow
from app.core.schemas.experiments import ExperimentCreate
from app.core.schemas.sweeps import SweepCreate
from app.core.settings import Settings
from app.services import builtin
from app.services.clustering import clustering_report
from app.services.retrieval import retrieval_report
from app.storage.local_copies import materialise_upload
from corel import report
from corel.loss_catalog import DECLARATIONS, declaration
from corel.spec import ExperimentSpec, FewShotDraw
from corel.train import group_specs


# The loss parameters each loss uses; the others are collapsed in a grid (a CCE run
# does not differ across lambdas, so it is trained once per seed, not once per lambda).
def loss_params() -> tuple[str, ...]:
    """Every parameter some declared loss reads."""
    return tuple(dict.fromkeys(p for d in DECLARATIONS.values() for p in d.grid_params))


def losses_of(base: dict[str, Any], grid: dict[str, Any]) -> list[str]:
    """The losses a sweep's members train: the grid's, else the base's, else the spec's default."""
    if grid.get("loss"):
        return list(dict.fromkeys(grid["loss"]))
    return [base.get("loss") or ExperimentCreate.model_fields["loss"].default]


def expand(body: SweepCreate, limit: int) -> list[ExperimentCreate]:
    """Every combination of the grid applied to the base, without duplicates."""
    keys = list(body.grid)
    size = 1
    for values in body.grid.values():
        size *= len(values)
    if size > limit:
        raise InvalidInput(f"the grid has {size} combinations; the limit is {limit} per sweep")
    try:  # the base on its own too, as the schema says (a field the grid overrides included)
        ExperimentCreate.model_validate(body.base)
    except ValidationError as exc:
        raise InvalidInput("base is not a valid spec: "
                           + describe_errors(exc.errors(), whole="spec")) from exc
    members: list[ExperimentCreate] = []
    seen: set[str] = set()
    for combo in itertools.product(*(body.grid[k] for k in keys)):
        data = {**body.base, **dict(zip(keys, combo, strict=True))}
        if body.lam_by_loss and data.get("loss") in body.lam_by_loss:
            data["lam"] = body.lam_by_loss[data["loss"]]
        try:
            spec = ExperimentCreate.model_validate(data)
        except ValidationError as exc:
            where = ", ".join(f"{k}={v!r}" for k, v in zip(keys, combo, strict=True))
            msg = describe_errors(exc.errors(), whole="spec")
            raise InvalidInput(f"the member with {where} is not a valid spec: {msg}") from exc
        unused = {p: ExperimentCreate.model_fields[p].default for p in loss_params()
                  if p not in declaration(spec.loss).grid_params}
        spec = spec.model_copy(update=unused)
        key = spec.model_dump_json()
        if key not in seen:
            seen.add(key)
            members.append(spec)
    return members


FULL_BATCH = 65_536
"""A few-shot member's batch size: every shot in one batch (the spec's largest batch)."""


def fewshot_members(body: SweepCreate, grid: list[ExperimentCreate], limit: int) -> list[ExperimentCreate]:
    """A few-shot sweep's members: each of the grid's for each N and each draw, as the
    protocol sets them (corel.fewshot.HeadSettings: full batch, its learning rate, steps and
    penalty on the class vectors; the draw; the draw's seed, as corel.fewshot.run_fewshot
    seeds it)."""
    from corel.fewshot import HeadSettings

    assert body.fewshot is not None
    protocol, head = body.fewshot, HeadSettings()
    size = len(grid) * len(protocol.shots) * protocol.splits
    if size > limit:
        raise InvalidInput(f"the few-shot sweep has {size} members ({len(grid)} from the grid x "
                           f"{len(protocol.shots)} shots x {protocol.splits} splits); the limit is {limit} per sweep")
    out = []
    for spec in grid:
        for n in protocol.shots:
            for k in range(protocol.splits):
                member = spec.model_copy(update={
                    "epochs": head.steps, "lr": head.lr, "batch_size": FULL_BATCH, "seed": protocol.seed * 1000 + k,
                    "fewshot": FewShotDraw(shots=n, split=k, seed=protocol.seed, unlabeled=protocol.unlabeled,
                                           l2=head.l2)})
                try:
                    member.to_spec()  # the library's checks of a member (a fine-tuned encoder, ...)
                except ValidationError as exc:
                    raise InvalidInput("fewshot: " + describe_errors(exc.errors(), whole="spec")) from exc
                out.append(member)
    return out


def check_fewshot(session: Session, settings: Settings, body: SweepCreate, member: ExperimentCreate) -> None:
    """A 422 for a few-shot protocol its dataset cannot give (an N larger than some class's
    pool, naming the class and its size; one class), read from the dataset's labels alone
    (corel.fewshot.protocol_labels). A built-in dataset not on this server yet is checked by
    the worker that downloads it (its members fail with the same message)."""
    from corel.data.base import DatasetNotFoundError
    from corel.fewshot import draw_splits, protocol_labels

    assert body.fewshot is not None
    data = member.model_dump(exclude={"dataset_id", "encoder_id"})
    data.update(encoder=None, encoder_mode=None, encoder_path=None, fewshot=None, precision="auto")
    if member.dataset_id is not None:
        data["dataset_path"] = str(materialise_upload(session, member.dataset_id, settings))
    elif builtin.needs_download(settings, member.dataset):
        return
    try:
        labels, names = protocol_labels(ExperimentSpec.model_validate(data),
                                        builtin.data_dir_for(settings, member.dataset))
    except DatasetNotFoundError:
        return
    except ValueError as exc:
        raise InvalidInput(f"fewshot: the dataset's labels cannot be read: {exc}") from exc
    try:
        draw_splits(labels, body.fewshot.shots, body.fewshot.splits, body.fewshot.seed, names)
    except ValueError as exc:
        raise InvalidInput(f"fewshot: {exc}") from exc


def create_sweep(session: Session, body: SweepCreate, limit: int,
                 group_limit: int, settings: Settings | None = None) -> tuple[Sweep, list[list[int]]]:
    """Rows for the sweep and its members; returns the id groups to queue together."""
    members = expand(body, limit)
    if body.fewshot is not None:
        members = fewshot_members(body, members, limit)
    if body.vectorize:
        groups = group_specs([m.to_spec() for m in members], group_limit)
    else:
        groups = [[i] for i in range(len(members))]
    prune = None if body.prune is None else _check_prune(body, members, groups)
    sweep = Sweep(base=body.base, grid=body.grid, lam_by_loss=body.lam_by_loss, size=len(members),
                  vectorize=body.vectorize, prune=prune, created_at=utcnow(),
                  fewshot=body.fewshot.model_dump() if body.fewshot is not None else None)
    session.add(sweep)
    session.flush()
    experiments = [experiments_service.create_experiment(session, m) for m in members]
    for exp in experiments:
        exp.sweep_id = sweep.id
    session.flush()
    if body.fewshot is not None and settings is not None:  # the data the caller may read, checked
        check_fewshot(session, settings, body, members[0])
    sweep.member_groups = [[experiments[i].id for i in group] for group in groups]
    return sweep, sweep.member_groups


def _check_prune(body: SweepCreate, members: list[ExperimentCreate], groups: list[list[int]]) -> dict[str, Any]:
    """The sweep's pruning, checked against its groups (a 422 that says what is allowed):
    it prunes inside stacked groups, so it needs vectorize and groups of 2 or more."""
    from corel.train import Prune

    assert body.prune is not None
    if not body.vectorize:
        raise InvalidInput("prune needs vectorize: true: members are pruned inside a stacked group "
                           "(pruning across separately trained runs is not offered)")
    alone = [i for group in groups if len(group) < 2 for i in group]
    if alone:
        why = ("the sweep has one member" if len(members) == 1 else
               f"{len(alone)} of its {len(members)} members train alone (a grid over fields that "
               "cannot stack, such as the triplet miner or the model; a "
               "fine-tuned encoder; a registered loss declared not stackable)")
        raise InvalidInput(f"prune needs stacked groups of at least 2 members to judge; {why}")
    fields = body.prune.model_dump()
    try:
        for group in groups:
            checked = Prune.of(fields, members[group[0]].to_spec().epochs, len(group))
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc
    return {"metric": list(checked.metric), "eta": checked.eta, "min_epochs": checked.min_epochs}


def get_sweep(session: Session, sweep_id: int) -> Sweep:
    return get_or_404(session, Sweep, sweep_id, "sweep")


def member_ids(session: Session, sweep_id: int) -> list[int]:
    """The ids of the sweep's experiments, in order."""
    return list(session.scalars(
        select(Experiment.id).where(Experiment.sweep_id == sweep_id).order_by(Experiment.id)))


def builtin_datasets(session: Session, sweep_id: int) -> set[str]:
    """The datasets the sweep's members read from the server's own files (not uploads)."""
    return {dataset for dataset, _ in builtin_subsets(session, sweep_id)}


def builtin_subsets(session: Session, sweep_id: int) -> set[tuple[str, int | None]]:
    """(dataset, train_subset) of the sweep's members that read the server's own files."""
    rows = session.execute(select(Experiment.dataset, Experiment.spec).where(
        Experiment.sweep_id == sweep_id, Experiment.dataset_id.is_(None)))
    return {(dataset, spec.get("train_subset")) for dataset, spec in rows}


def members(session: Session, sweep_id: int) -> list[Experiment]:
    return list(session.scalars(
        select(Experiment).where(Experiment.sweep_id == sweep_id).order_by(Experiment.id)
    ))


def progress(session: Session, sweep: Sweep) -> dict[str, Any]:
    counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
    rows = session.execute(
        select(Experiment.status, func.count()).where(Experiment.sweep_id == sweep.id)
        .group_by(Experiment.status)
    ).all()
    for status, n in rows:
        counts[status] = int(n)
    done = sum(counts[s] for s in FINISHED)
    ids = member_ids(session, sweep.id)
    return {"id": sweep.id, "base": sweep.base, "grid": sweep.grid,
            "losses": losses_of(sweep.base, sweep.grid), "lam_by_loss": sweep.lam_by_loss, "size": sweep.size,
            "vectorize": sweep.vectorize, "prune": sweep.prune, "fewshot": sweep.fewshot, "counts": counts, "done": done,
            "finished": done == sweep.size, "experiment_ids": ids, "member_groups": sweep.member_groups,
            "created_at": sweep.created_at,
            "owner": sweep.owner}


def list_sweeps(session: Session, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
    """A page of sweeps, newest first, each with its members' counts by status: two
    queries for the page, whatever its length."""
    visible = policy.readable(policy.principal_of(session), Sweep)
    sweeps, total = page_of(session, select(Sweep).where(visible).order_by(Sweep.id.desc()), limit, offset)
    counts: dict[int, dict[str, int]] = {s.id: dict.fromkeys(STATUSES, 0) for s in sweeps}
    if sweeps:
        for sweep_id, status, n in session.execute(
            select(Experiment.sweep_id, Experiment.status, func.count())
            .where(Experiment.sweep_id.in_(list(counts))).group_by(Experiment.sweep_id, Experiment.status)
        ):
            if sweep_id is not None:
                counts[sweep_id][status] = int(n)
    items = []
    for sweep in sweeps:
        c = counts[sweep.id]
        done = sum(c[s] for s in FINISHED)
        items.append({"id": sweep.id, "base": sweep.base, "grid": sweep.grid,
                      "losses": losses_of(sweep.base, sweep.grid), "lam_by_loss": sweep.lam_by_loss, "size": sweep.size, "counts": c,
                      "done": done, "finished": done == sweep.size, "created_at": sweep.created_at,
                      "owner": sweep.owner})
    return items, total


def cancel_sweep(session: Session, sweep_id: int) -> Sweep:
    sweep = get_sweep(session, sweep_id)
    for exp in members(session, sweep_id):
        if exp.status not in FINISHED:
            experiments_service.cancel_experiment(session, exp.id)
    return sweep


def _variant(loss: str, spec: dict[str, Any]) -> str:
    """The loss as the report's rows name it: with the options its spec sets, so that a grid
    over ArcFace's scale gives one row per scale ("arcface (scale=16)"), as lambdas do."""
    decl = DECLARATIONS.get(loss)
    set_ = [f"{o.field}={spec[o.field]:g}" if isinstance(spec[o.field], float) else f"{o.field}={spec[o.field]}"
            for o in (decl.options if decl else ()) if spec.get(o.field) is not None]
    return f"{loss} ({', '.join(set_)})" if set_ else loss


def _record(exp: Experiment) -> dict[str, Any]:
    return {
        "experiment_id": exp.id,
        "loss": _variant(exp.loss, exp.spec),
        "lam": exp.spec.get("lam") if "lam" in declaration(exp.loss).params else None,
        "seed": int(exp.spec.get("seed", 0)),
        "val_accuracy": exp.best_val_accuracy,
        "test_accuracy": exp.test_accuracy,
    }


def build_report(session: Session, sweep_id: int, *, clustering: bool = True) -> dict[str, Any]:
    sweep = get_sweep(session, sweep_id)
    exps = members(session, sweep_id)
    clustering = clustering and sweep.fewshot is None  # a few-shot sweep's figures are its own
    done = [e for e in exps if e.status == Status.SUCCEEDED]
    records = [_record(e) for e in done]
    tuning = report.lambda_tuning(records)
    table1 = report.test_accuracy_table(records, tuning)
    if clustering:
        tuned_ids = {r["experiment_id"] for r in records
                     if r["loss"] in tuning and r["lam"] == tuning[r["loss"]]["tuned_lambda"]}
        for r in records:
            if r["experiment_id"] in tuned_ids:
                r["clustering"] = clustering_report(session, r["experiment_id"])["results"]
                try:
                    r["map_at_r"] = retrieval_report(session, r["experiment_id"])[
                        "mean_average_precision_at_r"]
                except Conflict:  # trained before the training split was stored: no MAP@R
                    r["map_at_r"] = None
    base = sweep.base
    setting = (str(base.get("dataset")), str(base.get("model", "ffnn")))
    return {
        "sweep_id": sweep.id,
        "dataset": base.get("dataset"),
        "model": base.get("model", "ffnn"),
        "size": sweep.size,
        "succeeded": len(done),
        "not_succeeded": {s: sum(e.status == s for e in exps) for s in STATUSES if s != Status.SUCCEEDED},
        "lambda_tuning": tuning,
        "test_accuracy": table1,
        # Each row with the paper's scores (Tables 3-4) where the paper has this setting.
        "clustering": report.clustering_table(records, tuning, report.PAPER_CLUSTERING.get(setting))
        if clustering else [],
        "retrieval": report.retrieval_table(records, tuning) if clustering else None,
        # The paper's Table 1 row (test accuracy %, by loss), where the paper has one.
        "paper_table1": report.PAPER_TABLE1.get(setting),
        "pruning": _pruning(sweep, exps),
        "fewshot": fewshot_report(sweep, exps),
    }


def _pruning(sweep: Sweep, exps: list[Experiment]) -> dict[str, Any] | None:
    """A pruned sweep's rungs (members judged, members kept) and each pruned member with its
    rung and why; None for a sweep that does not prune."""
    if sweep.prune is None:
        return None
    gone = sorted(((e, e.pruned) for e in exps if e.status == Status.PRUNED and e.pruned),
                  key=lambda pair: (pair[1]["rung"], pair[0].id))
    rungs = []
    alive = len(exps)
    for rung in sorted({why["rung"] for _, why in gone}):
        left = sum(why["rung"] == rung for _, why in gone)
        rungs.append({"epoch": rung, "members": alive, "kept": alive - left})
        alive -= left
    return {"prune": sweep.prune, "rungs": rungs,
            "pruned": [{**_record(e), "rung": why["rung"], "reason": why["reason"]} for e, why in gone]}


def _method(exp: Experiment, grid: dict[str, Any]) -> str:
    """A few-shot member's method as the report names it: its loss (with the options its spec
    sets), and its lambda where the grid tries several."""
    name = _variant(exp.loss, exp.spec)
    if "lam" in grid and "lam" in declaration(exp.loss).params:
        name += f" (lam={exp.spec.get('lam'):g})"
    return name


def fewshot_report(sweep: Sweep, exps: list[Experiment]) -> dict[str, Any] | None:
    """A few-shot sweep's figures (corel.fewshot.FewShotReport.summary) from its succeeded
    members: per N and method the mean, sd, min and max test accuracy over the draws, the
    training seconds, and the paired difference against the best method with its t-test's
    p-value. Only the draws every method of that N has finished are compared (``draws``
    says how many of ``splits``); ``l2``: the members' penalty on their class vectors. None
    for a sweep that is not few-shot."""
    from corel.fewshot import FewShotReport, FewShotResult

    if sweep.fewshot is None:
        return None
    results = [FewShotResult(method=_method(e, sweep.grid), shots=int(e.spec["fewshot"]["shots"]),
                             split=int(e.spec["fewshot"]["split"]), accuracy=float(e.test_accuracy),
                             seconds=float(e.train_seconds or 0.0))
               for e in exps if e.status == Status.SUCCEEDED and e.test_accuracy is not None
               and e.spec.get("fewshot")]
    methods = list(dict.fromkeys(_method(e, sweep.grid) for e in exps))
    draws: dict[int, int] = {}
    kept: list[FewShotResult] = []
    for n in sweep.fewshot["shots"]:
        done = [{r.split for r in results if r.shots == n and r.method == m} for m in methods]
        complete = sorted(set.intersection(*done)) if done else []
        draws[n] = len(complete)
        kept += [r for r in results if r.shots == n and r.split in complete]
    summary = FewShotReport(kept, evaluation_rows=0).summary() if kept else []
    # The members' penalty on their class vectors (corel.fewshot.HeadSettings.l2; 0 for a sweep
    # made before there was one, whose members carry none).
    l2 = next((float(e.spec["fewshot"].get("l2", 0.0)) for e in exps if e.spec.get("fewshot")), 0.0)
    return {"shots": sweep.fewshot["shots"], "splits": sweep.fewshot["splits"], "seed": sweep.fewshot["seed"],
            "unlabeled": bool(sweep.fewshot.get("unlabeled", False)), "l2": l2, "methods": methods,
            "draws": {str(n): k for n, k in draws.items()}, "summary": summary}

