"""Shared test set-up: make ``tests.factories`` importable however pytest is started."""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated_history_store(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs record into (and plans read from) a fresh SQLite store per test, never ~/.dlrover-rm."""
    d = tmp_path_factory.mktemp("history")
    monkeypatch.setenv("DLROVER_RM_HISTORY", f"sqlite:///{d / 'history.db'}")
