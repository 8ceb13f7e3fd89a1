"""The component image built from the repository's Dockerfile, unchanged, with Debian's container
builder (buildah, rootful, vfs storage, chroot isolation), then checked inside: the CLI, the KFP
components and Kubernetes backend imports, torch (the CPU build) and torchrec, and a plan of the
example spec. Slow (a few minutes; about 2 here); skipped, with the reason, where buildah or
debootstrap is missing or cannot run.

No base image can be pulled here, so the Dockerfile's ``FROM python:3.11-slim`` resolves to a
stand-in built by this test: Debian bookworm (debootstrap, its python3 is 3.11) with a virtual
environment at /usr/local/python whose ``python`` and ``pip`` come first on PATH, as in the
official image. It lives in a buildah storage of this test's own (under the temp dir), cached
by a key of its recipe. The build sees this machine's pip configuration (its local wheels and
indexes, its constraint and CA files, bind-mounted read-only, nothing of them kept in the image)
and two retries per request, so the Dockerfile's ``--index-url https://download.pytorch.org/whl/cpu``
(unreachable here) costs seconds; torch's CPU wheel then comes from the local wheels.
buildah's default OCI isolation cannot run here (crun: "cgroups in hybrid mode not supported"),
so every step runs with chroot isolation."""

from __future__ import annotations

import configparser
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.install.checkout import copy_checkout

