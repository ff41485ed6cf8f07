"""Prometheus metrics of a worker, served on ``COREL_WORKER_METRICS_PORT`` (0: not served).

They count what this process trains: the server starts when the worker is ready
(``worker.tasks``), and with the default ``solo`` pool the tasks run in that same
process. (A ``prefork`` pool runs them in child processes, whose counts this server
does not see; prometheus_client's multiprocess mode would be needed there.)
"""

from __future__ import annotations

import logging

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

from app.core.models import FINISHED

log = logging.getLogger("corel.worker")

EPOCH_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                 1800.0, 3600.0)


class WorkerMetrics:
    """A worker's training metrics, in a registry of their own (with the process's)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        self.epoch_seconds = Histogram(
            "corel_worker_epoch_duration_seconds",
            "Wall time of one training epoch, validation included (a stacked group's "
            "epoch, all members at once, counts once).",
            buckets=EPOCH_BUCKETS, registry=self.registry)
        self.samples_per_second = Gauge(
            "corel_worker_samples_per_second",
            "Training samples per second in the last epoch (for a stacked group, samples "
            "times members).", registry=self.registry)
        self.epochs = Counter(
            "corel_worker_epochs", "Epochs completed and recorded, one per experiment.",
            registry=self.registry)
        self.finished = Counter(
            "corel_worker_experiments_finished",
            "Experiments this worker finished, by the status they ended in.",
            ["status"], registry=self.registry)
        for status in FINISHED:
            self.finished.labels(status)  # every status shows, at 0 until it happens

    def epoch_done(self, seconds: float, samples: int, members: int = 1) -> None:
        """One epoch recorded, of ``members`` experiments trained together on ``samples``."""
        self.epochs.inc(members)
        self.epoch_seconds.observe(seconds)
        if seconds > 0:
            self.samples_per_second.set(samples * members / seconds)

    def experiment_finished(self, status: str) -> None:
        if status in FINISHED:
            self.finished.labels(status).inc()

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
        log.info("serving metrics", extra={"port": port})


# One per process, like the process it describes.
METRICS = WorkerMetrics()
