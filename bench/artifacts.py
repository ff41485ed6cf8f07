"""The artifact store against artifacts in database rows, in one run.

1. Checkpoint write and read, MB/s, for a checkpoint of a fine-tuned MiniLM's size
   (``--mb``, 91 MB: ``GET /experiments/{id}/checkpoint`` of the docs' fine-tune): into the
   local store and into S3 (a SeaweedFS of its own), against the way corel kept them until
   now, a ``LargeBinary`` row upserted and committed, on SQLite and on PostgreSQL (the row
   of migration 0015's ``checkpoints`` table, in a database of its own).
2. The tail after a fine-tuned run's last epoch: a real run through the worker's own code
   (``worker.runner.train_experiment``), all-MiniLM-L6-v2 fine-tuned on AG News (the docs'
   spec, its last 2 layers, batch 32, ``--rows`` training rows, 2 epochs), on SQLite and on
   PostgreSQL: the seconds from the end of its last epoch to ``succeeded`` (the best
   checkpoint written, the latent spaces computed and stored); and, beside it, what writing
   that run's own best checkpoint into a row cost (the old path's share of the tail).
3. ``var/`` after ``--runs`` small runs on the embedded default (SQLite, the local store),
   and after deleting them: the fraction of what they added that deleting frees.

Last lines: ``tail after last epoch seconds: X`` (the worse of SQLite and PostgreSQL) and
``freed after delete: F``. ``--smoke``: 8 MB, a digits run for the tail, 4 runs.
Run: ``.venv/bin/python bench/artifacts.py [--data-dir ../shared/datasets]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
import sqlalchemy as sa

from app.core.db import make_engine, make_sessionmaker, session_scope
from app.core.migrate import upgrade
from app.core.models import Experiment
from app.core.schemas.experiments import ExperimentCreate
from app.core.settings import Settings
from app.services.experiments import create_experiment, delete_experiment
from app.storage import ensure, make_store
from harness.servers import PrivateSeaweed

PG_ADMIN = os.environ.get("COREL_BENCH_PG_ADMIN_URL",
                          "postgresql://postgres@127.0.0.1:5432/postgres")
REPO = Path(__file__).resolve().parents[1]


@contextmanager
def pg_database() -> Iterator[str]:
    name = f"corel_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_ADMIN.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def row_store(url: str) -> tuple[Callable[[bytes], None], Callable[[], bytes]]:
    """The old path: the checkpoint's bytes upserted into a row, committed; read back."""
    engine = make_engine(url)
    table = sa.Table("checkpoint_rows", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True),
                     sa.Column("data", sa.LargeBinary, nullable=False))
    table.create(engine, checkfirst=True)

    def write(blob: bytes) -> None:
        with engine.begin() as conn:
            conn.execute(sa.delete(table).where(table.c.id == 1))
            conn.execute(sa.insert(table).values(id=1, data=blob))

    def read() -> bytes:
        with engine.connect() as conn:
            return bytes(conn.execute(sa.select(table.c.data).where(table.c.id == 1)).scalar_one())

    return write, read


def throughput(mb: int, repeats: int, seaweed: PrivateSeaweed, tmp: Path, pg_url: str) -> None:
    print(f"## checkpoint write and read, {mb} MB, median of {repeats}")
    # A content of its own for every write: a store that finds the content there writes
    # nothing (content addressing), which would time the check, not the write.
    blobs = [os.urandom(mb << 20) for _ in range(repeats)]
    stores = {
        "local store": make_store(Settings(var_dir=tmp / "local")),
        "S3 (SeaweedFS)": make_store(Settings(var_dir=tmp / "s3", **seaweed.settings_kwargs())),
    }
    rows = {"SQLite row (before)": row_store(f"sqlite:///{tmp / 'rows.sqlite3'}"),
            "PostgreSQL row (before)": row_store(pg_url)}
    print(f"{'where':28s} {'write MB/s':>11s} {'read MB/s':>10s}")
    for name, store in stores.items():
        pending = iter(blobs)
        digests: list[str] = []
        write = median_seconds(lambda s=store, b=pending, d=digests: d.append(s.put_bytes(next(b)).sha256),
                               repeats)
        assert len({d for d, _, _ in store.listing()}) == repeats  # each write stored its own
        order = iter(digests)

        def get(store=store, order=order) -> None:  # type: ignore[no-untyped-def]
            digest = next(order)
            cached = getattr(store, "cache_dir", None)
            if cached is not None:  # from S3 itself, not this host's cache
                (cached / digest[:2] / digest).unlink(missing_ok=True)
            store.read_bytes(digest)  # each read its own artifact: verified as a new process would

        read = median_seconds(get, repeats)
        for d, _, _ in list(store.listing()):
            store.delete(d)
        print(f"{name:28s} {mb / write:11.0f} {mb / read:10.0f}")
    for name, (write_row, read_row) in rows.items():
        pending = iter(blobs)
        write = median_seconds(lambda w=write_row, b=pending: w(next(b)), repeats)
        read = median_seconds(read_row, repeats)
        print(f"{name:28s} {mb / write:11.0f} {mb / read:10.0f}")


