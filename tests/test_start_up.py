"""What a process of corel's imports to start: the API (``app.main``), a worker
(``worker.tasks``) and the engine (``corel.train``) import no scikit-learn, SciPy's optimize
or pandas until something clusters (corel.clustering imports them where it computes). Each
``corel serve``, ``corel worker`` and every process a test or a benchmark starts paid 1.6 s
for them (app.main 4.4 s -> 2.9 s on a 2-core AMD EPYC)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

HEAVY = ("sklearn", "scipy.optimize", "pandas")


def loaded_after(code: str) -> list[str]:
    """The HEAVY modules a fresh interpreter holds after running ``code``."""
    check = f"{code}\nimport sys, json\nprint(json.dumps(sorted(m for m in {list(HEAVY)!r} if m in sys.modules)))"
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_api_the_worker_and_the_engine_start_without_the_clustering_libraries():
    assert loaded_after("import app.main, worker.tasks, corel.train") == []
    # The check sees them once something clusters.
    clustered = loaded_after("import numpy as np\nfrom corel.clustering import evaluate_clustering\n"
                             "evaluate_clustering(np.eye(6, 3), np.arange(6) % 2)")
    assert "sklearn" in clustered and "scipy.optimize" in clustered, clustered
