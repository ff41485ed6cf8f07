"""``corel users add|list|adopt`` and ``corel tokens create|list|revoke``: users and
tokens, written to the database of COREL_* settings directly (as ``corel db`` does), so
that the first admin can be made before the service has any (app/access/users.py does
the work). Every change, and every one refused, is written to the audit log as the same
action over HTTP is, its client the CLI with the OS user and the host (``GET /audit``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

ADOPTABLE = ("sweep", "experiment", "dataset", "embedding_job", "index")


def register(sub: Any) -> None:
    users = sub.add_parser("users", help="users of the service (in its database)",
                           description="Manage the service's users, in the database that the "
                           "COREL_* settings name.")
    users_sub = users.add_subparsers(dest="users_command", required=True, metavar="ACTION")
    add = users_sub.add_parser("add", help="add a user")
    add.add_argument("name")
    add.add_argument("--admin", action="store_true", help="may manage users and read everything")
    add.set_defaults(func=_users_add)
    listing = users_sub.add_parser("list", help="every user, and how many rows have no owner")
    listing.set_defaults(func=_users_list)
    adopt = users_sub.add_parser(
        "adopt", help="hand the rows that have no owner to a user",
        description="Rows made before any user existed (or by the COREL_API_TOKEN admin) have "
        "no owner: only admins see them once users exist. This hands them to a user: all of "
        "them, or those of one --kind (with --id, only these). A sweep's members go with it, "
        "an experiment's batch jobs and indexes with it. Rows that have an owner are never "
        "taken from it.")
    adopt.add_argument("name", help="the user's name")
    adopt.add_argument("--kind", choices=ADOPTABLE, help="only rows of this kind")
    adopt.add_argument("--id", type=int, action="append", dest="ids", metavar="N",
                       help="only this row (repeat for more); needs --kind")
    adopt.set_defaults(func=_users_adopt)

    tokens = sub.add_parser("tokens", help="users' API tokens (in the service's database)",
                            description="Create, list or revoke API tokens. A token is printed "
                            "once and stored only as a hash.")
    tokens_sub = tokens.add_subparsers(dest="tokens_command", required=True, metavar="ACTION")
    create = tokens_sub.add_parser("create", help="a new token for a user; printed once")
    create.add_argument("name", help="the user's name")
    create.add_argument("--scope", default="write", choices=("read", "write", "admin"))
    create.add_argument("--expires", type=float, metavar="DAYS", help="days until it stops working")
    create.add_argument("--label", metavar="TEXT", help="what the token is for, shown in lists")
    create.set_defaults(func=_tokens_create)
    listing = tokens_sub.add_parser("list", help="tokens (never the tokens themselves)")
    listing.add_argument("name", nargs="?", help="only this user's (default: every user's)")
    listing.set_defaults(func=_tokens_list)
    revoke = tokens_sub.add_parser("revoke", help="revoke a token: it fails from the next request")
    revoke.add_argument("id", type=int)
    revoke.set_defaults(func=_tokens_revoke)


def _factory() -> Any:
    from app.core.db import make_engine, make_sessionmaker
    from app.core.settings import get_settings

    return make_sessionmaker(make_engine(get_settings().db_url))


def _administer(command: str, action: str, work: Callable[[Any], tuple[str, int | None]]) -> int:
    """Run ``work(session)`` (returns the kind and id of the row it changed) in one
    transaction with its audit entry; a refusal is printed and audited in a transaction
    of its own, and nothing else is written."""
    from app.access.audit import record_cli
    from app.core.db import session_scope
    from app.core.errors import DomainError

    factory = _factory()
    try:
        with session_scope(factory) as session:
            resource, resource_id = work(session)
            record_cli(session, action, resource, resource_id)
    except DomainError as exc:
        print(f"corel {command}: {exc.detail}", file=sys.stderr)
        try:
            with session_scope(factory) as session:
                record_cli(session, action, None, None, outcome="refused", detail=exc.detail)
        except Exception as error:  # the refusal stands; its entry is lost
            print(f"corel {command}: not audited ({type(error).__name__})", file=sys.stderr)
        return 1
    return 0


def _users_add(args: argparse.Namespace) -> int:
    from app.access import users
    def work(session: Any) -> tuple[str, int | None]:
        user = users.create_user(session, args.name, args.admin)
        print(f"user {user.id} {user.name}{' (admin)' if user.admin else ''}")
        return "user", user.id

    return _administer("users add", "corel users add", work)


def _users_list(args: argparse.Namespace) -> int:
    from sqlalchemy import func, select

    from app.access import policy, users
    with _factory()() as session:
        for user in users.list_users(session):
            print(f"{user.id}\t{user.name}\t{'admin' if user.admin else 'user'}\t"
                  f"{user.created_at:%Y-%m-%d %H:%M}")
        unowned = {what: session.scalar(select(func.count()).select_from(model)
                                        .where(model.owner_id.is_(None))) or 0
                   for model, what in policy.KINDS.values()}
    if any(unowned.values()):
        print("unowned (only admins see them; `corel users adopt NAME` hands them over): "
              + ", ".join(f"{n} {what}{'s' if n != 1 else ''}" for what, n in unowned.items() if n))
    return 0


def _users_adopt(args: argparse.Namespace) -> int:
    from app.access import users
    def work(session: Any) -> tuple[str, int | None]:
        user = users.user_named(session, args.name)
        handed = users.adopt(session, user, args.kind, args.ids)
        total = sum(len(v) for v in handed.values())
        print(f"{total} row{'s' if total != 1 else ''} handed to {user.name}"
              + "".join(f"\n  {kind}: {', '.join(map(str, ids))}" for kind, ids in handed.items()))
        return "user", user.id

    what = "corel users adopt" + (f" --kind {args.kind}" if args.kind else "") + \
        "".join(f" --id {i}" for i in args.ids or ())
    return _administer("users adopt", what, work)


def _tokens_create(args: argparse.Namespace) -> int:
    from app.access import users
    if args.expires is not None and args.expires <= 0:
        print("corel tokens create: --expires must be a positive number of days", file=sys.stderr)
        return 2

    def work(session: Any) -> tuple[str, int | None]:
        user = users.user_named(session, args.name)
        row, token = users.create_token(session, user.id, args.scope, args.expires, args.label)
        expiry = f", expires {row.expires_at:%Y-%m-%d %H:%M} UTC" if row.expires_at else ""
        # Printed once the transaction commits (see below).
        printed.append((f"token {row.id} for {args.name} (scope {args.scope}{expiry}); shown "
                        "this once:", token))
        return "token", row.id

    printed: list[tuple[str, str]] = []
    status = _administer("tokens create", "corel tokens create", work)
    for note, token in printed if status == 0 else ():
        print(note, file=sys.stderr)
        print(token)
    return status


def _tokens_list(args: argparse.Namespace) -> int:
    from app.access import users
    from app.core.errors import DomainError
    from app.core.models import as_utc, utcnow
    def when(value: Any) -> str:
        return "-" if value is None else f"{as_utc(value):%Y-%m-%d %H:%M}Z"

    try:
        with _factory()() as session:
            chosen = [users.user_named(session, args.name)] if args.name else users.list_users(session)
            now = utcnow()
            print("id\tuser\tname\tscope\tcreated\texpires\tlast used\tstate")
            for user in chosen:
                for t in users.list_tokens(session, user.id):
                    state = ("revoked" if t.revoked_at is not None else "expired"
                             if t.expires_at is not None and as_utc(t.expires_at) <= now else "valid")
                    print(f"{t.id}\t{user.name}\t{t.name or '-'}\t{t.scope}\t{when(t.created_at)}\t"
                          f"{when(t.expires_at)}\t{when(t.last_used_at)}\t{state}")
    except DomainError as exc:
        print(f"corel tokens list: {exc.detail}", file=sys.stderr)
        return 1
    return 0


def _tokens_revoke(args: argparse.Namespace) -> int:
    from app.access import users
    def work(session: Any) -> tuple[str, int | None]:
        users.revoke_token(session, args.id)
        return "token", args.id

    status = _administer("tokens revoke", "corel tokens revoke", work)
    if status == 0:
        print(f"token {args.id} revoked")
    return status
