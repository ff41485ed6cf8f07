"""An experiment's or a sweep's progress as Server-Sent Events, resumable exactly.

Events (``data`` is JSON, each with its ``experiment_id``):

* ``status``: the experiment's state. Sent first for each experiment when a stream
  starts (a snapshot), then once per change of status. A change to ``queued`` or
  ``running`` comes before that pass's epochs; a terminal one (succeeded, failed,
  cancelled) after them, so it is the last word about its experiment.
* ``epoch``: one recorded epoch, each exactly once, in order.

Every event's ``id`` says what the client has been sent once it has that event: per
experiment, the last epoch and the last status, as a token ``<epoch><status letter>``
(``6s``: epochs up to 6 and "succeeded"; the letters are q r s f c, and ``-`` for
nothing yet). An experiment stream's id is its token; a sweep's is
``<members>:<tokens>``, its members' tokens in id order with runs written ``count*token``
(``12:4*6s.2*3r.6*0q``). A client that reconnects with ``Last-Event-ID`` gets exactly
what it had not been sent: the later epochs, and a status only if it changed.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from app.core.db import DATABASE_UNAVAILABLE
from app.core.errors import InvalidInput
from app.core.models import FINISHED, STATUSES, EpochMetric, Experiment
from app.jobs.events import QUERY_CHUNK, EventHub

KEEPALIVE_SECONDS = 15.0  # a comment line after this much silence keeps proxies from closing
RETRY_SECONDS = 2.0  # pause after a database error before reading again

LETTERS: dict[str, str] = {status: status[0] for status in STATUSES}  # q r s f c
STATUS_OF = {letter: status for status, letter in LETTERS.items()}
UNSEEN = "-"
_TOKEN = re.compile(r"(\d{1,9})([qrsfc-])")
_RUN = re.compile(r"(?:(\d{1,6})\*)?(\d{1,9}[qrsfc-])")

STATUS_FIELDS = ("current_epoch", "epochs_total", "best_epoch", "best_val_accuracy",
                 "test_accuracy", "error")
EPOCH_FIELDS = ("train_loss", "train_accuracy", "val_accuracy", "test_accuracy",
                "is_best", "seconds")


@dataclass
class Sent:
    """What a client has been sent about one experiment."""

    epoch: int = 0
    status: str | None = None

    def token(self) -> str:
        return f"{self.epoch}{LETTERS[self.status] if self.status else UNSEEN}"

    @classmethod
    def parse(cls, token: str) -> Sent:
        match = _TOKEN.fullmatch(token)
        if match is None:
            raise ValueError(token)
        letter = match.group(2)
        return cls(int(match.group(1)), None if letter == UNSEEN else STATUS_OF[letter])


def _runs(tokens: Sequence[str]) -> str:
    return ".".join(token if n == 1 else f"{n}*{token}"
                    for token, n in ((t, len(list(g))) for t, g in itertools.groupby(tokens)))


def encode_sweep(tokens: Sequence[str]) -> str:
    return f"{len(tokens)}:{_runs(tokens)}"


def _malformed(last_event_id: str, form: str) -> InvalidInput:
    return InvalidInput(
        f"Last-Event-ID {last_event_id[:80]!r} is not an id this stream sent ({form}); "
        "reconnect without it to start from the beginning")


def experiment_position(last_event_id: str | None) -> Sent:
    """Where an experiment stream resumes: nothing sent yet without ``Last-Event-ID``."""
    if last_event_id is None or not last_event_id.strip():
        return Sent()
    try:
        return Sent.parse(last_event_id.strip())
    except ValueError:
        raise _malformed(last_event_id, "e.g. '6s'") from None


def sweep_position(last_event_id: str | None, size: int) -> list[Sent]:
    """Where a sweep stream of ``size`` members resumes."""
    if last_event_id is None or not last_event_id.strip():
        return [Sent() for _ in range(size)]
    count, _, runs = last_event_id.strip().partition(":")
    sent: list[Sent] = []
    for run in runs.split(".") if runs else []:
        match = _RUN.fullmatch(run)
        if match is None or len(sent) > size:
            raise _malformed(last_event_id, "e.g. '3:2*6s.0q'")
        sent.extend(Sent.parse(match.group(2)) for _ in range(int(match.group(1) or 1)))
    if not count.isdigit() or int(count) != len(sent):
        raise _malformed(last_event_id, "e.g. '3:2*6s.0q'")
    if len(sent) != size:
        raise InvalidInput(f"Last-Event-ID names {len(sent)} experiments but the sweep has "
                           f"{size} (one was deleted); reconnect without it")
    return sent


def _event(kind: str, event_id: str, data: dict[str, Any]) -> bytes:
    return (b"id: " + event_id.encode() + b"\nevent: " + kind.encode() + b"\ndata: "
            + orjson.dumps(data) + b"\n\n")


def _read(factory: sessionmaker[Session], ids: list[int], sent: dict[int, Sent]
          ) -> tuple[dict[int, Any], dict[int, list[Any]]]:
    """The rows of ``ids`` and the epochs their clients have not been sent, in one short
    session. Rows first: a terminal status is committed after every epoch, so when a row
    reads terminal here, the epoch query below sees all of its epochs."""
    rows: dict[int, Any] = {}
    epochs: dict[int, list[Any]] = {}
    with factory() as session:
        for start in range(0, len(ids), QUERY_CHUNK):
            for row in session.execute(
                select(Experiment.id, Experiment.status, *(getattr(Experiment, f) for f in STATUS_FIELDS))
                .where(Experiment.id.in_(ids[start:start + QUERY_CHUNK]))
            ):
                rows[row.id] = row
        behind: dict[int, list[int]] = {}  # epoch sent -> ids with more to send
        for i, row in rows.items():
            if row.current_epoch > sent[i].epoch or row.status != sent[i].status:
                behind.setdefault(sent[i].epoch, []).append(i)
        for after, group in behind.items():
            for start in range(0, len(group), QUERY_CHUNK):
                for metric in session.execute(
                    select(EpochMetric.experiment_id, EpochMetric.epoch, *(getattr(EpochMetric, f) for f in EPOCH_FIELDS))
                    .where(EpochMetric.experiment_id.in_(group[start:start + QUERY_CHUNK]),
                           EpochMetric.epoch > after)
                    .order_by(EpochMetric.experiment_id, EpochMetric.epoch)
                ):
                    epochs.setdefault(metric.experiment_id, []).append(metric)
    return rows, epochs


async def stream(hub: EventHub, factory: sessionmaker[Session], member_ids: list[int],
                 sent: list[Sent], *, sweep: bool) -> AsyncIterator[bytes]:
    """The events of ``member_ids`` (one experiment, or a sweep's members in id order)
    from ``sent`` on; ends once each has had its terminal status (or was deleted)."""
    position = {experiment_id: k for k, experiment_id in enumerate(member_ids)}
    tokens = [s.token() for s in sent]
    gone: set[int] = set()
    pending: set[int] = set()
    with hub.subscribe(member_ids) as subscription:
        while True:
            if not pending:
                woken = await subscription.wait(KEEPALIVE_SECONDS)
                if woken is None:
                    yield b": keepalive\n\n"
                    continue
                pending = woken - gone
            ids = sorted(pending, key=position.__getitem__)
            try:
                rows, epochs = await run_in_threadpool(
                    _read, factory, ids, {i: sent[position[i]] for i in ids})
            except DATABASE_UNAVAILABLE:
                # The database is restarting: say so, wait, read again; the listener
                # wakes every stream once it is back.
                yield b": database unavailable; trying again\n\n"
                await asyncio.sleep(RETRY_SECONDS)
                continue
            pending = set()
            for experiment_id in ids:
                k = position[experiment_id]
                row = rows.get(experiment_id)
                if row is None:  # deleted meanwhile
                    gone.add(experiment_id)
                    continue
                before = _runs(tokens[:k]) if sweep else ""
                after = _runs(tokens[k + 1:]) if sweep else ""

                def event_id(token: str, before: str = before, after: str = after) -> str:
                    if not sweep:
                        return token
                    return f"{len(tokens)}:" + ".".join(p for p in (before, token, after) if p)

                chunk = _member_events(experiment_id, row, epochs.get(experiment_id, []),
                                       sent[k], event_id)
                tokens[k] = sent[k].token()
                if chunk:
                    yield chunk
            if all(s.status in FINISHED or i in gone for i, s in zip(member_ids, sent, strict=True)):
                return


def _member_events(experiment_id: int, row: Any, epochs: list[Any], sent: Sent,
                   event_id: Any) -> bytes:
    """One pass's events about one experiment; ``sent`` is advanced as they are made."""
    out: list[bytes] = []

    def status_event() -> None:
        sent.status = row.status
        out.append(_event("status", event_id(sent.token()), {
            "experiment_id": experiment_id, "status": row.status,
            **{f: getattr(row, f) for f in STATUS_FIELDS}}))

    changed = row.status != sent.status
    # A snapshot, or a move to queued/running, before the epochs; a terminal status last.
    if changed and (sent.status is None or row.status not in FINISHED):
        status_event()
        changed = False
    for metric in epochs:
        if metric.epoch <= sent.epoch:
            continue
        sent.epoch = metric.epoch
        out.append(_event("epoch", event_id(sent.token()), {
            "experiment_id": experiment_id, "epoch": metric.epoch, "epochs_total": row.epochs_total,
            **{f: getattr(metric, f) for f in EPOCH_FIELDS}}))
    if changed:
        status_event()
    return b"".join(out)