ROOT = Path(__file__).resolve().parents[2]
TAG = "localhost/dlrover-rm:0.1.0"
# the stand-in for the Dockerfile's base image
BASE_FROM = "python:3.11-slim"
BASE_NAME = "docker.io/library/python:3.11-slim"
SUITE = "bookworm"
MIRROR = os.environ.get("DLROVER_RM_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = "python3,python3-venv,ca-certificates"
VENV = "/usr/local/python"
BASE_ENV = [f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG=C.UTF-8"]  # fmt: skip
STORE = Path(tempfile.gettempdir()) / "dlrover-rm-image-build"
BUILDAH = ["buildah", "--root", str(STORE / "storage"), "--runroot", str(STORE / "run"),
           "--storage-driver", "vfs"]  # fmt: skip
ISOLATION = ["--isolation", "chroot"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


def buildah(*args: str, timeout: float = 600, check: bool = True) -> str:
    r = subprocess.run([*BUILDAH, *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode:
        pytest.fail(f"buildah {shlex.join(args)}: exit {r.returncode}\n{r.stderr[-4000:]}")
    return r.stdout.strip()


def skip_reason() -> str | None:
    """Why this machine cannot build the image, in one line; None when it can."""
    missing = [t for t in ("buildah", "debootstrap") if not shutil.which(t)]
    if missing:
        return f"{' and '.join(missing)} not installed (apt-get install buildah debootstrap)"
    if os.geteuid() != 0:
        return "building the base image needs root (debootstrap, rootful buildah)"
    STORE.mkdir(exist_ok=True)
    try:
        r = subprocess.run([*BUILDAH, "from", "scratch"], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"buildah cannot run here: {e}"
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return f"buildah cannot run here: {last}"
    subprocess.run([*BUILDAH, "rm", r.stdout.strip()], capture_output=True, timeout=120)
    return None


def image_exists(name: str) -> bool:
    r = subprocess.run([*BUILDAH, "inspect", "--type", "image", name], capture_output=True,
                       timeout=120)  # fmt: skip
    return r.returncode == 0


def base_image(work: Path) -> str:
    """The stand-in base image, built once per recipe (its key names the tag), tagged as the
    name the Dockerfile's FROM resolves to in this test's storage."""
    recipe = repr((SUITE, MIRROR, PACKAGES, VENV, BASE_ENV, 1))
    tag = f"localhost/dlrover-rm-test-base:{hashlib.sha256(recipe.encode()).hexdigest()[:16]}"
    if not image_exists(tag):
        rootfs = work / "rootfs"
        r = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", SUITE, str(rootfs),
             MIRROR], capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        assert r.returncode == 0, f"debootstrap failed:\n{(r.stdout + r.stderr)[-4000:]}"
        ctr = buildah("from", "scratch")
        try:
            buildah("copy", ctr, f"{rootfs}/", "/")
            buildah("run", *ISOLATION, ctr, "--", "python3", "-m", "venv", VENV)
            env = [a for e in BASE_ENV for a in ("--env", e)]
            buildah("config", *env, "--cmd", "python3", ctr)
            buildah("commit", "-q", ctr, tag)
        finally:
            buildah("rm", ctr, check=False)
        shutil.rmtree(rootfs, ignore_errors=True)
    buildah("tag", tag, BASE_NAME)
    return tag


def pip_config() -> dict[str, str]:
    """This machine's pip settings that say where packages come from (its config files and
    PIP_* variables, as ``pip config list`` shows them)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    conf: dict[str, str] = {}
    for line in out.splitlines():
        m = re.fullmatch(r"(?:global|install|:env:)\.([\w-]+)='(.*)'", line.strip())
        if m:
            conf[m[1]] = m[2]
    keep = ("index-url", "extra-index-url", "find-links", "constraint", "cert", "trusted-host")
    return {k: v for k, v in conf.items() if k in keep}


def local_dir(ref: str) -> Path | None:
    """The folder to mount for a local index, link or file (an index's ``simple`` folder
    links to files beside it, so its parent)."""
    path = Path(urlparse(ref).path) if ref.startswith("file:") else Path(ref)
    if not path.is_absolute() or not path.exists():
        return None
    if path.is_file():
        return path
    return path.parent if path.name == "simple" else path


def build_mounts(work: Path) -> list[str]:
    """--volume flags: the machine's pip sources read-only at their own paths, and a pip.conf
    naming them with two retries per request."""
    conf = pip_config()
    mounts: set[Path] = set()
    for key in ("index-url", "extra-index-url", "find-links", "constraint", "cert"):
        for ref in conf.get(key, "").split():
            d = local_dir(ref)
            if d is not None:
                mounts.add(d)
    parser = configparser.ConfigParser()
    parser["global"] = {**conf, "retries": "2", "timeout": "60"}
    pip_conf = work / "pip.conf"
    with pip_conf.open("w") as f:
        parser.write(f)
    flags = ["--volume", f"{pip_conf}:/etc/pip.conf:ro"]
    for d in sorted(mounts):
        flags += ["--volume", f"{d}:{d}:ro"]
    return flags


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    reason = skip_reason()
    if reason:
        pytest.skip(f"the image is not built here: {reason}")
    froms = re.findall(r"^FROM\s+(\S+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert froms == [BASE_FROM], f"the stand-in base stands in for {BASE_FROM}, not {froms}"
    work = tmp_path_factory.mktemp("image")
    base_image(work)
    ctx = copy_checkout(work / "ctx")
    log = work / "build.log"
    with log.open("w") as out:
        r = subprocess.run(
            [*BUILDAH, "bud", *ISOLATION, "--pull=never", *build_mounts(work), "-t", TAG,
             "-f", str(ctx / "Dockerfile"), str(ctx)],
            stdout=out, stderr=subprocess.STDOUT, timeout=3000,
        )  # fmt: skip
    assert r.returncode == 0, f"buildah bud failed:\n{log.read_text()[-6000:]}"
    try:
        yield TAG
    finally:
        buildah("rmi", TAG, check=False)


@pytest.fixture
def container(image: str) -> Iterator[str]:
    ctr = buildah("from", "--pull=never", image)
    try:
        yield ctr
    finally:
        buildah("rm", ctr, check=False)


def run_in(ctr: str, script: str) -> str:
    # from the image's own WORKDIR, as KFP runs a step (the Dockerfile's last WORKDIR is an
    # empty one: the checkout's dlrover_rm/ would shadow the installed package there)
    r = subprocess.run(
        [*BUILDAH, "run", *ISOLATION, ctr, "--", "sh", "-c", script],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, f"{script}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def test_image_builds_and_runs(container: str) -> None:
    assert "usage: dlrover-rm" in run_in(container, "dlrover-rm --help")
    out = run_in(
        container,
        "python -c 'import dlrover_rm.components.train.component, "
        "dlrover_core.runtime.backends.kubernetes, torchrec, torch; "
        "print(torch.__version__)'; pip list 2>/dev/null | grep -ic nvidia || true",
    )
    torch_version, nvidia = out.split()
    assert torch_version.endswith("+cpu"), f"torch {torch_version}: not the CPU build"
    assert nvidia == "0", "CUDA packages in the image"
    spec = (
        "$(python -c 'from importlib.resources import files; "
        'print(files("dlrover_rm.pipelines") / "specs" / "small.yaml")\')'
    )
    plan = run_in(container, f"dlrover-rm plan --spec {spec} --history none --json")
    assert '"stage": "cold_start"' in plan and '"workers"' in plan, plan
