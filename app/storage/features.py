"""A frozen encoder's features kept in the artifact store, for every host (issue 70).

:class:`StoredFeatures` is corel's :class:`corel.encoders.kept.FeatureStore` over the service's
store: a name (corel's, of the content: encoder digest, path, inputs' digest) is a
:class:`app.core.models.FeatureSet` row that points at an artifact. A worker passes it to the
engine (``EngineOptions.features_store``): the first run on an encoder and data computes the
features and puts them here; a run on any other host, or in a process with an empty features
folder, reads them and computes none. The rows are artifacts' references like any other
(:data:`app.storage.refs.REFERENCES`); ``corel gc`` drops those unused for
``COREL_FEATURES_KEEP_DAYS``, and their bytes with them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import session_scope
from app.core.models import FeatureSet, utcnow
from app.storage import store_of
from app.storage.store import ArtifactMissing, DigestMismatch

log = logging.getLogger("corel.storage")


class StoredFeatures:
    """Bytes by name in the artifact store of ``factory``'s sessions (``app.storage.attach``)."""

    def __init__(self, factory: sessionmaker[Session],
                 on_read: Callable[[str, int], None] | None = None) -> None:
        self.factory = factory
        self.on_read = on_read
        """Called ``(name, bytes)`` before kept bytes are read (a worker shows it as its runs' phase)."""

    def get(self, name: str) -> bytes | None:
        """The bytes put under ``name`` (marked used now), or None: never put, or their
        artifact gone or corrupt (its bytes not its digest's: logged, and deleted). The row is
        then dropped, and the caller computes them again and puts them anew."""
        with session_scope(self.factory) as session:
            row = session.get(FeatureSet, name)
            if row is None:
                return None
            row.used_at = utcnow()
            digest, size = row.sha256, row.size
        if self.on_read is not None:
            self.on_read(name, size)
        with self.factory() as session:
            store = store_of(session)
            try:
                return store.read_bytes(digest)
            except ArtifactMissing:
                log.warning("kept features lost their artifact", extra={"kept": name, "sha256": digest})
            except DigestMismatch:  # the store logged the mismatch; these bytes go
                log.warning("kept features are corrupt: computed again", extra={"kept": name, "sha256": digest})
                store.delete(digest)
        with session_scope(self.factory) as session:
            session.execute(delete(FeatureSet).where(FeatureSet.name == name, FeatureSet.sha256 == digest))
        return None

    def put(self, name: str, data: bytes) -> None:
        """Keep ``data`` under ``name``: the artifact first, then its row. Another host that
        put the same name first wins (the same content); this copy's artifact, referenced by
        no row, goes at the next ``corel gc``."""
        with self.factory() as session:
            art = store_of(session).put_bytes(data)
        try:
            with session_scope(self.factory) as session:
                if session.get(FeatureSet, name) is None:
                    session.add(FeatureSet(name=name, sha256=art.sha256, size=art.size))
        except IntegrityError:
            pass  # put by another host meanwhile
