"""bench/cnn_rows.py --state: the paper's CNN rows stopped part-way (a GPU machine held for
less time than 150 epochs take) and resumed by a later launch end exactly where the same
rows trained without a break end."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "bench" / "cnn_rows.py"
_spec = importlib.util.spec_from_file_location("cnn_rows", SCRIPT)
assert _spec is not None and _spec.loader is not None
cnn_rows = sys.modules["cnn_rows"] = importlib.util.module_from_spec(_spec)  # (its dataclass looks it up)
_spec.loader.exec_module(cnn_rows)
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def launch(out: Path, *flags: str) -> str:
    cmd = [sys.executable, str(SCRIPT), "launch", "--out", str(out), "--datasets", "digits",
           "--epochs", "5", *flags]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exit status" not in done.stdout and "failed" not in done.stdout, done.stdout
    return done.stdout


def here(out: Path, *flags: str) -> None:
    """The same launch's runs in this process (``--in-process``: each process's ``run`` or
    ``run-group``, one after another): the reference, and a state to resume from, without
    a process a row."""
    cnn_rows.main(["launch", "--out", str(out), "--datasets", "digits", "--epochs", "5", *flags,
                   "--in-process"])


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def epochs(path: Path) -> dict[tuple[str, int], dict]:
    """Each run's per-epoch lines, without their wall time."""
    return {(r["job"], r["epoch"]): {k: v for k, v in r.items() if k != "seconds"}
            for r in lines(path) if not r.get("final")}


# Wall times, and what says which launch wrote a line.
UNTIMED = {"seconds", "wall_s", "seconds_per_epoch", "resumed_at_epoch"}


def last_finals(path: Path) -> dict[str, dict]:
    return {r["job"]: {k: v for k, v in r.items() if k not in UNTIMED}
            for r in lines(path) if r.get("final")}


@pytest.mark.parametrize("layout", [
    # Center's buffers (its centers) resume too; on 8x8 digits at lr 1e-4 its runs stay at
    # chance, and the guard must fail them at the third epoch, counted across the break.
    ["--losses", "center", "gaussian", "--seeds", "0", "1", "--stack-seeds"],
    ["--losses", "cosine", "--seeds", "0"],
], ids=["stacked-seeds", "one-run-a-process"])
def test_stopped_rows_resume_to_the_uninterrupted_result(tmp_path, layout):
    straight, broken, state = tmp_path / "straight.jsonl", tmp_path / "broken.jsonl", tmp_path / "state"
    here(straight, *layout)  # without a break (the processes' own code, in this one)
    first = launch(broken, *layout, "--until-epoch", "2", "--state", str(state))
    assert "ending every run at epoch 2" in first
    saved = sorted(p.name for p in state.iterdir())
    assert saved and all(name.endswith(".pt") for name in saved), saved
    stopped = {r["job"]: r for r in lines(broken) if r.get("final")}
    assert {r["epochs_done"] for r in stopped.values()} == {2}
    assert {r["resumed_at_epoch"] for r in stopped.values()} == {0}

    second = launch(broken, *layout, "--state", str(state))
    assert "left alone" not in second  # every saved row belongs to a process of this launch
    # Epochs 3 on were trained by the second launch from the saved state alone, and are
    # those of the launch without a break, number for number.
    got, want = epochs(broken), epochs(straight)
    assert sum(not r.get("final") for r in lines(broken)) == len(got)  # each epoch trained once
    assert sorted(got) == sorted(want) and max(e for _, e in got) >= 3
    for key in sorted(want):
        assert got[key] == want[key], key
    # So are the final lines: test accuracy at the best-validation epoch, the clustering
    # of its latent space, or the guard's verdict.
    finals, direct = last_finals(broken), last_finals(straight)
    assert finals == direct and sorted(finals) == sorted(stopped)
    assert any("test_accuracy" in r for r in direct.values())
    resumed = {r["job"]: r for r in lines(broken) if r.get("final")}  # the last of each job
    for job, row in resumed.items():
        assert row["resumed_at_epoch"] == 2
        assert row["wall_s"] > stopped[job]["wall_s"]  # both sessions' wall time

    # The table reads each run's last final line: the resumed ones.
    assert table(broken) == table(straight)
    assert "| 1 | 2 of 5 |" not in table(broken) and "of 5" in table(broken)


def table(path: Path) -> str:
    """The script's Markdown table of a results file, wall times cut off."""
    return "\n".join(line.rsplit("|", 2)[0] if line.startswith("| digits/cnn | ") and "wall" not in line
                     else line for line in cnn_rows.table(path).splitlines())


def test_state_of_another_layout_is_named_not_used(tmp_path):
    """A state saved with --stack-seeds is not that of one-run processes: the launch says
    which files it leaves alone, and those runs start from the beginning."""
    state = tmp_path / "state"
    here(tmp_path / "a.jsonl", "--losses", "cce", "--seeds", "0", "1", "--stack-seeds",
         "--until-epoch", "1", "--state", str(state))
    out = launch(tmp_path / "b.jsonl", "--losses", "cce", "--seeds", "0", "1",
                 "--until-epoch", "1", "--state", str(state))
    assert "left alone, of no process of this launch: digits_cnn_cce_seed0_fp32_digits_cnn_cce_seed1_fp32.pt" in out
    assert {r["resumed_at_epoch"] for r in lines(tmp_path / "b.jsonl") if r.get("final")} == {0}
