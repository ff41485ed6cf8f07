"""`corel watch`: follow an experiment's or a sweep's live progress (Server-Sent Events)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpx

from app.core.status import Status

FINISHED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.PRUNED)
RECONNECTS = 8  # attempts in a row without an event before giving up
READ_TIMEOUT = 60.0  # the service sends a keepalive every 15 s; four missed: reconnect


def iter_events(lines: Iterable[str]) -> Iterator[dict[str, str]]:
    """Server-Sent Events from the lines of a stream: ``{"id", "event", "data"}`` each
    (the fields an event lacks are absent). Comment lines (``: keepalive``) are skipped."""
    event: dict[str, str] = {}
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                event["data"] = "\n".join(data)
            if event:
                yield event
            event, data = {}, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name in ("id", "event"):
            event[name] = value


class Progress:
    """The bar and what the events said: epochs seen and each experiment's last status."""

    def __init__(self, label: str) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=None, desc=label, unit="epoch", disable=None, dynamic_ncols=True)
        self.status: dict[int, dict[str, Any]] = {}
        self.epochs: dict[int, int] = {}

    def update(self, kind: str, data: dict[str, Any]) -> None:
        experiment_id = int(data["experiment_id"])
        if kind == "status":
            self.status[experiment_id] = data
            self.epochs.setdefault(experiment_id, 0)
            total = sum(int(s["epochs_total"]) for s in self.status.values())
            if self.bar.total != total:
                self.bar.total = total
                self.bar.refresh()
        elif kind == "epoch":
            self.epochs[experiment_id] = int(data["epoch"])
            self.bar.update(1)
            done = sum(s["status"] in FINISHED for s in self.status.values())
            postfix = {"val_acc": f"{data['val_accuracy']:.4f}"}
            if len(self.status) > 1:
                postfix["finished"] = f"{done}/{len(self.status)}"
            self.bar.set_postfix(postfix, refresh=True)

    def close(self) -> None:
        self.bar.close()


def _follow(args: argparse.Namespace, path: str, progress: Progress) -> None:
    """Read the stream to its end, reconnecting with Last-Event-ID when it drops."""
    url = args.url.rstrip("/") + path
    last_id: str | None = None
    failures = 0
    while True:
        headers = {"Accept": "text/event-stream"}
        if args.token:
            headers["Authorization"] = f"Bearer {args.token}"
        if last_id is not None:
            headers["Last-Event-ID"] = last_id
        try:
            with httpx.stream("GET", url, headers=headers,
                              timeout=httpx.Timeout(10.0, read=READ_TIMEOUT)) as r:
                if r.status_code >= 400:
                    r.read()
                    try:
                        detail = r.json().get("detail", r.text)
                    except ValueError:
                        detail = r.text
                    if r.status_code < 500:
                        raise SystemExit(f"corel: {r.status_code}: {detail}")
                    raise httpx.TransportError(f"{r.status_code}: {detail}")
                for event in iter_events(r.iter_lines()):
                    failures = 0
                    last_id = event.get("id", last_id)
                    if "data" in event:
                        progress.update(event.get("event", "message"), json.loads(event["data"]))
            return
        except httpx.TransportError as exc:
            failures += 1
            if failures > RECONNECTS:
                raise SystemExit(f"corel: lost {args.url} and could not reconnect: {exc}") from exc
            pause = min(0.5 * 2 ** failures, 10.0)
            progress.bar.write(f"connection lost ({type(exc).__name__}); reconnecting in "
                               f"{pause:.0f} s", file=sys.stderr)
            time.sleep(pause)


def _describe(data: dict[str, Any]) -> str:
    text = f"experiment {data['experiment_id']} {data['status']}"
    if data.get("best_epoch") is not None:
        text += f": best epoch {data['best_epoch']}"
        if data.get("best_val_accuracy") is not None:
            text += f", val accuracy {data['best_val_accuracy']:.4f}"
        if data.get("test_accuracy") is not None:
            text += f", test accuracy {data['test_accuracy']:.4f}"
    if data.get("error"):
        text += f" ({data['error']})"
    return text


def watch(args: argparse.Namespace) -> int:
    kind = "sweep" if args.sweep else "experiment"
    path = f"/sweeps/{args.id}/events" if args.sweep else f"/experiments/{args.id}/events"
    progress = Progress(f"{kind} {args.id}")
    try:
        _follow(args, path, progress)
    finally:
        progress.close()
    statuses = [progress.status[i] for i in sorted(progress.status)]
    for data in statuses:
        print(_describe(data))
    if args.sweep:
        counts = {s: sum(d["status"] == s for d in statuses) for s in FINISHED}
        print(f"sweep {args.id}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    ok = bool(statuses) and all(d["status"] == Status.SUCCEEDED for d in statuses)
    return 0 if ok else 1


def register(sub: Any) -> None:
    p = sub.add_parser(
        "watch", help="follow an experiment's (or a sweep's) training live",
        description="GET /experiments/{id}/events (or /sweeps/{id}/events): a progress bar "
        "of the epochs with the validation accuracy, reconnecting where it left off when the "
        "connection drops; prints the final status. Exit status 0 when every experiment "
        "succeeded, 1 otherwise.")
    p.add_argument("id", type=int, help="experiment id (sweep id with --sweep)")
    p.add_argument("--sweep", action="store_true", help="ID is a sweep: follow all its members")
    p.add_argument("--url", default=os.environ.get("COREL_URL", "http://127.0.0.1:8000"),
                   help="service base URL (default: $COREL_URL or http://127.0.0.1:8000)")
    p.add_argument("--token", default=os.environ.get("COREL_API_TOKEN"),
                   help="bearer token (default: $COREL_API_TOKEN)")
    p.set_defaults(func=watch)
