"""The statements a list and a single read send to the database: a bound that does not grow
with the rows on the page (issue 61: a read spent 167 ms under load, most of it in round
trips). Counted on the API's own engine, on PostgreSQL, by SQLAlchemy's cursor events:
every statement, the checkout's ping included; BEGIN and COMMIT, which psycopg sends
itself, are counted from the connection's own events. The service's own background threads
(all named ``corel-...``: the artifact collector, the reconciler) share the engine and may
query while a request is counted; theirs are left out."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

import app.main
from tests.app.conftest import AS_USER, own_database

READ_BOUND = 2  # the checkout's ping, then the row (no BEGIN, no COMMIT: a read session)
LIST_BOUND = 2  # the ping, then the page with its total (a window count, one statement)


@contextmanager
def counted(client) -> Iterator[list[str]]:
    engine = client.app.state.engine
    seen: list[str] = []

    def background() -> bool:
        return threading.current_thread().name.startswith("corel-")

    def statement(_conn, _cursor, sql, *_args) -> None:
        if not background():
            seen.append(sql.split()[0].upper())

    def ping(dbapi_connection, *_args) -> None:
        if not background():
            seen.append("PING")

    def transactional(conn) -> bool:  # psycopg sends BEGIN and COMMIT only outside autocommit
        return not getattr(conn.connection.dbapi_connection, "autocommit", False)

    def begin(conn) -> None:
        if transactional(conn) and not background():
            seen.append("BEGIN")

    def commit(conn) -> None:
        if transactional(conn) and not background():
            seen.append("COMMIT")

    # The ping runs on the DBAPI connection itself, outside SQLAlchemy's cursor events.
    event.listen(engine.pool, "checkout", ping)
    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "begin", begin)
    event.listen(engine, "commit", commit)
    try:
        yield seen
    finally:
        event.remove(engine.pool, "checkout", ping)
        event.remove(engine, "before_cursor_execute", statement)
        event.remove(engine, "begin", begin)
        event.remove(engine, "commit", commit)


def _submit(client, n: int) -> list[int]:
    return [client.post("/experiments", json={"dataset": "digits", "epochs": 1}).json()["id"]
            for _ in range(n)]


def test_a_list_and_a_read_send_a_bounded_number_of_statements_whatever_the_page_holds(client, monkeypatch):
    # A token's last use is written at most once a minute (app/access/tokens.py), so a counted
    # request could carry that UPDATE when the minute happened to end during it (seen once, a
    # loaded 2-core machine: 7 statements against 6). Here the minute never ends: the token's
    # use is written by the submissions, before anything is counted, or not at all.
    monkeypatch.setattr("app.access.tokens.LAST_USED_EVERY", timedelta(days=1))
    ids = _submit(client, 25)
    for limit in (1, 25):
        with counted(client) as seen:
            r = client.get("/experiments", params={"limit": limit})
        assert r.status_code == 200 and len(r.json()["items"]) == limit and r.json()["total"] >= 25
        extra = [s for s in seen if s in ("PING", "SELECT")]
        # As a user, the token's lookup adds its own: the same for either page.
        assert seen.count("SELECT") + seen.count("PING") <= LIST_BOUND + _auth_statements(client), seen
        assert "BEGIN" not in seen and "COMMIT" not in seen, seen
        if limit == 1:
            small = list(extra)
        else:
            assert extra == small, (small, extra)  # 25 rows cost what one row costs
    with counted(client) as seen:
        r = client.get(f"/experiments/{ids[-1]}")
    assert r.status_code == 200
    assert seen.count("SELECT") + seen.count("PING") <= READ_BOUND + _auth_statements(client), seen
    assert "BEGIN" not in seen and "COMMIT" not in seen, seen
    # Sweeps: the page (with its total) and its members' counts, one statement each.
    for size in (2, 6):
        sweep = client.post("/sweeps", json={"base": {"dataset": "digits", "epochs": 1},
                                             "grid": {"seed": list(range(size))}}).json()["id"]
        assert sweep
    with counted(client) as few:
        client.get("/sweeps", params={"limit": 1})
    with counted(client) as many:
        client.get("/sweeps", params={"limit": 2})
    assert len(few) == len(many) <= 3 + _auth_statements(client), (few, many)


def _auth_statements(client) -> int:
    """The statements a request's token costs: none in the open mode (make test's open pass);
    as a user (its other passes), its lookup and the path's access check (a ping and a
    statement each), and the owner the answer shows (one statement for a whole page)."""
    return 5 if AS_USER else 0


@pytest.mark.own_auth
def test_a_page_of_many_owners_rows_costs_what_a_page_of_one_costs(settings, tmp_path):
    """The read schemas show each row's owner: loaded one owner at a time, a page of rows of
    many owners cost a statement per owner (N+1)."""
    from sqlalchemy import update

    from app.access.users import create_token, create_user
    from app.core.db import make_engine, make_sessionmaker, session_scope
    from app.core.models import Experiment

    with own_database(settings, tmp_path) as s:
        engine = make_engine(s.db_url)
        with session_scope(make_sessionmaker(engine)) as session:
            users = [create_user(session, f"user{i}", admin=i == 0) for i in range(6)]
            session.flush()
            _, token = create_token(session, users[0].id, "admin")
            ids = [u.id for u in users]
        with TestClient(app.main.create_app(s)) as c:
            c.headers["authorization"] = f"Bearer {token}"
            made = _submit(c, 12)
            with session_scope(make_sessionmaker(engine)) as session:
                for i, eid in enumerate(made):  # each row its own owner, six in all
                    session.execute(update(Experiment).where(Experiment.id == eid).values(owner_id=ids[i % 6]))
            counts = []
            for limit in (1, 12):
                with counted(c) as seen:
                    r = c.get("/experiments", params={"limit": limit})
                assert r.status_code == 200 and len({i["owner"]["id"] for i in r.json()["items"]}) == min(limit, 6)
                counts.append(len(seen))
            assert counts[0] == counts[1], counts
        engine.dispose()
