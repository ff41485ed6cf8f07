"""Engine, sessions and the declarative base (typed SQLAlchemy 2.0)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy.exc
from sqlalchemy import MetaData, create_engine, event, make_url, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from app.core import timing

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


# Database errors that mean "not now" rather than "not this": the API answers 503, a
# worker waits and tries again.
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (
    sqlalchemy.exc.OperationalError,  # connection refused/closed, admin shutdown, locked
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.DisconnectionError,
    sqlalchemy.exc.TimeoutError,  # no pooled connection in time; a ping not answered
)


class Watchdog:
    """Cuts the socket of a PostgreSQL connection that does not answer in time.

    A database that is frozen (SIGSTOP, a stalled VM) or a network that drops packets
    keeps the TCP connection open and never answers; no driver timeout fires, and a
    request would wait as long as the database does. Armed around each statement,
    commit and ping, the watchdog shuts the socket down when its deadline passes, so
    the waiting call fails at once with a connection error (a 503 in the API).

    One thread keeps every deadline: arming and disarming only touch a dict under a
    lock (a timer thread per statement would cost ~0.1 ms each).
    """

    def __init__(self) -> None:
        self._deadlines: dict[int, tuple[float, Any]] = {}
        self._fired: set[int] = set()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        # After a ping went unanswered, new connections are not tried for a moment: their
        # handshake would hang for the whole connect timeout (at least 2 s in libpq).
        self.unanswered_until = 0.0

    def arm(self, dbapi_connection: Any, seconds: float) -> None:
        with self._changed:
            key = id(dbapi_connection)
            self._fired.discard(key)
            self._deadlines[key] = (time.monotonic() + seconds, dbapi_connection)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="corel-db-watchdog",
                                                daemon=True)
                self._thread.start()
            self._changed.notify()

    def disarm(self, dbapi_connection: Any) -> bool:
        """Stop the clock; True if it had already run out (the socket was cut)."""
        with self._changed:
            key = id(dbapi_connection)
            if self._deadlines.pop(key, None) is not None:
                # The watcher may be asleep until this deadline: wake it, so that with
                # nothing left to watch it ends after IDLE_SECONDS, not at the old deadline.
                self._changed.notify()
            if key in self._fired:
                self._fired.discard(key)
                return True
            return False

    IDLE_SECONDS = 30.0
    """How long the thread waits with no deadline before it ends (the next ``arm`` starts
    another): one thread per engine forever outlived its engine's disposal."""

    def _watch(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                due = [(k, c) for k, (at, c) in self._deadlines.items() if at <= now]
                for key, _ in due:
                    del self._deadlines[key]
                    self._fired.add(key)
                if not due:
                    nearest = min((at for at, _ in self._deadlines.values()), default=None)
                    if nearest is None:
                        self._changed.wait(self.IDLE_SECONDS)
                        if not self._deadlines:
                            self._thread = None  # under the lock: arm() starts a new one
                            return
                        continue
                    self._changed.wait(nearest - now)
                    continue
            for _, connection in due:
                _shut_down(connection)


def _shut_down(dbapi_connection: Any) -> None:
    try:
        fd = dbapi_connection.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, AttributeError, ValueError):
        pass  # already closed


def _payload_bytes(parameters: Any) -> int:
    values = parameters.values() if isinstance(parameters, dict) else (parameters or ())
    if isinstance(parameters, list):  # executemany
        return sum(_payload_bytes(p) for p in parameters)
    return sum(len(v) for v in values if isinstance(v, bytes | bytearray | memoryview | str))


def _watch(engine: Engine, ping_timeout: float, statement_timeout: float) -> None:
    """Ping on checkout and time every statement, commit and rollback with a Watchdog."""
    watchdog = Watchdog()

    @event.listens_for(engine.pool, "checkout")
    def _ping(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        watchdog.arm(dbapi_connection, ping_timeout)
        try:
            # Outside any transaction: the ping leaves none open, so that a read session
            # can put the connection in autocommit (app.api.deps.get_read_session).
            transactional = not dbapi_connection.autocommit
            dbapi_connection.autocommit = True
            started = time.perf_counter()
            cursor = dbapi_connection.cursor()
            cursor.execute("SELECT 1")
            cursor.close()
            timing.add_statement(time.perf_counter() - started)  # a request's round trip too
            dbapi_connection.autocommit = not transactional
        except Exception as exc:
            if watchdog.disarm(dbapi_connection):
                # Not answering: a new connection would hang in its handshake as long.
                watchdog.unanswered_until = time.monotonic() + 2 * ping_timeout
                raise sqlalchemy.exc.TimeoutError(
                    f"the database did not answer within {ping_timeout} s") from exc
            raise sqlalchemy.exc.DisconnectionError() from exc  # closed: the pool reconnects
        watchdog.disarm(dbapi_connection)

    @event.listens_for(engine, "do_connect")
    def _connect(*_: Any) -> None:
        if time.monotonic() < watchdog.unanswered_until:
            raise sqlalchemy.exc.TimeoutError(
                "the database is not answering; not connecting again for a moment")

    def deadline(parameters: Any = None) -> float:
        # Large uploads take longer to send and store: 1 s more per 20 MB.
        return statement_timeout + _payload_bytes(parameters) / 20e6

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn: Any, _cursor: Any, _statement: Any, parameters: Any, *_: Any) -> None:
        watchdog.arm(conn.connection.dbapi_connection, deadline(parameters))

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Any, *_: Any) -> None:
        watchdog.disarm(conn.connection.dbapi_connection)

    @event.listens_for(engine, "handle_error")
    def _error(context: Any) -> None:
        if context.connection is not None and not context.connection.invalidated:
            watchdog.disarm(context.connection.connection.dbapi_connection)

    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _ending(conn: Any) -> None:
        watchdog.arm(conn.connection.dbapi_connection, deadline())

    @event.listens_for(engine.pool, "reset")
    def _reset(dbapi_connection: Any, *_: Any) -> None:
        # The pool rolls a returned connection back itself, without the events above.
        watchdog.arm(dbapi_connection, deadline())

    @event.listens_for(engine.pool, "checkin")
    def _checkin(dbapi_connection: Any, _record: Any) -> None:
        if dbapi_connection is not None:
            watchdog.disarm(dbapi_connection)


