"""Fixtures for the tests beside the components (``components/<name>/test_*.py``).

They live outside ``tests/``, so ``tests/conftest.py`` does not reach them: the fresh history
store per test is set here too, and the one real profile run that the profile and plan
tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

SPEC_YAML = (Path(__file__).resolve().parents[1] / "pipelines" / "specs" / "small.yaml").read_text()


@pytest.fixture(autouse=True)
def _isolated_history_store(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs record into (and plans read from) a fresh SQLite store per test, never ~/.dlrover-rm."""
    d = tmp_path_factory.mktemp("history")
    monkeypatch.setenv("DLROVER_RM_HISTORY", f"sqlite:///{d / 'history.db'}")


@pytest.fixture(scope="session")
def samples_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real profile run of small.yaml (2 configurations, ~20 s), shared by the profile and
    plan components' tests."""
    pytest.importorskip("kfp")
    from kfp.dsl import Dataset

    from dlrover_rm.components.profile.component import dlrover_profile

    tmp = tmp_path_factory.mktemp("profile")
    samples = Dataset(name="samples.csv", uri=str(tmp / "samples.csv"))
    with pytest.MonkeyPatch.context() as mp:  # before any test's own store: one of its own
        mp.setenv("DLROVER_RM_HISTORY", f"sqlite:///{tmp / 'history.db'}")
        n = dlrover_profile.python_func(
            spec_yaml=SPEC_YAML,
            samples=samples,
            overrides=["data.rows=20000", "data.eval_rows=2000"],
            n_configs=2,
        )
    assert n == 2
    return Path(samples.path)
