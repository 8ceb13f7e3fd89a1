"""The provider is found the way Airflow finds it: the ``apache_airflow_provider`` entry point
(as the project declares it, and in a built wheel, which installs only ``dlrover_core`` and
``dlrover_rm``: nothing that shadows a user's ``operators/`` or ``components/``)."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("airflow")

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINT = "dlrover_rm.operators.provider:get_provider_info"


def _provider_info() -> dict:
    """Load the entry point pyproject.toml declares (the installed metadata of a shared
    editable install may predate it)."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    eps = meta["project"]["entry-points"]["apache_airflow_provider"]
    assert eps == {"provider_info": ENTRY_POINT}
    mod, _, fn = eps["provider_info"].partition(":")
    return getattr(importlib.import_module(mod), fn)()


@pytest.mark.slow
def test_the_wheel_installs_two_import_names_and_the_provider_entry_point(
    tmp_path: Path,
) -> None:
    # build from a copy: setuptools writes build/ and *.egg-info next to the sources
    src = tmp_path / "src"
    src.mkdir()
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for name in (
        "pyproject.toml", "README.md", "dlrover_core", "dlrover_rm", "components", "operators",
        "pipelines",
    ):  # fmt: skip
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=junk)
        else:
            shutil.copy2(ROOT / name, src / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (whl,) = tmp_path.glob("dlrover_rm-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"dlrover_core", "dlrover_rm"}, tops
    (ep,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(whl).read(ep).decode()
    assert f"[apache_airflow_provider]\nprovider_info = {ENTRY_POINT}" in text, text
    for path in (
        "dlrover_rm/operators/provider.py",
        "dlrover_rm/components/train/component.py",
        "dlrover_rm/pipelines/specs/small.yaml",  # the CLI's demo spec
        "dlrover_rm/pipelines/kfp_recurring_retrain_k8s.yaml",
        "dlrover_core/history/migrations/alembic.ini",
    ):
        assert path in names, path


def test_entry_point_gives_the_provider_info() -> None:
    info = _provider_info()
    assert info["package-name"] == "dlrover-rm"
    assert info["versions"]


def test_listed_modules_and_connection_hook_import() -> None:
    info = _provider_info()
    for kind in ("operators", "hooks", "triggers"):
        for entry in info[kind]:
            for mod in entry["python-modules"]:
                importlib.import_module(mod)
    (ct,) = info["connection-types"]
    mod, _, cls = ct["hook-class-name"].rpartition(".")
    hook = getattr(importlib.import_module(mod), cls)
    assert hook.conn_type == ct["connection-type"] == "dlrover"


def test_hook_without_connection_is_a_cold_start() -> None:
    from dlrover_rm.operators.hooks import DLRoverHook

    hook = DLRoverHook(dlrover_conn_id=None)
    assert hook.history_url is None
    assert hook.overrides(["a.b=1"]) == ["a.b=1"]


def test_hook_reads_history_and_backend_from_the_connection(monkeypatch) -> None:
    from airflow.sdk import Connection

    from dlrover_rm.operators.hooks import DLRoverHook

    conn = Connection(
        conn_id="dlrover_x",
        conn_type="dlrover",
        host="sqlite:////tmp/h.db",
        extra='{"backend": "local", "overrides": ["quota.cpu=4"]}',
    )
    monkeypatch.setattr(DLRoverHook, "get_connection", classmethod(lambda cls, cid: conn))
    hook = DLRoverHook(dlrover_conn_id="dlrover_x")
    assert hook.history_url == "sqlite:////tmp/h.db"
    assert hook.overrides(["quota.cpu=2"]) == ["backend.kind=local", "quota.cpu=4", "quota.cpu=2"]


def test_connection_form_is_declarative() -> None:
    from dlrover_rm.operators.hooks import DLRoverHook
    from dlrover_rm.operators.provider import get_provider_info

    (ct,) = get_provider_info()["connection-types"]
    assert "history_url" in ct["conn-fields"]
    assert ct["conn-fields"]["history_url"]["schema"]["format"] == "password"  # kept secret
    assert "password" in ct["ui-field-behaviour"]["hidden-fields"]
    assert "get_ui_field_behaviour" not in DLRoverHook.__dict__  # the deprecated hook method


def test_test_connection(monkeypatch, tmp_path) -> None:
    from dlrover_rm.operators.hooks import DLRoverHook

    url = f"sqlite:///{tmp_path / 'h.db'}"
    monkeypatch.setattr(DLRoverHook, "history_url", property(lambda self: url))
    ok, msg = DLRoverHook().test_connection()
    assert ok and "0 run(s)" in msg
    bad = "postgresql://u:secret@127.0.0.1:1/x"
    monkeypatch.setattr(DLRoverHook, "history_url", property(lambda self: bad))
    ok, msg = DLRoverHook().test_connection()
    assert not ok and "secret" not in msg and "unavailable" in msg
