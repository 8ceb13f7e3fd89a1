"""The job's durable files at ``backend.state_url`` (fsspec) when no claim is shared.

With ``backend.kind: kubernetes``, ``state_url`` and no ``state_pvc``, every pod's
``state_mount_path`` is scratch (an ``emptyDir``): what must outlive a pod is copied to the URL
under the same relative path (``<state_url>/runs/<job>/...`` for
``<state_mount_path>/runs/<job>/...``):

- a PS node pushes its checkpoint directory when it exits (its final checkpoint is written on
  SIGTERM), and pulls it (and the old set's, when it re-shards) before it starts;
- the master pulls the PS checkpoints before it exports the model, then pushes the exported
  model and ``report.json``/``report.png``/``master.json``; the report names both URLs
  (``run_url``, ``model_url``), which a KFP task or an Airflow operator reads back.

The key mapping is pure (:func:`state_key`); the copies are IO at the edge.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from dlrover_core.errors import InputError

ENV_STATE_DIR = "DLROVER_RM_STATE_DIR"  # the same names as runtime/backends/kubernetes_pods
ENV_STATE_URL = "DLROVER_RM_STATE_URL"
ENV_STATE_MOUNT = "DLROVER_RM_STATE_MOUNT"
ENV_TOKEN = "DLROVER_RM_TOKEN"
DEFAULT_MOUNT = "/var/lib/dlrover-rm"
RUN_FILES = ("report.json", "report.png", "master.json")


def state_key(path: str | os.PathLike[str], mount_path: str) -> str | None:
    """The relative key of ``path`` under ``mount_path`` (``None`` when it is not under it)."""
    p, m = PurePosixPath(os.fspath(path)), PurePosixPath(mount_path)
    try:
        rel = p.relative_to(m)
    except ValueError:
        return None
    return rel.as_posix() if rel.parts else ""


def join(url: str, key: str) -> str:
    """``url`` + ``/`` + ``key`` (no doubled slash; an empty key is the URL itself)."""
    return url.rstrip("/") + ("/" + key.strip("/") if key.strip("/") else "")


def url_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The state URL a node pod should copy its durable files to: set, and no shared volume."""
    e = os.environ if env is None else env
    url = e.get(ENV_STATE_URL)
    return url if url and not e.get(ENV_STATE_DIR) else None


def _fs(url: str):  # type: ignore[no-untyped-def]
    try:
        import fsspec
    except ImportError:
        raise InputError(
            f"backend.state_url {url!r} needs fsspec: install dlrover-rm[data]"
        ) from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise InputError(
            f"backend.state_url {url!r} cannot be opened ({e}); install its fsspec backend "
            "(s3fs for s3://, gcsfs for gs://)"
        ) from None


def _durable(p: Path) -> bool:
    """Files worth keeping: not a lock, not a temporary (dot-files are both here)."""
    return p.is_file() and not p.name.startswith(".")


def push_tree(local: str | os.PathLike[str], url: str, *, mirror: bool = False) -> int:
    """Copy every durable file under ``local`` to ``url`` (same relative paths); manifests
    (``.json``) after the data they describe, so a reader never sees one without its data.
    With ``mirror``, files at ``url`` that ``local`` no longer has (pruned checkpoints) are
    removed after the copy, manifests first. Returns how many files were copied (0 when
    ``local`` does not exist)."""
    root = Path(local)
    if not root.is_dir():
        return 0
    files = sorted(
        (p for p in root.rglob("*") if _durable(p)), key=lambda p: (p.suffix == ".json", str(p))
    )
    names = [p.relative_to(root).as_posix() for p in files]
    n = push_files(root, names, url)
    if mirror and names:
        fs, base = _fs(url)
        base = base.rstrip("/")
        keep = {join(base, k) for k in names}
        stale = [f for f in fs.find(base) if f.rstrip("/") != base and f not in keep]
        for f in sorted(stale, key=lambda f: (not f.endswith(".json"), f)):
            fs.rm_file(f)
    return n


def push_files(root: str | os.PathLike[str], names: Iterable[str], url: str) -> int:
    """Copy ``root/<name>`` to ``url/<name>`` for each name that exists; returns the count."""
    fs, base = _fs(url)
    n = 0
    for name in names:
        src = Path(root) / name
        if not src.is_file():
            continue
        dst = join(base, name)
        fs.makedirs(dst.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(str(src), dst)
        n += 1
    return n


def pull_tree(url: str, local: str | os.PathLike[str]) -> int:
    """Copy every file under ``url`` into ``local`` (same relative paths); manifests last.
    Returns how many files were copied (0 when nothing is there)."""
    fs, base = _fs(url)
    if not fs.exists(base):
        return 0
    base = base.rstrip("/")
    found = [f for f in fs.find(base) if f.rstrip("/") != base]
    found.sort(key=lambda f: (f.endswith(".json"), f))
    n = 0
    for f in found:
        rel = f[len(base) :].lstrip("/")
        if not rel or any(part in ("", ".", "..") for part in rel.split("/")):
            continue
        dst = Path(local) / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(f, str(dst))
        n += 1
    return n


def read_text(url: str) -> str:
    """The text at ``url`` (UTF-8)."""
    fs, path = _fs(url)
    with fs.open(path, "rb") as f:
        data: bytes = f.read()
    return data.decode("utf-8")


def write_token(run_dir: str | os.PathLike[str], token: str) -> None:
    """The job token (from its Secret) as ``run_dir/token`` (owner-only), unless it is there:
    with no shared volume each pod writes the one token every pod gets from the Secret."""
    p = Path(run_dir) / "token"
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists():
        return
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)


def pull_file(url: str, local: str | os.PathLike[str]) -> bool:
    """Copy the file at ``url`` to ``local``; False when there is none."""
    fs, path = _fs(url)
    if not fs.isfile(path):
        return False
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    fs.get_file(path, str(local))
    return True


def stage_dataset(local: str | os.PathLike[str], backend: Any, job: str) -> str:
    """Copy a dataset this process holds (a KFP launcher's download of an ``Input[Dataset]``)
    into the job's shared storage, where every pod of the job reads it; returns the path or URL
    to give as ``data.path``. With ``backend.state_url`` and no claim:
    ``<state_url>/datasets/<job>/<name>``; else ``<state_mount_path>/datasets/<job>/<name>``,
    the claim mounted here at the path the pods mount it."""
    import shutil

    src = Path(local)
    if not src.exists():
        raise InputError(f"the dataset {str(src)!r} does not exist here; nothing to stage")
    name = src.name or "data"
    key = f"datasets/{job}"
    if backend.state_url and not backend.state_pvc:
        dst = join(backend.state_url, key)
        if src.is_dir():
            push_tree(src, join(dst, name))
        else:
            push_files(src.parent, [src.name], dst)
        return join(dst, name)
    mount = Path(backend.state_mount_path)
    if not mount.is_dir():
        raise InputError(
            f"the dataset cannot reach the job's pods: mount claim "
            f"{backend.state_pvc or '<job>-state'} in this task at {mount} (kfp-kubernetes "
            "mount_pvc), or set backend.state_url (an fsspec URL the pods can read)"
        )
    final = mount / key / name
    tmp = mount / key / f".{name}.{os.getpid()}.tmp"
    final.parent.mkdir(parents=True, exist_ok=True)
    if tmp.exists():
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
    if src.is_dir():
        shutil.copytree(src, tmp)
    else:
        shutil.copy2(src, tmp)
    if final.is_dir():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return str(final)
