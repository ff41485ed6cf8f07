"""bench/scale_out.py still runs: its smoke mode (a two-member sweep on one worker host and
on two) on a cluster of its own. It builds that cluster itself, so it runs apart from the
module fixture of test_cluster.py (pytest runs this module first; the fixture is not used)."""

from __future__ import annotations

import re

from harness.hosts import cluster_available
from tests.app.stack.test_bench_smoke import smoke
from tests.conftest import require


def test_scale_out_runs_in_its_smoke_mode():
    why = cluster_available()
    require(why is None, f"a cluster of network namespaces ({why})")
    out = smoke("scale_out.py")
    assert "2 host(s) trained it" in out, out[-6000:]
    assert re.search(r"ratio 2 hosts / 1 host: [\d.]+", out), out[-6000:]
