"""The API process's state, typed: what :func:`app.main.create_app` keeps on ``app.state`` for
the process's lifetime. Read it through :func:`state_of`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.requests import HTTPConnection
from starlette.types import Scope

from app.access.tokens import FailureBudget, UsersExist
from app.api.metrics import ApiMetrics
from app.core.settings import Settings
from app.jobs.events import EventHub
from app.jobs.queue import TaskQueue
from app.serving.inference import InferenceRunner
from app.serving.model_cache import LoadOnceCache, ModelCache
from app.serving.neighbors import Reference


class AppState(State):
    """Set when the app is made (``settings``, ``users_exist``, ``auth_failures``,
    ``metrics``: the middleware reads them before the lifespan starts) or when its lifespan
    starts (the rest). Starlette's ``State`` keeps the values; these are their types."""

    settings: Settings
    users_exist: UsersExist
    auth_failures: FailureBudget
    metrics: ApiMetrics
    engine: Engine
    sessionmaker: sessionmaker[Session]
    queue: TaskQueue
    model_cache: ModelCache
    references: LoadOnceCache[Reference]
    inference: InferenceRunner
    probes: ThreadPoolExecutor
    events: EventHub


def state_of(owner: HTTPConnection | Starlette | Scope) -> AppState:
    """The app's state, from a request (or another connection), the app itself, or an ASGI
    scope (the middleware's)."""
    if isinstance(owner, Starlette):
        app: Any = owner
    elif isinstance(owner, HTTPConnection):
        app = owner.app
    else:
        app = owner["app"]
    state: AppState = app.state
    return state
