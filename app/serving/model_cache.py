"""Trained models, loaded once from their best checkpoint and kept in a bounded LRU."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from sqlalchemy.orm import Session

from app.core.lookup import best_checkpoint, servable_experiment
from app.core.models import Checkpoint, DatasetUpload
from app.core.settings import Settings, get_settings
from app.storage import read as read_artifact
from app.storage.local_copies import files_for_model
from corel.models import Classifier
from corel.serving import ServedModel
from corel.spec import ExperimentSpec
from corel.train import checkpoint_from_bytes

T = TypeVar("T")


@dataclass(frozen=True)
class LoadedModel:
    """An experiment's served model (corel.serving) and which checkpoint it is."""

    experiment_id: int
    served: ServedModel
    checkpoint: dict[str, Any]  # identity: id, epoch, sha256
    # A model trained from an uploaded text table: the column its texts were in, which a
    # CSV of new texts may name too.
    text_column: str | None = None

    @property
    def spec(self) -> ExperimentSpec:
        return self.served.spec

    @property
    def model(self) -> Classifier:
        return self.served.model

    @property
    def class_names(self) -> list[str]:
        return self.served.class_names

    @property
    def preprocessing(self) -> dict[str, Any]:
        return self.served.preprocessing

    @property
    def modality(self) -> str:
        return self.served.modality

    @property
    def dim(self) -> int:
        return self.served.dim

    @property
    def device(self) -> torch.device:
        return self.served.device

    @property
    def similarity(self) -> str:
        return self.served.similarity


def load_from_database(session: Session, experiment_id: int, device: str | None,
                       settings: Settings | None = None) -> LoadedModel:
    exp = servable_experiment(session, experiment_id)
    row = best_checkpoint(session, experiment_id, Checkpoint)
    checkpoint = checkpoint_from_bytes(read_artifact(session, row.sha256))
    # A model on the user's own encoder: its files on this machine first (one copy of each
    # encoder for every model that uses it), given to the model.
    encoder_files = files_for_model(session, settings or get_settings(), json.loads(checkpoint["preprocessing"]))
    upload = session.get(DatasetUpload, exp.dataset_id) if exp.dataset_id is not None else None
    return LoadedModel(
        experiment_id=experiment_id,
        served=ServedModel.from_checkpoint(checkpoint, device, encoder_files),
        checkpoint={"id": row.id, "epoch": row.epoch, "sha256": row.sha256},
        text_column=(upload.summary or {}).get("text_column") if upload is not None else None,
    )


class LoadOnceCache(Generic[T]):
    """LRU of things loaded per key (models by experiment id; indexes), safe to share
    across requests.

    A thing is loaded at most once at a time per experiment: concurrent first requests
    wait for the one load instead of each reading the database.
    ``hits`` counts lookups answered from memory, ``misses`` the loads (for /metrics).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Hashable, T] = OrderedDict()
        self._lock = threading.Lock()
        self._loading: dict[Hashable, threading.Lock] = {}
        self.hits = 0
        self.misses = 0

    def peek(self, experiment_id: Hashable) -> T | None:
        with self._lock:
            item = self._items.get(experiment_id)
            if item is not None:
                self._items.move_to_end(experiment_id)
                self.hits += 1
            return item

    def get(self, experiment_id: Hashable, load: Callable[[], T]) -> T:
        item = self.peek(experiment_id)
        if item is not None:
            return item
        with self._lock:
            gate = self._loading.setdefault(experiment_id, threading.Lock())
        with gate:
            item = self.peek(experiment_id)
            if item is None:
                with self._lock:
                    self.misses += 1
                item = load()
                with self._lock:
                    self._items[experiment_id] = item
                    self._items.move_to_end(experiment_id)
                    while len(self._items) > self.size:
                        self._items.popitem(last=False)
            with self._lock:
                self._loading.pop(experiment_id, None)
        return item

    def invalidate(self, experiment_id: Hashable) -> None:
        with self._lock:
            self._items.pop(experiment_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


ModelCache = LoadOnceCache[LoadedModel]
