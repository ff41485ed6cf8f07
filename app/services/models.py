"""Models with names: a model (POST /models), its numbered versions (each a servable run
whose inputs and classes keep the model's contract), and the name by which /embed and
/predict serve one (``"news:3"``).

Access is the model's own, as for any owned row (app/access/policy.py): creating one makes
its caller its owner; adding a version needs write access to the model and read access to
the run; serving by name needs read access to the model alone (a read share serves).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.access import policy
from app.access.audit import AUDIT_RESOURCE
from app.core.errors import MAX_ID, Conflict, InvalidInput, NotFound
from app.core.lookup import page_of, servable_experiment
from app.core.models import (
    AliasMove,
    CollectionBuild,
    ModelAlias,
    ModelCollection,
    ModelVersion,
    Promotion,
    RegisteredModel,
    Status,
)
from app.core.schemas.common import OwnerRead, Page
from app.core.schemas.models import (
    NAME,
    AliasMoveRead,
    CollectionBuildRead,
    CollectionCreate,
    CollectionRead,
    ModelCreate,
    ModelRead,
    ModelUpdate,
    PromotionCreate,
    PromotionRead,
    VersionCreate,
    VersionRead,
)
from app.services.embedding_jobs import EMBEDDABLE
from app.storage.artifacts import best_checkpoint_bytes
from corel.train import checkpoint_from_bytes


def _by_name(session: Session, name: str, need: policy.Need = "read") -> RegisteredModel:
    """The model named ``name``, if the request's principal may do ``need`` with it: a
    404 naming it when it may not read it (or there is none), a 403 when it may read only."""
    if not NAME.match(name):
        raise NotFound(f"model {name!r} does not exist (names match [a-z0-9][a-z0-9._-]{{0,63}})")
    # The whole row, so that the access check below finds it in the session (no second read).
    found = session.scalar(select(RegisteredModel).where(RegisteredModel.name == name))
    if found is None:
        raise NotFound(f"model {name!r} does not exist")
    row_id = found.id
    try:
        row: RegisteredModel = policy.require(session, "model", row_id, need)
    except policy.Hidden:  # a 404 as for none, audited as a refusal
        raise policy.Hidden(f"model {name!r} does not exist") from None
    except policy.Denied as exc:
        raise policy.Denied(exc.detail.replace(f"model {row_id}", f"model {name!r}")) from None
    if need != "read":
        session.info[AUDIT_RESOURCE] = ("model", row.id)  # the write's audit entry names it
    return row


def model_id(session: Session, name: str) -> int:
    """The id of the model named ``name``, if the request's principal may read it (a 404 by
    name otherwise): what the shares' routes take."""
    return _by_name(session, name).id


def create_model(session: Session, body: ModelCreate) -> ModelRead:
    if session.scalar(select(RegisteredModel.id).where(RegisteredModel.name == body.name)) is not None:
        raise Conflict(f"a model named {body.name!r} already exists; choose another name, or add a "
                       f"version to it (POST /models/{body.name}/versions)")
    if body.eval_dataset_id is not None:
        policy.require(session, "dataset", body.eval_dataset_id, "read")
    row = RegisteredModel(name=body.name, description=body.description,
                          eval_dataset_id=body.eval_dataset_id)
    session.add(row)
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError:  # the same name, created by another request meanwhile
        raise Conflict(f"a model named {body.name!r} already exists; choose another name") from None
    return _read(session, row)


def _inputs_check(session: Session, name: str, model: RegisteredModel, dataset_id: int, what: str) -> Any:
    """The upload ``dataset_id`` (read access), if its kind feeds the model's inputs; a 422
    saying which kinds do."""
    upload = policy.require(session, "dataset", dataset_id, "read")
    if model.contract is None:
        return upload
    modality = {"texts": "text", "images": "image", "arrays": "vector"}[model.contract["inputs"]]
    if modality not in EMBEDDABLE.get(upload.kind, ()):
        raise InvalidInput(f"dataset {dataset_id} is a {upload.kind!r} upload, which cannot feed model "
                           f"{name!r}'s {model.contract['inputs']}; {what} an upload of a kind that does "
                           f"({', '.join(k for k, m in EMBEDDABLE.items() if modality in m)})")
    return upload


