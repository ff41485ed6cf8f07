"""What the serving floor reads of the API process's state: a protocol, so that the floor
names the types it needs without importing the API's (app.api.state.AppState has them all,
and is what the routes pass)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from app.core.settings import Settings
    from app.serving.inference import InferenceRunner
    from app.serving.model_cache import LoadOnceCache, ModelCache
    from app.serving.neighbors import Reference


class InferenceObserver(Protocol):
    """Where an answered /embed or /predict batch is counted (the API's metrics)."""

    def observe_inference(self, endpoint: str, inputs: int, seconds: float) -> None: ...


class ServingState(Protocol):
    """The process's settings, its sessions, the served models, the references /neighbors
    searches, the batching runner, and the metrics that count its batches."""

    @property
    def settings(self) -> Settings: ...

    @property
    def sessionmaker(self) -> sessionmaker[Session]: ...

    @property
    def model_cache(self) -> ModelCache: ...

    @property
    def references(self) -> LoadOnceCache[Reference]: ...

    @property
    def inference(self) -> InferenceRunner: ...

    @property
    def metrics(self) -> InferenceObserver: ...
