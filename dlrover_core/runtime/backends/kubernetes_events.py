"""Kubernetes Events of the job master, so that ``kubectl describe pod`` and ``kubectl get
events`` show why the master relaunched, resized or stopped a node and what it planned.

:func:`event_body` (pure) builds one Event; :class:`EventSender` queues them and sends them from
a thread of its own (the control loop never waits on them); best effort: an API error is
logged, a full queue drops the event (:attr:`EventSender.dropped`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import queue
import threading
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from dlrover_core.runtime.backends.kubernetes_api import _describe

log = logging.getLogger("dlrover_core.runtime.backends.kubernetes")

QUEUE_SIZE = 256


def event_body(
    namespace: str,
    obj: dict[str, Any],
    reason: str,
    message: str,
    warning: bool,
    now: _dt.datetime,
) -> dict[str, Any]:
    """The Event on ``obj`` (its apiVersion, kind, name and perhaps uid) at ``now``."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{obj['name']}.{int(now.timestamp() * 1e6):x}",
            "namespace": namespace,
        },
        "involvedObject": {**obj, "namespace": namespace},
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": "dlrover-rm-master"},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventSender:
    """Sends queued Events from a thread of its own (started on the first one)."""

    def __init__(self, core: k8s.CoreV1Api, namespace: str, timeout: float) -> None:
        self.core = core
        self.namespace = namespace
        self.timeout = timeout
        self.dropped = 0
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=QUEUE_SIZE)
        self._sender: threading.Thread | None = None
        self._lock = threading.Lock()

    def post(self, obj: dict[str, Any], reason: str, message: str, warning: bool) -> None:
        """Queue an Event on ``obj``; never blocks (a full queue drops it)."""
        now = _dt.datetime.now(tz=_dt.UTC)
        try:
            self._queue.put_nowait(event_body(self.namespace, obj, reason, message, warning, now))
        except queue.Full:
            self.dropped += 1
            return
        with self._lock:
            if self._sender is None or not self._sender.is_alive():
                self._sender = threading.Thread(
                    target=self._send, name="kubernetes-backend-events", daemon=True
                )
                self._sender.start()

    def _send(self) -> None:
        while True:
            body = self._queue.get()
            if body is None:
                return
            try:
                self.core.create_namespaced_event(
                    self.namespace,
                    body,
                    _request_timeout=self.timeout,
                    _preload_content=False,
                )
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
                log.info(
                    "could not record event %s on %s: %s",
                    body["reason"],
                    body["involvedObject"]["name"],
                    _describe(exc),
                )

    def flush(self, timeout_s: float) -> None:
        """Send what is queued (at most ``timeout_s``), then end the sender thread."""
        sender = self._sender
        if sender is None or not sender.is_alive():
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout_s)
        sender.join(timeout=timeout_s)
