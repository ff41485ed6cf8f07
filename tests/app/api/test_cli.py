"""The CLI's service commands against a live HTTP server.

This file holds those of its tests that belong in the API tier (a TestClient, no worker); the
others, and the helpers they share, are in tests/app/stack/test_cli.py."""

from __future__ import annotations

import pytest

from corel.cli import main


def test_errors_are_reported_not_raised(live_url, capsys):
    with pytest.raises(SystemExit, match="404: experiment 987654 does not exist"):
        main(["predict", "--url", live_url, "--experiment", "987654", "--text", "hello"])
    with pytest.raises(SystemExit, match="cannot reach"):
        main(["embed", "--url", "http://127.0.0.1:1", "--experiment", "1", "--text", "x"])