def finetune_tail(settings: Settings, spec: ExperimentCreate) -> tuple[float, float, int]:
    """(seconds from the end of the last epoch to succeeded, seconds the old path took to
    write the same best checkpoint into a row, its size) of a real fine-tune."""
    upgrade(settings)
    factory = ensure(make_sessionmaker(make_engine(settings.db_url)), settings)
    from worker.runner import train_experiment

    with session_scope(factory) as session:
        eid = create_experiment(session, spec).id
    assert train_experiment(eid, factory, settings) == "succeeded"
    with factory() as session:
        exp = session.get(Experiment, eid)
        assert exp is not None and exp.finished_at is not None
        from app.storage.artifacts import best_checkpoint_bytes

        blob = best_checkpoint_bytes(session, eid)
    tail = exp.finished_at.timestamp() - EPOCH_ENDS[eid]
    write_row, _ = row_store(settings.db_url)
    old = median_seconds(lambda: write_row(blob), 3)
    return tail, old, len(blob)


# When each run's last epoch was committed (the recorder's on_epoch_end), by experiment.
EPOCH_ENDS: dict[int, float] = {}


def record_epoch_ends() -> None:
    """Note when each epoch's transaction committed (the recorder's on_epoch_end)."""
    from worker import runner

    original = runner.DatabaseRecorder.on_epoch_end

    def on_epoch_end(self, metrics, run):  # type: ignore[no-untyped-def]
        stop = original(self, metrics, run)
        EPOCH_ENDS[self.experiment_id] = time.time()
        return stop

    runner.DatabaseRecorder.on_epoch_end = on_epoch_end  # type: ignore[method-assign]


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def freed_after_delete(tmp: Path, runs: int) -> float:
    settings = Settings(var_dir=tmp / "embedded", broker_url="memory://",
                        artifact_gc_interval_seconds=0)
    upgrade(settings)
    factory = ensure(make_sessionmaker(make_engine(settings.db_url)), settings)
    from worker.runner import train_experiment

    before = folder_size(settings.var_dir)
    with session_scope(factory) as session:
        ids = [create_experiment(session, ExperimentCreate(
            dataset="digits", loss=("cosine", "gaussian", "cce", "center")[i % 4], seed=i,
            epochs=3, batch_size=64, lr=0.003)).id for i in range(runs)]
    for eid in ids:
        assert train_experiment(eid, factory, settings) == "succeeded"
    after_runs = folder_size(settings.var_dir)
    with session_scope(factory) as session:
        for eid in ids:
            delete_experiment(session, eid)
    after_delete = folder_size(settings.var_dir)
    added = after_runs - before
    print(f"var/ before {before / 1e6:.2f} MB, after {runs} runs {after_runs / 1e6:.2f} MB, "
          f"after deleting them {after_delete / 1e6:.2f} MB")
    return (after_runs - after_delete) / added


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=91)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=1000, help="training rows of the fine-tune")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of the fine-tune")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "datasets"))
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.mb, args.repeats, args.runs = 8, 3, 4

    record_epoch_ends()
    with tempfile.TemporaryDirectory() as name, pg_database() as pg_url:
        tmp = Path(name)
        seaweed = PrivateSeaweed()
        try:
            throughput(args.mb, args.repeats, seaweed, tmp, pg_url)
        finally:
            seaweed.close()

        if args.smoke:  # the same path (the worker's own), a small model: seconds, not minutes
            spec = ExperimentCreate(dataset="digits", loss="cosine", epochs=2, batch_size=64, lr=0.003)
            print("\n## a digits FFNN run (--smoke)")
        else:
            spec = ExperimentCreate(
                dataset="ag-news", encoder="minilm", encoder_mode="finetune", trainable_blocks=2,
                loss="cosine", lam=0.85, lr=0.001, epochs=args.epochs, batch_size=32,
                train_subset=args.rows)
            print(f"\n## a fine-tuned MiniLM run (AG News, {args.rows} rows, last 2 layers, "
                  f"{args.epochs} epochs)")
        tails = {}
        for db, url in (("SQLite", ""), ("PostgreSQL", pg_url)):
            settings = Settings(var_dir=tmp / f"tail-{db}", database_url=url, broker_url="memory://",
                                data_dir=args.data_dir, download=False,
                                artifact_gc_interval_seconds=0)
            tail, old, size = finetune_tail(settings, spec)
            tails[db] = tail
            print(f"{db:11s} tail after the last epoch {tail:6.2f} s (checkpoint {size / 1e6:.1f} MB; "
                  f"the old path's write of it into a row alone {old:.2f} s)")

        print(f"\n## var/ of the embedded default, {args.runs} runs")
        freed = freed_after_delete(tmp, args.runs)

    print(f"tail after last epoch seconds: {max(tails.values()):.2f}")
    print(f"freed after delete: {freed:.3f}")


if __name__ == "__main__":
    main()
