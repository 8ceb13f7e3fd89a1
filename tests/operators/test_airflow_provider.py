"""The provider is found the way Airflow finds it: the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

import pytest

pytest.importorskip("airflow")


def _provider_info() -> dict:
    (ep,) = [
        e for e in entry_points(group="apache_airflow_provider") if e.module == "operators.provider"
    ]
    return ep.load()()


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
    from operators.hooks import DLRoverHook

    hook = DLRoverHook(dlrover_conn_id=None)
    assert hook.history_url is None
    assert hook.overrides(["a.b=1"]) == ["a.b=1"]


def test_hook_reads_history_and_backend_from_the_connection(monkeypatch) -> None:
    from airflow.sdk import Connection

    from operators.hooks import DLRoverHook

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
    from operators.hooks import DLRoverHook
    from operators.provider import get_provider_info

    (ct,) = get_provider_info()["connection-types"]
    assert "history_url" in ct["conn-fields"]
    assert ct["conn-fields"]["history_url"]["schema"]["format"] == "password"  # kept secret
    assert "password" in ct["ui-field-behaviour"]["hidden-fields"]
    assert "get_ui_field_behaviour" not in DLRoverHook.__dict__  # the deprecated hook method


def test_test_connection(monkeypatch, tmp_path) -> None:
    from operators.hooks import DLRoverHook

    url = f"sqlite:///{tmp_path / 'h.db'}"
    monkeypatch.setattr(DLRoverHook, "history_url", property(lambda self: url))
    ok, msg = DLRoverHook().test_connection()
    assert ok and "0 run(s)" in msg
    bad = "postgresql://u:secret@127.0.0.1:1/x"
    monkeypatch.setattr(DLRoverHook, "history_url", property(lambda self: bad))
    ok, msg = DLRoverHook().test_connection()
    assert not ok and "secret" not in msg and "unavailable" in msg
