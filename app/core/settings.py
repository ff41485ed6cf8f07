"""One settings object, read from ``COREL_*`` environment variables (or a .env file)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from corel.limits import MAX_PIXELS
from corel.spec import MAX_GROUP

if TYPE_CHECKING:
    from corel.train import EngineOptions

SUPPORTED_DB = ("sqlite", "postgresql")
SUPPORTED_BROKERS = ("redis", "rediss", "sqla+sqlite", "sqla+postgresql", "filesystem", "amqp", "memory")


class Settings(BaseSettings):
    """Service configuration. The defaults are the embedded default: everything in ./var."""

    model_config = SettingsConfigDict(env_prefix="COREL_", env_file=".env", extra="ignore")

    var_dir: Path = Field(default=Path("var"), description="Where the embedded default keeps its files.")
    features_dir: Path | None = Field(
        default=None, description="Where frozen encoders' features of a dataset are kept as files, "
        "for every later run and process that computes the same ones (default: var_dir/features). "
        "Their names are their content's digests (the encoder's, the inputs', the CPU path), and "
        "each is written beside, then renamed: the processes of one host (several workers, a "
        "test run's processes) may share one folder.")
    artifacts: Literal["local", "s3"] = Field(
        default="local",
        description="Where artifacts (checkpoints, uploads, encoders, latent spaces, ...) are "
        "kept: 'local', a folder (COREL_ARTIFACTS_DIR), or 's3', a bucket of any S3 endpoint "
        "(COREL_S3_*), which every host of a cluster reaches. The database keeps their "
        "digests, never their bytes.",
    )
    artifacts_dir: Path | None = Field(
        default=None, description="The local artifact folder; default: var_dir/artifacts.")
    s3_endpoint: str = Field(
        default="", description="The S3 endpoint's URL (http://host:8333 for SeaweedFS); "
        "empty: AWS's own.")
    s3_bucket: str = Field(default="", description="The S3 bucket of the artifacts.")
    s3_prefix: str = Field(default="artifacts/", description="The key prefix in the bucket.")
    s3_region: str = Field(default="us-east-1")
    s3_access_key: SecretStr = Field(default=SecretStr(""))
    s3_secret_key: SecretStr = Field(default=SecretStr(""))
    s3_wait_seconds: float = Field(
        default=60.0, gt=0,
        description="How long a request to S3 is tried again while the endpoint does not "
        "answer (a restart is waited out) before the store counts as unavailable.")
    artifact_gc_grace_seconds: float = Field(
        default=3600.0, ge=0,
        description="corel gc (and the periodic sweep) removes an artifact no row references "
        "only once it is older than this: one being written, whose row is not committed yet, "
        "is spared.")
    features_keep_days: float = Field(
        default=30.0, gt=0,
        description="A frozen encoder's features kept in the artifact store (for every worker "
        "host: none computes them again) are dropped by corel gc (and the periodic sweep) once "
        "no run has read them for this many days.")
    artifact_gc_interval_seconds: float = Field(
        default=3600.0, ge=0,
        description="How often the API sweeps the store for orphans; 0: never (corel gc only).")
    database_url: str = Field(
        default="", description="SQLAlchemy URL; default: a SQLite file in var_dir."
    )
    broker_url: str = Field(
        default="", description="Celery broker URL; default: a SQLite-backed broker in var_dir."
    )
    data_dir: str = Field(
        default="",
        description="Folders holding the built-in datasets' files (MNIST's IDX files, ag_news/, "
        "...), separated by ':'; looked in before var_dir/datasets (and system locations such "
        "as Debian's /usr/share/datasets/fashion-mnist). `make serve` and the tests add "
        "../shared/datasets when it exists.",
    )
    download: bool = Field(
        default=True,
        description="Whether a worker may download a built-in dataset (MNIST, Fashion-MNIST, "
        "AG News) that is in no data folder, once, into var_dir/datasets, checksums verified. "
        "Off: such a dataset is unavailable, and a spec naming it is refused.",
    )
    download_mirror: str = Field(
        default="",
        description="A base URL serving <dataset>/<file name> (for example an internal mirror "
        "of the public releases) to download from instead of the public sources.",
    )
    download_probe_seconds: float = Field(
        default=3.0, gt=0,
        description="How long the service waits for a built-in dataset's download source (the "
        "public release or COREL_DOWNLOAD_MIRROR) to answer before it counts the dataset as "
        "unavailable: asked once at start for each dataset that is not here, and again at "
        "most every COREL_DOWNLOAD_RECHECK_SECONDS.",
    )
    download_recheck_seconds: float = Field(
        default=300.0, gt=0,
        description="How old an answer about a download source may be before it is asked again "
        "(in the background: a request meanwhile gets the last answer).",
    )
    api_token: SecretStr | None = Field(
        default=None, description="When set, mutating endpoints need 'Authorization: Bearer <token>'."
    )
    api_token_reads: bool = Field(
        default=True,
        description="When a token is set, reads (GET) need it too: embed/predict, metrics, "
        "clustering, figures, datasets, sweeps. Health, readiness and the OpenAPI document "
        "stay open. Set COREL_API_TOKEN_READS=false to leave reads open.",
    )
    chance_epochs: int = Field(
        default=5, ge=0,
        description="A run ends `failed`, saying why, when its loss is not finite; when its "
        "validation accuracy stays at chance for a third of its epochs (at least this many), or "
        "to its end; or, for Gaussian-COREL below lam 0.5, when it is at chance or its loss is "
        "negative and falling for this many epochs. 0 turns the check off.")
    max_upload_bytes: int = Field(default=200 * 1024 * 1024, gt=0)
    max_encoder_bytes: int = Field(
        default=512 * 1024 * 1024, gt=0,
        description="Limit of POST /encoders (a zipped sentence-transformers folder or a weights "
        "file); a zip may unpack to four times as much.")
    max_json_bytes: int = Field(
        default=1024 * 1024, gt=0, description="Body limit of the JSON routes (specs, sweeps).")
    max_inference_bytes: int = Field(
        default=64 * 1024 * 1024, gt=0, description="Body limit of POST /embed and /predict.")
    max_embed_batch: int = Field(default=4096, gt=0)
    max_text_bytes: int = Field(
        default=256 * 1024, gt=0,
        description="The most UTF-8 bytes one text of /embed, /predict or /neighbors may have; "
        "past it the answer is a 413 naming the input and this limit.")
    text_batch_tokens: int = Field(
        default=16384, gt=0,
        description="Token budget of one forward pass over queued texts (a frozen text "
        "encoder's): the waiting requests are taken first in first out while their tokens "
        "(as the encoder's tokenizer counts them) fit; a request larger than it goes alone.")
    model_keep_versions: int = Field(
        default=2, ge=1,
        description="Per alias of a model, the versions it named last (this many, the one it "
        "names now included) whose collection indexes are kept, so that a rollback to them "
        "embeds nothing; a promotion's flip deletes the builds (embedding job and index) of "
        "every other version.")
    text_queue_max_inputs: int = Field(
        default=8192, gt=0,
        description="The most texts waiting for a frozen text encoder in one API process; a "
        "request that would pass it is a 429 with Retry-After (the seconds the waiting texts "
        "take to compute at the measured rate).")
    max_image_pixels: int = Field(
        default=MAX_PIXELS, gt=0,
        description="The most pixels (width x height) an image may declare, checked before it is "
        "decoded: in /embed, /predict, /neighbors, their /files forms and an image folder's "
        "upload. Past it the answer is a 413 naming the image's size and this limit. Pillow "
        "refuses past about 179 million pixels whatever this says.")
    max_sweep_size: int = Field(default=2000, gt=0, description="Most experiments in one sweep.")
    max_group_size: int = Field(
        default=MAX_GROUP, gt=0,
        description="Most members of one stacked group of a sweep (members that differ only in "
        "lam, gamma, alpha and seed train as one model); a larger set is split.")
    model_cache_size: int = Field(default=4, gt=0)
    exact_search_max_rows: int = Field(
        default=1_000_000, gt=0,
        description="The most training rows /neighbors searches exactly (their float32 "
        "representations are held in the API process: 512 MB for 1M x 128).")
    index_exact_below_rows: int = Field(
        default=100_000, gt=0,
        description="An index of kind auto is exact below this many rows, HNSW (faiss) from there.")
    index_target_recall: float = Field(
        default=0.96, gt=0.0, le=1.0,
        description="An HNSW index's efSearch is the smallest whose recall@10, measured at build "
        "time on held-out rows, reaches this.")
    hnsw_m: int = Field(default=16, ge=4, le=128, description="HNSW graph degree (faiss M).")
    hnsw_ef_construction: int = Field(
        default=100, ge=8, le=2048, description="HNSW construction breadth (faiss efConstruction).")
    index_cache_size: int = Field(
        default=2, gt=0, description="Indexes (and training splits searched exactly) kept in "
        "memory per API process.")
    page_size_limit: int = Field(default=200, gt=0)
    # A running experiment whose worker has not reported for this long is taken over
    # by the next worker that starts (the worker died without acknowledging).
    lease_seconds: float = Field(default=120.0, gt=0)
    heartbeat_seconds: float = Field(default=5.0, gt=0)
    # A run's epochs are committed (their rows, its resume checkpoint, the figures its page
    # shows) at most once this many seconds: an epoch that ends sooner after the last commit
    # is held in memory and written with the next one. Its last epoch, an epoch after a
    # cancel, a hand-back or a failure always commits; a worker that dies loses at most this
    # much training, which its run's next claim trains again from the checkpoint. 0: every
    # epoch commits. A few-shot member's 100 one-step epochs took 11 ms of bookkeeping each
    # against 2.4 ms of training.
    epoch_commit_seconds: float = Field(default=1.0, ge=0)
    # The database is the source of truth for what must run; the broker only wakes
    # workers up. A queued row not claimed this long after its task was sent is sent
    # again (then after twice as long, ... up to requeue_max_seconds). Both default to
    # the lease (one lease, then at most two), so that once the broker and the database
    # are back a lost run waits no longer than a dead worker's run does.
    requeue_after_seconds: float = Field(
        default=0.0, ge=0, description="Default (0): COREL_LEASE_SECONDS.")
    requeue_max_seconds: float = Field(
        default=0.0, ge=0, description="Default (0): twice COREL_LEASE_SECONDS.")
    # A task that meets a database or broker error waits and tries again (pauses
    # doubling up to retry_max_pause) for this long before it gives the run back.
    transient_retry_seconds: float = Field(default=900.0, ge=0)
    retry_max_pause: float = Field(default=10.0, gt=0)
    # The API gives up on a database that does not accept a connection within this
    # many seconds, or whose connection pool has none free for as long, with a 503.
    db_timeout_seconds: float = Field(default=2.0, gt=0)
    # ... and on one that does not answer a ping within db_answer_seconds, or a statement
    # within db_statement_seconds (frozen, or a network that drops packets).
    db_answer_seconds: float = Field(default=1.0, gt=0)
    # The API's connections to PostgreSQL: kept open (a request that finds none free opens
    # one of the overflow, closed again when returned; past both it waits db_timeout_seconds).
    db_pool_size: int = Field(default=20, ge=1, le=1000)
    db_max_overflow: int = Field(default=20, ge=0, le=1000)
    db_statement_seconds: float = Field(default=10.0, gt=0)
    db_peer_timeout_seconds: float = Field(
        default=15.0, ge=0,
        description="On PostgreSQL, both ends of every connection (the API's, a worker's) give "
        "up on the other after it has been silent this long (host lost, network cut): a "
        "worker cut off mid-transaction does not hold its rows' locks for TCP's hours, and a "
        "worker that is cut off notices and tries again. 0: TCP's own timeouts. Behind "
        "pgbouncer, set 0 or add `options` to its ignore_startup_parameters.",
    )
    # Longer than any training run: a slow run must never be delivered twice.
    visibility_timeout: int = Field(default=7 * 24 * 3600, gt=0)
    queue: str = Field(default="corel")
    device: str | None = Field(default=None, description="Torch device for workers; default auto.")
    cuda_graphs: str | None = Field(
        default=None,
        description="Training steps on a CUDA device replayed from a CUDA graph: 1 (or unset, "
        "the default), 0 (off) or eager (corel/train/graphs.py; checked here so that a process "
        "refuses to start on any other value). Reaches the library as engine_options().",
    )
    native: bool = Field(
        default=True,
        description="corel's compiled fused nodes (corel/native) where they are built; false: "
        "their Python twins, the same numbers, slower. Reaches the library as engine_options().",
    )
    native_dir: str = Field(
        default="",
        description="Where corel/native's builds live (default: <virtual environment>/corel-native). "
        "Reaches the library as engine_options().",
    )
    api_torch_threads: int = Field(
        default=1, gt=0,
        description="Torch threads of the API process (`corel serve`). Small requests run on "
        "its event loop, those arriving together in one forward pass; one thread keeps them "
        "from fighting over the cores (bench/embed_throughput.py).",
    )
    server_timing: bool = Field(
        default=True,
        description="Each answer's Server-Timing header: the milliseconds the request spent in "
        "the app and in its SQL statements (a client's own time less the app's is the time "
        "queued outside it; bench/api_load.py); false: no header.",
    )
    api_processes: int = Field(
        default=1, ge=1, le=64,
        description="API processes `corel serve` runs on its one port (uvicorn's workers), each "
        "with its own pool, caches and event loop: Python answers a request on one core at a "
        "time per process, so more processes answer more at once (bench/api_load.py).",
    )
    api_text_threads: int = Field(
        default=0, ge=0,
        description="Torch threads of one pass over queued texts (a frozen text encoder's, "
        "off the event loop); 0 (the default): the CPUs the API process may use divided by "
        "api_processes. The encoder is where a text request's time goes; the event loop keeps "
        "api_torch_threads (bench/text_latency.py).",
    )
    api_batch_threads: int = Field(
        default_factory=lambda: os.cpu_count() or 1, gt=0,
        description="Threads that share a request of 256 inputs or more, one slice each, "
        "off the event loop (default: all cores).",
    )
    worker_nice: int = Field(
        default=10, ge=0, le=19,
        description="The worker process's nice value (`corel worker`, and the one `corel serve` "
        "starts): beside an API on the same cores, training takes what the API leaves, so a "
        "training run does not stall the answers (bench/api_load.py); alone, it trains as fast.",
    )
    worker_torch_threads: int = Field(
        default=0, ge=0,
        description="Torch threads of each worker process; 0 (the default): its share of the "
        "host, the CPUs it may use divided by the workers on its host, which count each other "
        "through the database (app/jobs/workers.py), at least 1. Two workers on two "
        "cores that each used both trained an epoch up to 50x slower than with one thread "
        "each (bench/host_contention.py).",
    )
    worker_metrics_port: int = Field(
        default=0, ge=0, le=65535,
        description="Port on which a worker serves its Prometheus metrics (all interfaces); "
        "0: none.",
    )
    log_level: str = Field(default="INFO")
    auto_migrate: bool = Field(
        default=False, description="Apply migrations when the API starts (the embedded default)."
    )

    @model_validator(mode="after")
    def _requeue_from_lease(self) -> Settings:
        if not self.requeue_after_seconds:
            self.requeue_after_seconds = self.lease_seconds
        if not self.requeue_max_seconds:
            self.requeue_max_seconds = max(2 * self.lease_seconds, self.requeue_after_seconds)
        if self.requeue_max_seconds < self.requeue_after_seconds:
            raise ValueError(
                f"COREL_REQUEUE_MAX_SECONDS ({self.requeue_max_seconds:g}) must be at least "
                f"COREL_REQUEUE_AFTER_SECONDS ({self.requeue_after_seconds:g})")
        return self

    @field_validator("cuda_graphs")
    @classmethod
    def _check_cuda_graphs(cls, v: str | None) -> str | None:
        if v is not None:
            from corel.train.options import parse_cuda_graphs  # (imports torch: only where set)

            parse_cuda_graphs(v)
        return v

    @field_validator("native", mode="before")
    @classmethod
    def _empty_native_is_the_default(cls, v: object) -> object:
        # COREL_NATIVE= (empty) is the library's default, on: a process must not refuse it.
        return True if isinstance(v, str) and not v.strip() else v

    @model_validator(mode="after")
    def _s3_needs_a_bucket(self) -> Settings:
        if self.artifacts == "s3" and not self.s3_bucket:
            raise ValueError("COREL_ARTIFACTS=s3 needs COREL_S3_BUCKET (and COREL_S3_ENDPOINT "
                             "for a server other than AWS's)")
        return self

    @field_validator("database_url")
    @classmethod
    def _check_db(cls, v: str) -> str:
        if v and v.split(":", 1)[0].split("+", 1)[0] not in SUPPORTED_DB:
            raise ValueError(
                f"COREL_DATABASE_URL must be a sqlite:// or postgresql:// URL; got {v.split(':', 1)[0]}://..."
            )
        return v

    @field_validator("broker_url")
    @classmethod
    def _check_broker(cls, v: str) -> str:
        if v and v.split("://", 1)[0] not in SUPPORTED_BROKERS:
            raise ValueError(
                f"COREL_BROKER_URL scheme must be one of {', '.join(SUPPORTED_BROKERS)}; got {v!r}"
            )
        return v

    @property
    def db_url(self) -> str:
        if self.database_url:
            url = self.database_url
            # A bare postgresql:// URL means the psycopg 3 driver installed with the project.
            if url.startswith("postgresql://"):
                url = "postgresql+psycopg://" + url[len("postgresql://") :]
            return url
        return f"sqlite:///{(self.var_dir / 'corel.sqlite3').resolve()}"

    @property
    def artifact_dir(self) -> Path:
        """The local artifact folder (COREL_ARTIFACTS_DIR, or var_dir/artifacts); with S3,
        the local cache of what this host has read."""
        return (self.artifacts_dir or self.var_dir / "artifacts").resolve()

    @property
    def data_dirs(self) -> list[Path]:
        """Where the built-in datasets are looked for, in order."""
        # Normalised (../shared/datasets from `make serve` reads as the folder it names).
        given = [Path(os.path.normpath(Path(p).expanduser())) for p in self.data_dir.split(os.pathsep)
                 if p.strip()]
        return [*given, self.var_dir / "datasets"]

    @property
    def celery_broker_url(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{(self.var_dir / 'broker.sqlite3').resolve()}"

    @property
    def text_threads(self) -> int:
        """api_text_threads, or (0) the CPUs this process may use divided by api_processes."""
        if self.api_text_threads:
            return self.api_text_threads
        return max(1, len(os.sched_getaffinity(0)) // self.api_processes)

    @property
    def is_sqlite(self) -> bool:
        return self.db_url.startswith("sqlite")


def engine_options(settings: Settings) -> EngineOptions:
    """What the training engine takes of the settings (CUDA graphs, corel.native and its
    build directory, where frozen encoders' features are kept: ``var_dir/features``), for ``fit``/``fit_group``'s ``options``: the library reads no
    environment, so settings built in code (a test's, ``create_app(settings)``'s) reach it
    as they are."""
    from corel.train import EngineOptions
    from corel.train.options import parse_cuda_graphs

    return EngineOptions(cuda_graphs=parse_cuda_graphs(settings.cuda_graphs or ""), native=settings.native,
                         native_dir=settings.native_dir or None,
                         features_dir=str((settings.features_dir or settings.var_dir / "features").resolve()))


@lru_cache
def get_settings() -> Settings:
    """This process's settings, read once."""
    return Settings()
