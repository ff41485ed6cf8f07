"""Admin routes: users, their tokens, and the audit log (app.access.tokens refuses other scopes);
and GET /me, which any caller may ask: who its token says it is."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, status

from app.access import audit as audit_service
from app.access import users as users_service
from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.api.state import state_of
from app.core.errors import MAX_ID, MAX_OFFSET, PAGE_LIMIT, NotFound
from app.core.schemas.access import (
    AuditRead,
    MeRead,
    TokenCreate,
    TokenCreated,
    TokenRead,
    UserCreate,
    UserRead,
)
from app.core.schemas.common import Page

router = APIRouter(tags=["users"])


@router.get("/me", response_model=MeRead, summary="Who the caller is: its user, name, scope and "
            "whether it is an admin")
def me(principal: PrincipalDep) -> MeRead:
    return MeRead(user_id=principal.user_id, name=principal.name, scope=principal.scope,
                  admin=principal.admin)


@router.get("/me/tokens", response_model=list[TokenRead],
            summary="The caller's own tokens, newest first (never the tokens themselves)")
def my_tokens(principal: PrincipalDep, session: SessionDep):
    if principal.user_id is None:  # the open mode, the bootstrap admin: no tokens of its own
        return []
    return users_service.list_tokens(session, principal.user_id)


@router.delete("/me/tokens/{token_id:int}", response_model=TokenRead,
               summary="Revoke one of the caller's own tokens: it fails from the next request on")
def revoke_my_token(token_id: int, principal: PrincipalDep, session: SessionDep):
    if principal.user_id is None:
        raise NotFound(f"token {token_id} is not one of yours: the {principal.name} has no tokens "
                       "of its own (an admin revokes any with DELETE /tokens/{token_id})")
    return users_service.revoke_token(session, token_id, user_id=principal.user_id)


@router.post("/users", status_code=status.HTTP_201_CREATED, response_model=UserRead,
             summary="Add a user (admin)")
def create_user(body: UserCreate, session: SessionDep, request: Request):
    user = users_service.create_user(session, body.name, body.admin)
    state_of(request).users_exist.seen()  # the open mode ends with the first user
    return user


@router.get("/users", response_model=list[UserRead], summary="Every user (admin)")
def list_users(session: SessionDep):
    return users_service.list_users(session)


@router.post("/users/{user_id:int}/tokens", status_code=status.HTTP_201_CREATED,
             response_model=TokenCreated,
             summary="A new token for a user (admin); the answer is the only place it is shown")
def create_token(user_id: int, body: TokenCreate, session: SessionDep):
    row, token = users_service.create_token(session, user_id, body.scope, body.expires_days,
                                            body.name)
    return TokenCreated.model_validate({**TokenRead.model_validate(row).model_dump(), "token": token})


@router.get("/users/{user_id:int}/tokens", response_model=list[TokenRead],
            summary="A user's tokens, newest first (admin; never the tokens themselves)")
def list_tokens(user_id: int, session: SessionDep):
    return users_service.list_tokens(session, user_id)


@router.delete("/tokens/{token_id:int}", response_model=TokenRead,
               summary="Revoke a token (admin): it fails from the next request on")
def revoke_token(token_id: int, session: SessionDep):
    return users_service.revoke_token(session, token_id)


@router.get("/audit", response_model=Page[AuditRead], summary="The audit log, newest first (admin)")
def audit(
    session: SessionDep,
    settings: SettingsDep,
    user_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    action: Annotated[str | None, Query(max_length=160,
                                        description="entries whose action contains this")] = None,
    resource: Annotated[str | None, Query(max_length=32)] = None,
    resource_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    limit: Annotated[int, Query(ge=1, description=PAGE_LIMIT)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
):
    limit = min(limit, settings.page_size_limit)
    rows, total = audit_service.page(session, user_id=user_id, action=action, resource=resource,
                                     resource_id=resource_id, limit=limit, offset=offset)
    return Page[AuditRead](items=[AuditRead.model_validate(r) for r in rows], total=total,
                           limit=limit, offset=offset)
