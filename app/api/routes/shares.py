"""Sharing: POST /experiments/{id}/shares, /sweeps/{id}/shares, /datasets/{id}/shares and /encoders/{id}/shares
(the owner or an admin), GET of the same (who may read or change the row), and DELETE
.../shares/{share_id} (the owner or an admin) to take one share back."""

from __future__ import annotations

from fastapi import APIRouter

from app.access import policy
from app.api.deps import SessionDep
from app.core.schemas.access import ShareCreate, ShareRead, SharesRead

router = APIRouter(tags=["sharing"])

UNSHARE_SUMMARY = "Take a share back (owner or admin): that user's access ends at once"
SHARE_SUMMARY = "Share with a user (read or write), or make readable by every user (owner or admin)"


def _share(session: SessionDep, kind: str, row_id: int, body: ShareCreate) -> SharesRead:
    policy.share(session, kind, row_id, body.user_id, body.access, body.public)
    return _shares(session, kind, row_id)


def _unshare(session: SessionDep, kind: str, row_id: int, share_id: int) -> SharesRead:
    policy.unshare(session, kind, row_id, share_id)
    return _shares(session, kind, row_id)


def _shares(session: SessionDep, kind: str, row_id: int) -> SharesRead:
    row = policy.require(session, kind, row_id, "read")
    return SharesRead(resource=kind, id=row_id, owner_id=row.owner_id, public=row.public,
                      shares=[ShareRead.model_validate(s)
                              for s in policy.shares_of(session, kind, row_id)])


@router.post("/experiments/{experiment_id:int}/shares", response_model=SharesRead,
             tags=["experiments"], summary=SHARE_SUMMARY)
def share_experiment(experiment_id: int, body: ShareCreate, session: SessionDep):
    return _share(session, "experiment", experiment_id, body)


@router.get("/experiments/{experiment_id:int}/shares", response_model=SharesRead,
            tags=["experiments"], summary="Who may read or change an experiment")
def experiment_shares(experiment_id: int, session: SessionDep):
    return _shares(session, "experiment", experiment_id)


@router.delete("/experiments/{experiment_id:int}/shares/{share_id:int}", response_model=SharesRead,
               tags=["experiments"], summary=UNSHARE_SUMMARY)
def unshare_experiment(experiment_id: int, share_id: int, session: SessionDep):
    return _unshare(session, "experiment", experiment_id, share_id)


@router.post("/sweeps/{sweep_id:int}/shares", response_model=SharesRead, tags=["sweeps"],
             summary=SHARE_SUMMARY)
def share_sweep(sweep_id: int, body: ShareCreate, session: SessionDep):
    return _share(session, "sweep", sweep_id, body)


@router.get("/sweeps/{sweep_id:int}/shares", response_model=SharesRead, tags=["sweeps"],
            summary="Who may read or change a sweep")
def sweep_shares(sweep_id: int, session: SessionDep):
    return _shares(session, "sweep", sweep_id)


@router.delete("/sweeps/{sweep_id:int}/shares/{share_id:int}", response_model=SharesRead,
               tags=["sweeps"], summary=UNSHARE_SUMMARY)
def unshare_sweep(sweep_id: int, share_id: int, session: SessionDep):
    return _unshare(session, "sweep", sweep_id, share_id)


@router.post("/datasets/{dataset_id:int}/shares", response_model=SharesRead, tags=["datasets"],
             summary=SHARE_SUMMARY)
def share_dataset(dataset_id: int, body: ShareCreate, session: SessionDep):
    return _share(session, "dataset", dataset_id, body)


@router.get("/datasets/{dataset_id:int}/shares", response_model=SharesRead, tags=["datasets"],
            summary="Who may read or change an uploaded dataset")
def dataset_shares(dataset_id: int, session: SessionDep):
    return _shares(session, "dataset", dataset_id)


@router.delete("/datasets/{dataset_id:int}/shares/{share_id:int}", response_model=SharesRead,
               tags=["datasets"], summary=UNSHARE_SUMMARY)
def unshare_dataset(dataset_id: int, share_id: int, session: SessionDep):
    return _unshare(session, "dataset", dataset_id, share_id)


@router.post("/encoders/{encoder_id:int}/shares", response_model=SharesRead, tags=["encoders"],
             summary=SHARE_SUMMARY)
def share_encoder(encoder_id: int, body: ShareCreate, session: SessionDep):
    return _share(session, "encoder", encoder_id, body)


@router.get("/encoders/{encoder_id:int}/shares", response_model=SharesRead, tags=["encoders"],
            summary="Who may read or use one of your own encoders")
def encoder_shares(encoder_id: int, session: SessionDep):
    return _shares(session, "encoder", encoder_id)


@router.delete("/encoders/{encoder_id:int}/shares/{share_id:int}", response_model=SharesRead,
               tags=["encoders"], summary=UNSHARE_SUMMARY)
def unshare_encoder(encoder_id: int, share_id: int, session: SessionDep):
    return _unshare(session, "encoder", encoder_id, share_id)