def update_model(session: Session, name: str, body: ModelUpdate) -> ModelRead:
    """The fields ``body`` gives (write access): its description, its evaluation upload."""
    model = _by_name(session, name, "write")
    given = body.model_fields_set
    if "eval_dataset_id" in given:
        if body.eval_dataset_id is not None:
            _inputs_check(session, name, model, body.eval_dataset_id, "evaluate on")
        model.eval_dataset_id = body.eval_dataset_id
    if "description" in given:
        model.description = body.description
    session.flush()
    return _read(session, model)


def list_models(session: Session, limit: int, offset: int) -> Page[ModelRead]:
    query = (select(RegisteredModel).where(policy.readable(policy.principal_of(session), RegisteredModel))
             .order_by(RegisteredModel.name))
    rows, total = page_of(session, query, limit, offset)
    return Page(items=[_read(session, r) for r in rows], total=total, limit=limit, offset=offset)


def get_model(session: Session, name: str) -> ModelRead:
    return _read(session, _by_name(session, name))


def contract_of(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """What a run takes and answers, as a model's contract compares it: the input kind
    (texts, images, arrays: what /embed accepts), the raw inputs' shape (an image's
    channels, height and width; a vector's width; none for texts) and the class names."""
    pre = json.loads(checkpoint["preprocessing"])
    modality = pre.get("modality")
    if modality == "text":
        inputs, shape = "texts", None
    elif modality == "image":
        inputs, shape = "images", list(pre.get("pixels", pre)["input_shape"])
    else:
        inputs, shape = "arrays", list(pre["input_shape"])
    return {"inputs": inputs, "shape": shape, "class_names": [str(c) for c in checkpoint["class_names"]]}


def _differences(fixed: dict[str, Any], got: dict[str, Any]) -> list[str]:
    out = []
    if fixed["inputs"] != got["inputs"]:
        out.append(f"it takes {got['inputs']}, the model {fixed['inputs']}")
    elif fixed["shape"] != got["shape"]:
        out.append(f"its inputs are of shape {got['shape']}, the model's {fixed['shape']}")
    if fixed["class_names"] != got["class_names"]:
        missing = [c for c in fixed["class_names"] if c not in got["class_names"]]
        extra = [c for c in got["class_names"] if c not in fixed["class_names"]]
        out.append("its classes differ: " + "; ".join(
            part for part in (f"without {missing}" if missing else "", f"with {extra}" if extra else "",
                              "in another order" if not missing and not extra else "") if part)
            + f" (the model's: {fixed['class_names']})")
    return out


def add_version(session: Session, name: str, body: VersionCreate) -> VersionRead:
    """The model's next version, answered by run ``body.experiment_id``: servable, readable
    by the caller, and of the model's contract (version 1 fixes it)."""
    model = _by_name(session, name, "write")
    policy.require(session, "experiment", body.experiment_id, "read")
    servable_experiment(session, body.experiment_id)
    contract = contract_of(checkpoint_from_bytes(best_checkpoint_bytes(session, body.experiment_id)))
    # One version at a time per model: the row lock orders concurrent additions (PostgreSQL;
    # SQLite writes one transaction at a time anyway).
    session.refresh(model, with_for_update=True)
    if model.contract is None:
        model.contract = contract
    else:
        wrong = _differences(model.contract, contract)
        if wrong:
            raise InvalidInput(f"experiment {body.experiment_id} does not keep model {name!r}'s "
                               f"contract (fixed by version 1): {'; '.join(wrong)}")
    number = (session.scalar(select(func.max(ModelVersion.version))
                             .where(ModelVersion.model_id == model.id)) or 0) + 1
    principal = policy.principal_of(session)
    row = ModelVersion(model_id=model.id, version=number, experiment_id=body.experiment_id,
                       created_by=principal.user_id if principal is not None else None)
    session.add(row)
    session.flush()
    return _version(model, row)


@dataclass(frozen=True)
class Served:
    """What a model reference names: the model, the version and the run that answers."""

    model: str
    version: int
    experiment_id: int


def resolve(session: Session, ref: str) -> Served:
    """``"name:3"`` (version 3) to the run that answers for it, if the request's principal
    may read the model. ``"name@alias"`` is refused with what exists."""
    if "@" in ref:
        name, _, alias = ref.partition("@")
        model = _by_name(session, name)
        at = session.scalar(select(ModelAlias.version).where(ModelAlias.model_id == model.id,
                                                             ModelAlias.name == alias))
        if at is None:
            names = list(session.scalars(select(ModelAlias.name).where(ModelAlias.model_id == model.id)
                                         .order_by(ModelAlias.name)))
            raise NotFound(f"model {name!r} has no alias {alias!r} (its aliases: "
                           f"{', '.join(names) if names else 'none yet; a promotion makes one'})")
        ref = f"{name}:{at}"
    name, sep, number = ref.partition(":")
    if not sep or not number.isdigit():
        raise InvalidInput(f"model: {ref!r} names no version; write \"name:N\" (version N of "
                           "model name)")
    model = _by_name(session, name)
    version = session.scalar(select(ModelVersion).where(ModelVersion.model_id == model.id,
                                                        ModelVersion.version == int(number)))
    if version is None:
        count = session.scalar(select(func.count()).where(ModelVersion.model_id == model.id)) or 0
        raise NotFound(f"model {name!r} has no version {int(number)} (it has "
                       f"{'versions 1 to ' + str(count) if count else 'no versions yet'})")
    return Served(model=name, version=version.version, experiment_id=version.experiment_id)


def versions_of_experiment(session: Session, experiment_id: int) -> list[str]:
    """``name:N`` for each model version the run answers for."""
    rows = session.execute(select(RegisteredModel.name, ModelVersion.version)
                           .join(ModelVersion, ModelVersion.model_id == RegisteredModel.id)
                           .where(ModelVersion.experiment_id == experiment_id)).all()
    return [f"{n}:{v}" for n, v in rows]


def _version(model: RegisteredModel, row: ModelVersion) -> VersionRead:
    return VersionRead(model=model.name, version=row.version, experiment_id=row.experiment_id,
                       created_at=row.created_at, created_by=row.created_by)


def _read(session: Session, model: RegisteredModel) -> ModelRead:
    versions = session.scalars(select(ModelVersion).where(ModelVersion.model_id == model.id)
                               .order_by(ModelVersion.version))
    aliases = list(session.scalars(select(ModelAlias).where(ModelAlias.model_id == model.id)
                                   .order_by(ModelAlias.name)))
    collections = []
    for c in session.scalars(select(ModelCollection).where(ModelCollection.model_id == model.id)
                             .order_by(ModelCollection.id)):
        builds = session.scalars(select(CollectionBuild).where(CollectionBuild.collection_id == c.id)
                                 .order_by(CollectionBuild.version))
        collections.append(CollectionRead(dataset_id=c.dataset_id, builds=[
            CollectionBuildRead(build_id=b.id, version=b.version, status=b.status, embedding_job_id=b.embedding_job_id,
                                index_id=b.index_id, error=b.error) for b in builds]))
    return ModelRead(name=model.name, description=model.description, collections=collections,
                     eval_dataset_id=model.eval_dataset_id, contract=model.contract,
                     versions=[_version(model, v) for v in versions],
                     aliases={a.name: a.version for a in aliases},
                     protected_aliases=[a.name for a in aliases if a.protected], created_at=model.created_at,
                     public=model.public,
                     owner=None if model.owner is None else OwnerRead.model_validate(model.owner))


# --- aliases: moved only by a promotion (worker/promotion.py runs it) ---

def _is_owner(session: Session, model: RegisteredModel) -> bool:
    """The model's owner or an admin (what a protected alias and ``force`` need)."""
    return policy.level_of(session, policy.principal_of(session), "model", model) == "manage"


def request_promotion(session: Session, name: str, alias: str, body: PromotionCreate) -> Promotion:
    """A queued promotion of ``alias`` to ``body.version``, checked now: write access to the
    model, the version, ``expected_version`` against the alias as it is (409), the alias not
    already there (422), a protected alias or ``force`` or ``protected`` only for the owner
    or an admin (403). The gate and the flip run on a worker."""
    model = _by_name(session, name, "write")
    if not NAME.match(alias):
        raise InvalidInput(f"alias {alias!r}: an alias matches [a-z0-9][a-z0-9._-]{{0,63}}")
    if session.scalar(select(ModelVersion.id).where(ModelVersion.model_id == model.id,
                                                    ModelVersion.version == body.version)) is None:
        raise NotFound(f"model {name!r} has no version {body.version}")
    current = session.scalar(select(ModelAlias).where(ModelAlias.model_id == model.id,
                                                      ModelAlias.name == alias))
    now_at = None if current is None else current.version
    if body.expected_version != now_at:
        raise Conflict(f"{name}@{alias} names {'no version (a new alias)' if now_at is None else f'version {now_at}'}"
                       f", not the expected_version {body.expected_version}: read GET /models/{name} and "
                       f"send expected_version {'null' if now_at is None else now_at}")
    if body.version == now_at:
        raise InvalidInput(f"{name}@{alias} already names version {body.version}")
    owner = _is_owner(session, model)
    if current is not None and current.protected and not owner:
        raise policy.Denied(f"{name}@{alias} is protected: only the model's owner or an admin moves it")
    if body.force and not owner:
        raise policy.Denied("force skips the gate: only the model's owner or an admin may use it")
    if body.protected is not None and not owner:
        raise policy.Denied("only the model's owner or an admin marks an alias protected")
    principal = policy.principal_of(session)
    row = Promotion(model_id=model.id, alias=alias, version=body.version,
                    expected_version=body.expected_version, force=body.force, margin=body.margin,
                    protect=body.protected, owner_id=principal.user_id if principal is not None else None)
    session.add(row)
    session.flush()
    return row


def promotion_read(row: Promotion, name: str) -> PromotionRead:
    status = (row.outcome if row.outcome is not None else
              Status.FAILED.value if row.status == Status.FAILED else
              row.phase or ("queued" if row.status == Status.QUEUED else "gating"))
    return PromotionRead(promotion_id=row.id, model=name, alias=row.alias, version=row.version,
                         expected_version=row.expected_version, force=row.force, margin=row.margin,
                         status=status, report=row.report, error=row.error, created_at=row.created_at,
                         finished_at=row.finished_at)


def get_promotion(session: Session, name: str, promotion_id: int) -> PromotionRead:
    model = _by_name(session, name)
    row = session.get(Promotion, promotion_id) if 1 <= promotion_id <= MAX_ID else None
    if row is None or row.model_id != model.id:
        raise NotFound(f"model {name!r} has no promotion {promotion_id}")
    return promotion_read(row, name)


def list_promotions(session: Session, name: str, alias: str | None, limit: int) -> list[PromotionRead]:
    """The model's promotions (of ``alias`` only, if given), newest first."""
    model = _by_name(session, name)
    query = select(Promotion).where(Promotion.model_id == model.id)
    if alias is not None:
        query = query.where(Promotion.alias == alias)
    rows = session.scalars(query.order_by(Promotion.id.desc()).limit(limit))
    return [promotion_read(r, name) for r in rows]


def alias_history(session: Session, name: str, alias: str) -> list[AliasMoveRead]:
    model = _by_name(session, name)
    moves = list(session.scalars(select(AliasMove).where(AliasMove.model_id == model.id, AliasMove.alias == alias)
                                 .order_by(AliasMove.id)))
    if not moves and session.scalar(select(ModelAlias.id).where(ModelAlias.model_id == model.id,
                                                                 ModelAlias.name == alias)) is None:
        raise NotFound(f"model {name!r} has no alias {alias!r}")
    return [AliasMoveRead(alias=m.alias, from_version=m.from_version, to_version=m.to_version,
                          user_id=m.user_id, at=m.at, promotion_id=m.promotion_id, gate=m.gate) for m in moves]


# --- collections: datasets embedded and indexed by each aliased version ---

def add_collection(session: Session, name: str, body: CollectionCreate) -> tuple[ModelCollection, list[int]]:
    """The model's new collection, and the builds (queued) of each version its aliases name
    now: write access to the model, read access to the upload (409 if it is one already)."""
    model = _by_name(session, name, "write")
    if model.contract is None:
        policy.require(session, "dataset", body.dataset_id, "read")
        raise Conflict(f"model {name!r} has no version yet: add one first (its contract says what a "
                       "collection may hold)")
    _inputs_check(session, name, model, body.dataset_id, "add")
    if session.scalar(select(ModelCollection.id).where(ModelCollection.model_id == model.id,
                                                       ModelCollection.dataset_id == body.dataset_id)) is not None:
        raise Conflict(f"dataset {body.dataset_id} is a collection of model {name!r} already")
    collection = ModelCollection(model_id=model.id, dataset_id=body.dataset_id)
    session.add(collection)
    session.flush()
    builds = []
    versions = sorted(set(session.scalars(select(ModelAlias.version).where(ModelAlias.model_id == model.id))))
    for version in versions:
        run = session.scalar(select(ModelVersion.experiment_id).where(
            ModelVersion.model_id == model.id, ModelVersion.version == version))
        build = CollectionBuild(collection_id=collection.id, version=version, experiment_id=run,
                                status=Status.QUEUED, cancel_requested=False, attempts=0)
        session.add(build)
        session.flush()
        builds.append(build.id)
    return collection, builds


@dataclass(frozen=True)
class Searched:
    """What /models/{name}/neighbors searches: the version, its run and its index."""

    version: int
    experiment_id: int
    index_id: int


def collection_index(session: Session, name: str, alias: str, dataset_id: int) -> Searched:
    """The index of collection ``dataset_id`` built by the version ``alias`` names now, read
    in one statement with the alias, so that the version and the index are one state."""
    model = _by_name(session, name)
    row = session.execute(
        select(ModelAlias.version, CollectionBuild.experiment_id, CollectionBuild.index_id, CollectionBuild.status)
        .select_from(ModelAlias)
        .join(ModelCollection, (ModelCollection.model_id == ModelAlias.model_id)
              & (ModelCollection.dataset_id == dataset_id))
        .outerjoin(CollectionBuild, (CollectionBuild.collection_id == ModelCollection.id)
                   & (CollectionBuild.version == ModelAlias.version))
        .where(ModelAlias.model_id == model.id, ModelAlias.name == alias)).first()
    if row is None:
        if session.scalar(select(ModelAlias.id).where(ModelAlias.model_id == model.id, ModelAlias.name == alias)) is None:
            raise NotFound(f"model {name!r} has no alias {alias!r}")
        raise NotFound(f"dataset {dataset_id} is not a collection of model {name!r} "
                       f"(POST /models/{name}/collections adds one)")
    version, run, index_id, status = row
    if index_id is None or status != Status.SUCCEEDED:
        raise Conflict(f"collection {dataset_id} is not indexed by version {version} ({name}@{alias}) yet: "
                       f"its build is {status or 'not made'}")
    return Searched(version=int(version), experiment_id=int(run), index_id=int(index_id))
