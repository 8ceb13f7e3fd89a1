"""A kubelet (and scheduler) stand-in for the tests: it makes pods in the test API server real.

Every ``interval_s`` it lists the pods of its namespace through the API (the official client,
over HTTP, like a kubelet) and drives each one:

- **Scheduling.** A pod without ``spec.nodeName`` is bound to this one node when its requests
  fit what is left of ``capacity``; otherwise it gets ``PodScheduled=False`` with reason
  ``Unschedulable`` (it is retried every tick).
- **Start.** The container's ``command`` + ``args`` run as a real local process (its own
  session/process group) with the pod's env: literal values, the downward API
  (``status.podIP`` -> ``127.0.0.1``, ``metadata.name``/``namespace``/``uid``,
  ``spec.nodeName``), ``secretKeyRef`` (read through the API); plus ``base_env`` (what the
  image would bake in: PATH, PYTHONPATH). Volumes map to local directories under ``root``: a
  PVC to ``root/pvc/<claim>`` (shared by every pod that mounts it, as a ReadWriteMany volume
  would be), an emptyDir, a secret or a configMap to ``root/pods/<pod>/<volume>`` (secret and
  configMap keys written as files); every occurrence of a mount path in the command and env
  values is rewritten to its local directory, and another pod's emptyDir folder (a master's
  scratch run directory in a node's command) back to the mount path that pod saw, so nothing
  is shared through an emptyDir that a cluster would not share. A Service DNS name of the namespace
  (``<svc>.<namespace>.svc[.cluster.local]``) in the command or env is rewritten to
  ``127.0.0.1``: there is no cluster DNS, and every pod is this host. ``base_env`` may carry
  ``KUBECONFIG`` so that a master pod's client reaches the test API server
  (``KUBERNETES_SERVICE_HOST`` is never set, so the in-cluster config is not tried). An image
  in ``bad_images`` never starts: ``ImagePullBackOff``. stdout and stderr go to
  ``root/logs/<pod>.log`` (the test API server serves them as the pod ``log``).
- **Memory limit.** The process tree's resident memory is sampled every tick; over the
  container's memory limit the group is SIGKILLed and the container reported ``OOMKilled``,
  exit code 137 (what the cgroup OOM killer and the kubelet report).
- **Status.** Phase (Pending, Running, Succeeded, Failed), ``podIP``, conditions and
  ``containerStatuses`` (running, then terminated with exitCode = 128 + signal for a killed
  process, reason Completed/Error/OOMKilled) are written through the ``status`` subresource.
- **Deletion.** A pod with ``deletionTimestamp``: SIGTERM to the group, SIGKILL after
  ``deletionGracePeriodSeconds``; once the process has ended its final status is written and
  the pod deleted with grace 0. A pod that vanished (force-deleted): SIGKILL at once.
- **Resize.** A changed CPU limit is applied (the process's CPU affinity is re-pinned when the
  machine allows it) and reported in ``containerStatuses[].resources``; one above the node's
  capacity is not, and the pod gets ``PodResizePending=True`` with reason ``Infeasible``.
- **Metrics.** ``metrics.k8s.io/v1beta1`` PodMetrics (CPU and memory of the process tree)
  every ``metrics_every_s``, for ``KubernetesBackend.usage``.

What it is not: no cgroups (CPU is not throttled, memory is sampled, so a process can
overshoot its limit by what it allocates within one tick), no images or container filesystem
(the command runs from this machine's filesystem), no network namespaces (every pod is
127.0.0.1, so two pods cannot bind the same port), one node.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import logging
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from dlrover_core.types import NodeResources
from dlrover_core.units import cpu_millicores, memory_mib

log = logging.getLogger(__name__)
POD_IP = "127.0.0.1"


def _now() -> str:
    return dt.datetime.now(tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Proc:
    popen: subprocess.Popen[bytes]
    started_at: str
    memory_limit_mib: int
    cpu_millicores: int
    kill_at: float | None = None
    term_sent: bool = False
    oom: bool = False
    max_rss_mib: float = 0.0
    cpu_samples: list[tuple[float, float]] = field(default_factory=list)
    log_file: Any = None
    infeasible_m: int | None = None  # a resize to this CPU was refused as infeasible


def _requests(pod: dict[str, Any]) -> NodeResources:
    cpu = mem = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        req = (c.get("resources") or {}).get("requests") or {}
        cpu += cpu_millicores(req["cpu"]) if "cpu" in req else 0
        mem += memory_mib(req["memory"]) if "memory" in req else 0
    return NodeResources(cpu, mem)


def _limits(container: dict[str, Any]) -> NodeResources:
    lim = (container.get("resources") or {}).get("limits") or {}
    return NodeResources(
        cpu_millicores(lim["cpu"]) if "cpu" in lim else 0,
        memory_mib(lim["memory"]) if "memory" in lim else 0,
    )


class KubeletStandIn:
    """See the module docstring. ``start()`` runs it in a thread; ``stop()`` ends it and
    SIGKILLs every process it started."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        namespace: str,
        root: Path,
        *,
        node_name: str = "standin-0",
        capacity: NodeResources = NodeResources(64_000, 256 * 1024),
        base_env: dict[str, str] | None = None,
        interval_s: float = 0.1,
        bad_images: frozenset[str] = frozenset(),
        metrics_every_s: float = 1.0,
    ) -> None:
        self.core = k8s.CoreV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.root = Path(root)
        self.node_name = node_name
        self.capacity = capacity
        keep = ("PATH", "PYTHONPATH", "HOME", "LANG", "VIRTUAL_ENV", "TMPDIR")
        self.base_env = (
            base_env if base_env is not None else {k: v for k, v in os.environ.items() if k in keep}
        )
        self.interval_s = interval_s
        self.bad_images = bad_images
        self.metrics_every_s = metrics_every_s
        self.procs: dict[str, _Proc] = {}  # by pod uid
        self.started: set[str] = set()  # pod uids ever started (restartPolicy Never)
        self.exits: dict[str, int] = {}  # pod name -> exit code written (for assertions)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_metrics = 0.0
        self.errors: list[str] = []
        self._names: dict[str, str] = {}  # pod uid -> name
        self._scratch: dict[str, str] = {}  # emptyDir folder -> the mount path its pod saw

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> KubeletStandIn:
        self._thread = threading.Thread(target=self._run, name="kubelet-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.popen.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                p.popen.wait(timeout=5)
            if p.log_file is not None:
                p.log_file.close()
        self.procs.clear()

    def __enter__(self) -> KubeletStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pid_of(self, pod_name: str) -> int | None:
        for uid, p in self.procs.items():
            if self._names.get(uid) == pod_name:
                return p.popen.pid
        return None

    def oom_kill(self, pod_name: str) -> bool:
        """What the kernel's OOM killer does to a container over its cgroup limit, on demand
        (a test's fault): SIGKILL the pod's processes; the pod ends ``OOMKilled`` (137)."""
        for uid, p in list(self.procs.items()):
            if self._names.get(uid) == pod_name and p.popen.poll() is None:
                p.oom = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.popen.pid, signal.SIGKILL)
                return True
        return False

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # keep going: a test asserts on the outcome, not on this
                log.exception("kubelet stand-in tick failed")
                self.errors.append(repr(exc))
            self._stop.wait(self.interval_s)

    # ------------------------------------------------------------------ one pass

    def tick(self) -> None:
        resp = self.core.list_namespaced_pod(self.namespace, _preload_content=False)
        pods = json.loads(resp.data).get("items") or []
        seen: set[str] = set()
        used = NodeResources(0, 0)
        for pod in pods:
            spec = pod.get("spec") or {}
            phase = (pod.get("status") or {}).get("phase")
            if spec.get("nodeName") == self.node_name and phase not in ("Succeeded", "Failed"):
                used = used + _requests(pod)
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            self._names[uid] = pod["metadata"]["name"]
            try:
                used = self._drive(pod, used)
            except ApiException as exc:
                if exc.status != 404:  # deleted meanwhile: fine
                    raise
        for uid in [u for u in self.procs if u not in seen]:  # force-deleted pods
            p = self.procs.pop(uid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.popen.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                p.popen.wait(timeout=5)
            if p.log_file is not None:
                p.log_file.close()
        if time.monotonic() - self._last_metrics >= self.metrics_every_s:
            self._last_metrics = time.monotonic()
            self._publish_metrics(pods)

    def _drive(self, pod: dict[str, Any], used: NodeResources) -> NodeResources:
        meta = pod["metadata"]
        name, uid = meta["name"], meta["uid"]
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        phase = status.get("phase")
        deleting = bool(meta.get("deletionTimestamp"))
        if phase in ("Succeeded", "Failed"):
            if deleting:
                self._force_delete(name)
            return used
        if spec.get("nodeName") != self.node_name:
            if spec.get("nodeName"):
                return used  # someone else's node
            need = _requests(pod)
            if (used + need).fits_in(self.capacity):
                self.core.patch_namespaced_pod(
                    name, self.namespace, {"spec": {"nodeName": self.node_name}}
                )
                self._status(
                    name,
                    {
                        "phase": "Pending",
                        "conditions": [
                            {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}
                        ],
                    },
                )
                return used + need
            free = self.capacity - used
            self._status(
                name,
                {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": f"0/1 nodes are available: insufficient resources "
                            f"(need {need}, free {free})",
                            "lastTransitionTime": _now(),
                        }
                    ],
                },
            )
            return used
        container = (spec.get("containers") or [{}])[0]
        proc = self.procs.get(uid)
        if proc is None and uid not in self.started:
            if deleting:
                self._force_delete(name)
                return used
            if container.get("image") in self.bad_images:
                self._container_status(
                    name,
                    container,
                    "Pending",
                    {"waiting": {"reason": "ImagePullBackOff", "message": "image not found"}},
                )
                return used
            self._start(pod, container)
            return used
        if proc is None:
            return used
        code = proc.popen.poll()
        if code is None:
            self._enforce(name, proc, deleting, meta)
            self._apply_resize(name, container, proc)
            code = proc.popen.poll()
        if code is not None:
            self._finish(pod, container, proc, code)
        return used

    # ------------------------------------------------------------------ steps

    def _start(self, pod: dict[str, Any], container: dict[str, Any]) -> None:
        meta = pod["metadata"]
        name, uid = meta["name"], meta["uid"]
        mounts = self._volumes(pod, container)
        env = dict(self.base_env)
        for e in container.get("env") or []:
            env[e["name"]] = self._env_value(pod, e)
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        # another pod's emptyDir folder in this pod's command (a master's scratch run dir in a
        # node's argv) is the path that pod saw: on a cluster it names nothing shared
        for local, mount_path in sorted(self._scratch.items(), key=lambda kv: -len(kv[0])):
            argv = [_rewrite(a, local, mount_path) for a in argv]
            env = {k: _rewrite(v, local, mount_path) for k, v in env.items()}
        for mount_path, local in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            argv = [_rewrite(a, mount_path, local) for a in argv]
            env = {k: _rewrite(v, mount_path, local) for k, v in env.items()}
        svc = re.compile(
            rf"\b[a-z0-9]([-a-z0-9]*[a-z0-9])?\.{re.escape(self.namespace)}\.svc(\.cluster\.local)?\b"
        )
        argv = [svc.sub(POD_IP, a) for a in argv]
        env = {k: svc.sub(POD_IP, v) for k, v in env.items()}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        out = open(self.root / "logs" / f"{name}.log", "ab")  # noqa: SIM115 (kept open)
        lim = _limits(container)
        try:
            popen = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=str(self.root),
            )
        except OSError as exc:
            out.close()
            self.started.add(uid)
            self._container_status(
                name,
                container,
                "Failed",
                {"terminated": {"exitCode": 128, "reason": "StartError", "message": str(exc)}},
            )
            return
        self.started.add(uid)
        started = _now()
        self.procs[uid] = _Proc(popen, started, lim.memory_mib, lim.cpu_millicores, log_file=out)
        self._container_status(
            name, container, "Running", {"running": {"startedAt": started}}, ready=True
        )

    def _enforce(self, name: str, proc: _Proc, deleting: bool, meta: dict[str, Any]) -> None:
        rss = _tree_rss_mib(proc.popen.pid)
        proc.max_rss_mib = max(proc.max_rss_mib, rss)
        if proc.memory_limit_mib and rss > proc.memory_limit_mib and not proc.oom:
            proc.oom = True
            log.info(
                "stand-in: %s over its memory limit (%.0f > %d MiB): OOM kill",
                name,
                rss,
                proc.memory_limit_mib,
            )
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)
            return
        if deleting and not proc.term_sent:
            proc.term_sent = True
            grace = float(meta.get("deletionGracePeriodSeconds") or 30)
            proc.kill_at = time.monotonic() + grace
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.popen.pid, signal.SIGTERM)
        elif proc.kill_at is not None and time.monotonic() >= proc.kill_at:
            proc.kill_at = None
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.popen.pid, signal.SIGKILL)

    def _apply_resize(self, name: str, container: dict[str, Any], proc: _Proc) -> None:
        lim = _limits(container)
        if lim.cpu_millicores == proc.cpu_millicores or lim.cpu_millicores == proc.infeasible_m:
            return
        if lim.cpu_millicores > self.capacity.cpu_millicores:
            # more than this node has: what a 1.33+ kubelet says, and it keeps the old size
            proc.infeasible_m = lim.cpu_millicores
            self._status(
                name,
                {
                    "conditions": [
                        {
                            "type": "PodResizePending",
                            "status": "True",
                            "reason": "Infeasible",
                            "message": f"Node didn't have enough capacity: cpu, requested: "
                            f"{lim.cpu_millicores}, capacity: {self.capacity.cpu_millicores}",
                        }
                    ]
                },
            )
            return
        proc.cpu_millicores = lim.cpu_millicores
        cpus = sorted(os.sched_getaffinity(0))
        n = max(1, min(len(cpus), -(-lim.cpu_millicores // 1000)))
        with contextlib.suppress(psutil.Error, OSError):
            for p in [
                psutil.Process(proc.popen.pid),
                *psutil.Process(proc.popen.pid).children(True),
            ]:
                p.cpu_affinity(cpus[:n])
        res = container.get("resources") or {}
        self._status(
            name,
            {
                "containerStatuses": [
                    {
                        "name": container.get("name", "node"),
                        "allocatedResources": res.get("requests") or {},
                        "resources": res,
                    }
                ]
            },
        )

    def _finish(
        self, pod: dict[str, Any], container: dict[str, Any], proc: _Proc, code: int
    ) -> None:
        meta = pod["metadata"]
        name, uid = meta["name"], meta["uid"]
        self.procs.pop(uid, None)
        if proc.log_file is not None:
            proc.log_file.close()
        sig = -code if code < 0 else None
        exit_code = 128 + sig if sig is not None else code
        if proc.oom:
            reason, exit_code = "OOMKilled", 137
        else:
            reason = "Completed" if exit_code == 0 else "Error"
        term: dict[str, Any] = {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": proc.started_at,
            "finishedAt": _now(),
        }
        if sig is not None and not proc.oom:
            term["signal"] = sig
        self.exits[name] = exit_code
        with contextlib.suppress(ApiException):  # metrics-server stops reporting an ended pod
            self.custom.delete_namespaced_custom_object(
                "metrics.k8s.io", "v1beta1", self.namespace, "pods", name, _preload_content=False
            )
        self._container_status(
            name, container, "Succeeded" if exit_code == 0 else "Failed", {"terminated": term}
        )
        if meta.get("deletionTimestamp"):
            self._force_delete(name)

    # ------------------------------------------------------------------ API writes

    def _status(self, name: str, status: dict[str, Any]) -> None:
        self.core.patch_namespaced_pod_status(
            name, self.namespace, {"status": status}, _preload_content=False
        )

    def _container_status(
        self,
        name: str,
        container: dict[str, Any],
        phase: str,
        state: dict[str, Any],
        *,
        ready: bool = False,
    ) -> None:
        cs = {
            "name": container.get("name", "node"),
            "image": container.get("image", ""),
            "imageID": "",
            "containerID": f"standin://{name}",
            "ready": ready,
            "started": "running" in state,
            "restartCount": 0,
            "state": state,
        }
        status: dict[str, Any] = {"phase": phase, "containerStatuses": [cs]}
        if phase != "Pending" or "waiting" not in state:
            status.update({"podIP": POD_IP, "hostIP": POD_IP, "podIPs": [{"ip": POD_IP}]})
        if phase == "Running":
            status["startTime"] = _now()
        self._status(name, status)

    def _force_delete(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(
                name, self.namespace, grace_period_seconds=0, _preload_content=False
            )

    def _publish_metrics(self, pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            uid = pod["metadata"]["uid"]
            proc = self.procs.get(uid)
            if proc is None or proc.popen.poll() is not None:
                continue
            now = time.monotonic()
            cpu_s = _tree_cpu_s(proc.popen.pid)
            proc.cpu_samples.append((now, cpu_s))
            proc.cpu_samples = proc.cpu_samples[-2:]
            (t0, c0), (t1, c1) = proc.cpu_samples[0], proc.cpu_samples[-1]
            cores = (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0
            body = {
                "apiVersion": "metrics.k8s.io/v1beta1",
                "kind": "PodMetrics",
                "metadata": {"name": pod["metadata"]["name"], "namespace": self.namespace},
                "timestamp": _now(),
                "window": f"{self.metrics_every_s}s",
                "containers": [
                    {
                        "name": "node",
                        "usage": {
                            "cpu": f"{round(cores * 1e9)}n",
                            "memory": f"{round(_tree_rss_mib(proc.popen.pid) * 1024)}Ki",
                        },
                    }
                ],
            }
            args = ("metrics.k8s.io", "v1beta1", self.namespace, "pods")
            try:
                self.custom.replace_namespaced_custom_object(
                    *args, pod["metadata"]["name"], body, _preload_content=False
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
                self.custom.create_namespaced_custom_object(*args, body, _preload_content=False)

    # ------------------------------------------------------------------ env and volumes

    def _env_value(self, pod: dict[str, Any], e: dict[str, Any]) -> str:
        if "value" in e:
            return str(e["value"])
        src = e.get("valueFrom") or {}
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            fields = {
                "status.podIP": POD_IP,
                "status.hostIP": POD_IP,
                "metadata.name": pod["metadata"]["name"],
                "metadata.namespace": self.namespace,
                "metadata.uid": pod["metadata"]["uid"],
                "spec.nodeName": self.node_name,
                "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", ""),
            }
            return fields.get(path, "")
        if "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            return self._secret(ref["name"]).get(ref["key"], "")
        return ""

    def _secret(self, name: str) -> dict[str, str]:
        resp = self.core.read_namespaced_secret(name, self.namespace, _preload_content=False)
        data = json.loads(resp.data).get("data") or {}
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    def _configmap(self, name: str) -> dict[str, bytes]:
        resp = self.core.read_namespaced_config_map(name, self.namespace, _preload_content=False)
        cm = json.loads(resp.data)
        out = {k: str(v).encode() for k, v in (cm.get("data") or {}).items()}
        out.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
        return out

    def _volumes(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        name = pod["metadata"]["name"]
        by_name = {v["name"]: v for v in (pod.get("spec") or {}).get("volumes") or []}
        out: dict[str, str] = {}
        for m in container.get("volumeMounts") or []:
            vol = by_name.get(m["name"]) or {}
            if "persistentVolumeClaim" in vol:
                local = self.root / "pvc" / vol["persistentVolumeClaim"]["claimName"]
            else:
                local = self.root / "pods" / name / m["name"]
            local.mkdir(parents=True, exist_ok=True)
            if "emptyDir" in vol:
                self._scratch[str(local)] = m["mountPath"].rstrip("/")
            if "secret" in vol:
                for k, v in self._secret(vol["secret"]["secretName"]).items():
                    (local / k).write_text(v)
            if "configMap" in vol:
                for k, b in self._configmap(vol["configMap"]["name"]).items():
                    (local / k).write_bytes(b)
            out[m["mountPath"].rstrip("/")] = str(local)
        return out


def _rewrite(s: str, mount_path: str, local: str) -> str:
    if mount_path not in s:
        return s
    out = []
    i = 0
    while True:
        j = s.find(mount_path, i)
        if j < 0:
            out.append(s[i:])
            break
        end = j + len(mount_path)
        if end == len(s) or s[end] in "/:;, ":
            out.append(s[i:j] + local)
        else:
            out.append(s[i:end])
        i = end
    return "".join(out)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _tree_rss_mib(pid: int) -> float:
    total = 0
    for p in _tree(pid):
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total / (1024.0 * 1024.0)


def _tree_cpu_s(pid: int) -> float:
    total = 0.0
    for p in _tree(pid):
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total
