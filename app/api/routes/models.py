"""/models: models with names, their numbered versions, and who may use them (shares, as on
experiments). /embed and /predict serve a version by name (``"model": "news:3"``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

import app.services.models as models_service
from app.api.deps import AuthDep, QueueDep, ReadSessionDep, SessionDep
from app.api.routes.shares import SHARE_SUMMARY, UNSHARE_SUMMARY, _share, _shares, _unshare
from app.core.errors import MAX_OFFSET
from app.core.models import Promotion
from app.core.schemas.access import ShareCreate, SharesRead
from app.core.schemas.common import Page
from app.core.schemas.models import (
    AliasMoveRead,
    CollectionCreate,
    ModelCreate,
    ModelRead,
    ModelUpdate,
    PromotionCreate,
    PromotionRead,
    VersionCreate,
    VersionRead,
)
from app.jobs.lifecycle import commit_and_send
from app.jobs.queue import BrokerUnavailable

router = APIRouter(prefix="/models", tags=["models"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ModelRead,
             dependencies=[AuthDep], summary="Create a model with a name (its caller owns it)")
def create(body: ModelCreate, session: SessionDep):
    return models_service.create_model(session, body)


@router.get("", response_model=Page[ModelRead], summary="The models you may read, by name")
def list_(session: ReadSessionDep, limit: Annotated[int, Query(ge=1, le=200)] = 50,
          offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0):
    return models_service.list_models(session, limit, offset)


@router.get("/{name}", response_model=ModelRead, summary="A model: its contract and versions")
def get(name: str, session: ReadSessionDep):
    return models_service.get_model(session, name)


@router.patch("/{name}", response_model=ModelRead, dependencies=[AuthDep],
              summary="Change a model's description or evaluation dataset (write access)")
def update(name: str, body: ModelUpdate, session: SessionDep):
    return models_service.update_model(session, name, body)


@router.post("/{name}/versions", status_code=status.HTTP_201_CREATED, response_model=VersionRead,
             dependencies=[AuthDep], summary="Add a version: a servable run of the model's contract "
             "(write access to the model, read access to the run)")
def add_version(name: str, body: VersionCreate, session: SessionDep):
    return models_service.add_version(session, name, body)


@router.post("/{name}/aliases/{alias}", status_code=status.HTTP_202_ACCEPTED, response_model=PromotionRead,
             dependencies=[AuthDep], summary="Promote a version to an alias: gated on a worker, then "
             "flipped if the alias still names expected_version (the only way an alias moves)")
def promote(name: str, alias: str, body: PromotionCreate, session: SessionDep, queue: QueueDep):
    row = models_service.request_promotion(session, name, alias, body)
    answer = models_service.promotion_read(row, name)
    # Committed before sending, as for an experiment: the worker must find the row.
    commit_and_send(session, Promotion, [answer.promotion_id],
                    lambda: queue.enqueue_promotion(answer.promotion_id), "the promotion")
    return answer


@router.post("/{name}/collections", status_code=status.HTTP_202_ACCEPTED, response_model=ModelRead,
             dependencies=[AuthDep], summary="Keep a dataset embedded and indexed by each aliased "
             "version (a promotion builds its candidate's before the flip)")
def add_collection(name: str, body: CollectionCreate, session: SessionDep, queue: QueueDep):
    _, builds = models_service.add_collection(session, name, body)
    session.commit()  # the collection and its builds are durable: the reconciler sends what is not sent
    for build in builds:
        try:
            queue.enqueue_collection(build)
        except BrokerUnavailable:
            break
    return models_service.get_model(session, name)


@router.get("/{name}/promotions", response_model=list[PromotionRead],
            summary="A model's promotions, newest first (of one alias if given)")
def promotions(name: str, session: ReadSessionDep, alias: str | None = None,
               limit: Annotated[int, Query(ge=1, le=200)] = 50):
    return models_service.list_promotions(session, name, alias, limit)


@router.get("/{name}/promotions/{promotion_id:int}", response_model=PromotionRead,
            summary="A promotion: its status and its gate's report")
def promotion(name: str, promotion_id: int, session: ReadSessionDep):
    return models_service.get_promotion(session, name, promotion_id)


@router.get("/{name}/aliases/{alias}/history", response_model=list[AliasMoveRead],
            summary="Every move of an alias: from, to, who, when, the promotion and its gate's summary")
def history(name: str, alias: str, session: ReadSessionDep):
    return models_service.alias_history(session, name, alias)


def _id(session: SessionDep, name: str) -> int:
    return models_service.model_id(session, name)


@router.post("/{name}/shares", response_model=SharesRead, summary=SHARE_SUMMARY)
def share(name: str, body: ShareCreate, session: SessionDep):
    return _share(session, "model", _id(session, name), body)


@router.get("/{name}/shares", response_model=SharesRead, summary="Who may read or change a model")
def shares(name: str, session: SessionDep):
    return _shares(session, "model", _id(session, name))


@router.delete("/{name}/shares/{share_id:int}", response_model=SharesRead, summary=UNSHARE_SUMMARY)
def unshare(name: str, share_id: int, session: SessionDep):
    return _unshare(session, "model", _id(session, name), share_id)



