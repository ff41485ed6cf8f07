"""The service's side of the ``corel`` command line, and its clients.

``corel.cli`` (the library's edge) loads :func:`register` through the ``corel.commands``
entry point, so the library never imports ``app``. One module per group of commands:

* :mod:`app.cli.client`: ``corel embed``, ``predict``, ``cluster`` (HTTP clients);
* :mod:`app.cli.watch`: ``corel watch`` (follows a run's or a sweep's events);
* :mod:`app.cli.service`: ``corel serve``, ``worker``, ``db``, and ``reproduce``, which
  drives :mod:`app.cli.reproduce` (the paper's Table 1 matrix) and :mod:`app.cli.peers`
  (COREL against today's losses);
* :mod:`app.cli.users`: ``corel users add``, ``corel tokens create|revoke`` (the database).
"""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    """Add the service's commands to ``corel``'s subparsers."""
    from app.cli import client, service, users, watch

    client.register(sub)
    watch.register(sub)
    service.register(sub)
    users.register(sub)
