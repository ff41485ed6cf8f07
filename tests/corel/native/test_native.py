"""corel.native's loader: a build is keyed by its source (a stale one never loads), and
native turned off (the engine's options) or a missing build leaves the Python nodes running."""

from __future__ import annotations

import pytest

from corel import native


@pytest.fixture
def fresh(monkeypatch):
    native.forget()
    yield monkeypatch
    native.forget()


def test_the_build_this_environment_made_loads_and_is_used():
    compiled = native.module()
    assert compiled is not None, "corel.native is not built: `python -m corel.native build` (make install)"
    assert native.build_path().exists()
    assert {"gaussian_ar", "leaky_mlp"} <= set(dir(compiled))


def test_a_changed_source_is_a_new_build_path_that_is_not_built(fresh, tmp_path):
    changed = tmp_path / "fused.cpp"
    changed.write_bytes(native.SOURCE.read_bytes() + b"\n// changed\n")
    before = native.build_path()
    fresh.setattr(native, "SOURCE", changed)
    assert native.build_path() != before
    assert native.module() is None  # the old build is not loaded for the new source


def test_native_off_and_another_directory_leave_the_python_nodes(fresh, tmp_path):
    with native.using(False):
        assert native.module() is None
        with native.using(True):  # the innermost choice holds, and ends with its block
            assert native.module() is not None
        assert native.module() is None
    assert native.module() is not None  # the default: on, the environment's build
    with native.using(True, tmp_path):
        assert native.build_path(tmp_path).parent == tmp_path
        assert native.module() is None  # nothing built there
    assert native.module() is not None


def test_each_thread_keeps_its_own_choice(fresh):
    """A worker's training thread turns the nodes off for its run; the API's threads (and
    another run's) keep theirs."""
    import threading

    inside, seen = threading.Event(), threading.Event()
    outside: list[object] = []

    def train_without_native() -> None:
        with native.using(False):
            inside.set()
            seen.wait(10)
            outside.append(native.module())

    thread = threading.Thread(target=train_without_native)
    thread.start()
    assert inside.wait(10)
    assert native.module() is not None  # this thread: the default
    seen.set()
    thread.join(10)
    assert outside == [None]
