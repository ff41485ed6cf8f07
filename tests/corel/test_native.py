"""corel.native's loader: a build is keyed by its source (a stale one never loads), and
COREL_NATIVE=0 (or off, false, no) or a missing build leaves the Python nodes running."""

from __future__ import annotations

import pytest

from corel import native


@pytest.fixture
def fresh(monkeypatch):
    native.module.cache_clear()
    yield monkeypatch
    native.module.cache_clear()


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


def test_corel_native_0_and_another_directory_leave_the_python_nodes(fresh, tmp_path):
    for off in ("0", "false", "Off", " no "):  # the words the service's settings read as off
        fresh.setenv("COREL_NATIVE", off)
        assert native.module() is None, off
        native.module.cache_clear()
    for on in ("", "1", "true"):  # empty, as unset, is on: the build loads
        fresh.setenv("COREL_NATIVE", on)
        assert native.module() is not None, on
        native.module.cache_clear()
    fresh.delenv("COREL_NATIVE")
    fresh.setenv("COREL_NATIVE_DIR", str(tmp_path))
    assert native.build_path().parent == tmp_path
    assert native.module() is None