def peer_timeout_args(url: str, seconds: float) -> dict[str, Any]:
    """libpq parameters with which both ends of a PostgreSQL connection give up on a peer
    that has gone silent (its host lost, the network between them cut) after about
    ``seconds``, instead of TCP's default of minutes to hours; 0: none.

    The client: ``tcp_user_timeout`` (data sent and not acknowledged) and keepalives (a
    wait for an answer on a link that died). The server, asked for through ``options``:
    the same for the backend, so that a client host that vanished mid-transaction does
    not hold its row locks (and the rows another worker must claim) for hours.
    """
    if seconds <= 0:
        return {}
    idle = max(1, round(seconds / 2))
    count = max(1, round(seconds - idle))
    ms = round(seconds * 1000)
    args: dict[str, Any] = {"keepalives": 1, "keepalives_idle": idle, "keepalives_interval": 1,
                            "keepalives_count": count, "tcp_user_timeout": ms}
    if "options" not in make_url(url).query:  # the URL's own options are left as they are
        args["options"] = (f"-c tcp_keepalives_idle={idle} -c tcp_keepalives_interval=1 "
                           f"-c tcp_keepalives_count={count} -c tcp_user_timeout={ms}")
    return args


_STARTED = "corel_statement_started"


def _time_statements(engine: Engine) -> None:
    """Each statement's seconds counted to the request that ran it (:mod:`app.core.timing`)."""

    @event.listens_for(engine, "before_cursor_execute")
    def _started(conn: Any, *_: Any) -> None:
        if timing.current() is not None:
            conn.info[_STARTED] = time.perf_counter()

    @event.listens_for(engine, "after_cursor_execute")
    def _ended(conn: Any, *_: Any) -> None:
        started = conn.info.pop(_STARTED, None)
        if started is not None:
            timing.add_statement(time.perf_counter() - started)


def make_engine(
    url: str, connect_timeout: float = 5.0, pool_timeout: float = 30.0,
    answer_timeout: float | None = None, statement_timeout: float = 10.0,
    peer_timeout: float = 0.0, pool_size: int = 5, max_overflow: int = 10,
) -> Engine:
    """An engine for ``url``. On PostgreSQL a connection attempt gives up after
    ``connect_timeout`` seconds and waiting for a pooled connection after ``pool_timeout``,
    so that a database that is down answers with an error, not a wait. With
    ``answer_timeout`` (the API's), each checkout pings the database and a
    :class:`Watchdog` cuts a connection that does not answer the ping within
    ``answer_timeout`` or a statement within ``statement_timeout`` seconds (plus 1 s per
    20 MB it sends). With ``peer_timeout``, see :func:`peer_timeout_args`. ``pool_size`` and
    ``max_overflow``: SQLAlchemy's pool (PostgreSQL; SQLite's is its own)."""
    if url.startswith("sqlite"):
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _: Any) -> None:
            # API and worker are separate processes on one file: WAL lets readers
            # and one writer proceed together; foreign keys are off by default.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            # Deleted rows' pages go back to the file system (PRAGMA incremental_vacuum,
            # app/storage/refs.py): takes effect on a new file; app.core.migrate converts
            # an older one once.
            cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
            cur.close()

        _time_statements(engine)
        return engine
    engine = create_engine(url, pool_pre_ping=answer_timeout is None, pool_timeout=pool_timeout,
                           pool_size=pool_size, max_overflow=max_overflow,
                           connect_args={"connect_timeout": max(2, round(connect_timeout)),
                                         **peer_timeout_args(url, peer_timeout)})
    if answer_timeout is not None:
        _watch(engine, answer_timeout, statement_timeout)
    _time_statements(engine)
    return engine


def ping(engine: Engine) -> None:
    """One round trip to the database (``SELECT 1``); raises if it does not answer."""
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def read_session(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose statements run without a transaction around them (its connection in
    autocommit): no BEGIN, COMMIT or ROLLBACK round trips. For what only reads (a read
    route, a token's lookup, an access check) or writes one statement that stands alone.
    Each statement sees what was committed when it ran."""
    session = factory()
    try:
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        yield session
    finally:
        session.close()


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """The one place that commits: commit on success, roll back on any exception."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
