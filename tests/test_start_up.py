"""What a process of corel's imports to start: the API (``app.main``), a worker
(``worker.tasks``) and the engine (``corel.train``) import no scikit-learn, SciPy's optimize
or pandas until something clusters (corel.clustering imports them where it computes). Each
``corel serve``, ``corel worker`` and every process a test or a benchmark starts paid 1.6 s
for them (app.main 4.4 s -> 2.9 s on a 2-core AMD EPYC).

``corel worker`` is two interpreters: the command reads the settings (the queue, the
worker's niceness and environment), then becomes Celery's worker, which imports torch. The
first no longer imports torch (the settings' image bound came from ``corel.data``'s package,
which imports it: 1.8 s of every worker's start), and the CLI's own commands no longer
import the ORM (the client commands' Status came from ``app.core.models``): ``corel --help``
1.2 -> 0.6 s."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

HEAVY = ("sklearn", "scipy.optimize", "pandas")


def loaded_after(code: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    """The ``heavy`` modules a fresh interpreter holds after running ``code``."""
    check = f"{code}\nimport sys, json\nprint(json.dumps(sorted(m for m in {list(heavy)!r} if m in sys.modules)))"
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_api_the_worker_and_the_engine_start_without_the_clustering_libraries():
    # ... nor when they read digits (its file read as scikit-learn reads it: importing
    # sklearn.datasets cost each process that trained on digits about a second).
    assert loaded_after("import app.main, worker.tasks, corel.train\n"
                        "from corel.data import load_dataset, training_images\n"
                        "from corel.spec import ExperimentSpec\n"
                        "load_dataset(ExperimentSpec(dataset='digits'))\ntraining_images('digits')") == []
    # The check sees them once something clusters.
    clustered = loaded_after("import numpy as np\nfrom corel.clustering import evaluate_clustering\n"
                             "evaluate_clustering(np.eye(6, 3), np.arange(6) % 2)")
    assert "sklearn" in clustered and "scipy.optimize" in clustered, clustered


def test_the_worker_command_starts_without_torch_and_the_cli_without_the_orm():
    """What ``corel worker`` runs before it becomes Celery's worker (app/cli/service.py's
    ``_worker``): the CLI with the service's commands, the settings, the worker's environment."""
    launcher = ("from corel.cli import build_parser\nbuild_parser()\n"
                "from app.core.settings import get_settings\nget_settings()\n"
                "from app.jobs.workers import worker_environ\nfrom app.cli.service import worker_command\n"
                "worker_command()")
    assert loaded_after(launcher, ("torch",)) == []
    assert loaded_after("from corel.cli import build_parser\nbuild_parser()", ("torch", "app.core.models")) == []
    # The check sees them where they are imported.
    assert loaded_after("import worker.tasks", ("torch", "app.core.models")) == ["app.core.models", "torch"]


def test_a_serve_that_refuses_the_network_says_so_before_importing_torch_and_the_app():
    """``corel serve --host 0.0.0.0`` with no token and no users refuses (exit 2,
    tests/app/api/test_users.py); it used to import torch and the app first (6.4 -> 1.7 s on a
    2-core AMD EPYC with AVX2)."""
    refusal = ("import os, tempfile, argparse\nd = tempfile.mkdtemp()\n"
               "for name in ('COREL_API_TOKEN', 'COREL_BROKER_URL'):\n    os.environ.pop(name, None)\n"
               "os.environ.update(COREL_DATABASE_URL=f'sqlite:///{d}/corel.sqlite3', COREL_VAR_DIR=d)\n"
               "from app.cli.service import _serve\n"
               "code = _serve(argparse.Namespace(host='0.0.0.0', port=0, no_worker=True))\n"
               "assert code == 2, code")
    assert loaded_after(refusal, ("torch", "app.main", "uvicorn")) == []
