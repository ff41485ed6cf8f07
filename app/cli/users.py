"""``corel users add`` and ``corel tokens create|revoke``: users and tokens, written to
the database of COREL_* settings directly (as ``corel db`` does), so that the first admin
can be made before the service has any (app/services/users.py does the work)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: Any) -> None:
    users = sub.add_parser("users", help="users of the service (in its database)",
                           description="Manage the service's users, in the database that the "
                           "COREL_* settings name.")
    users_sub = users.add_subparsers(dest="users_command", required=True, metavar="ACTION")
    add = users_sub.add_parser("add", help="add a user")
    add.add_argument("name")
    add.add_argument("--admin", action="store_true", help="may manage users and read everything")
    add.set_defaults(func=_users_add)

    tokens = sub.add_parser("tokens", help="users' API tokens (in the service's database)",
                            description="Create or revoke API tokens. A token is printed once "
                            "and stored only as a hash.")
    tokens_sub = tokens.add_subparsers(dest="tokens_command", required=True, metavar="ACTION")
    create = tokens_sub.add_parser("create", help="a new token for a user; printed once")
    create.add_argument("name", help="the user's name")
    create.add_argument("--scope", default="write", choices=("read", "write", "admin"))
    create.add_argument("--expires", type=float, metavar="DAYS", help="days until it stops working")
    create.set_defaults(func=_tokens_create)
    revoke = tokens_sub.add_parser("revoke", help="revoke a token: it fails from the next request")
    revoke.add_argument("id", type=int)
    revoke.set_defaults(func=_tokens_revoke)


def _session_scope() -> Any:
    from app.db import make_engine, make_sessionmaker, session_scope
    from app.settings import get_settings

    return session_scope(make_sessionmaker(make_engine(get_settings().db_url)))


def _users_add(args: argparse.Namespace) -> int:
    from app.errors import DomainError
    from app.services import users

    try:
        with _session_scope() as session:
            user = users.create_user(session, args.name, args.admin)
            print(f"user {user.id} {user.name}{' (admin)' if user.admin else ''}")
    except DomainError as exc:
        print(f"corel users add: {exc.detail}", file=sys.stderr)
        return 1
    return 0


def _tokens_create(args: argparse.Namespace) -> int:
    from app.errors import DomainError
    from app.services import users

    if args.expires is not None and args.expires <= 0:
        print("corel tokens create: --expires must be a positive number of days", file=sys.stderr)
        return 2
    try:
        with _session_scope() as session:
            user = users.user_named(session, args.name)
            row, token = users.create_token(session, user.id, args.scope, args.expires)
            token_id = row.id
    except DomainError as exc:
        print(f"corel tokens create: {exc.detail}", file=sys.stderr)
        return 1
    expiry = f", expires {row.expires_at:%Y-%m-%d %H:%M} UTC" if row.expires_at else ""
    print(f"token {token_id} for {args.name} (scope {args.scope}{expiry}); shown this once:",
          file=sys.stderr)
    print(token)
    return 0


def _tokens_revoke(args: argparse.Namespace) -> int:
    from app.errors import DomainError
    from app.services import users

    try:
        with _session_scope() as session:
            users.revoke_token(session, args.id)
    except DomainError as exc:
        print(f"corel tokens revoke: {exc.detail}", file=sys.stderr)
        return 1
    print(f"token {args.id} revoked")
    return 0
