"""Every install path the README documents, each in a fresh virtual environment built from the
repository's own files (its wheel, constraints.txt, the Dockerfile's pip steps), checked by
doing what that path promises (tests/install/smoke.py). Slow: each builds an environment.

The image is checked here as the environment its Dockerfile's pip steps build: the same
steps, the same extras, with one change said here: the machine's package index (its pip
config: local wheels, the torch CPU wheel among them) stands in for the Dockerfile's
``--index-url https://download.pytorch.org/whl/cpu``, which this sandbox cannot reach. The
image itself is built from the Dockerfile with Debian's buildah in test_image_build.py."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.install.checkout import copy_checkout

ROOT = Path(__file__).resolve().parents[2]
SMOKE = Path(__file__).with_name("smoke.py")
CONSTRAINTS = str(ROOT / "constraints.txt")
TORCH = ["torch==2.13.0", "fbgemm-gpu-cpu==1.8.0"]
TORCHREC = ["--no-deps", "torchrec==1.8.0"]
# the Dockerfile's index flags (not reachable here; see the module's docstring)
INDEX_FLAGS = re.compile(r"--(extra-)?index-url\s+\S+")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a copy of the checkout (the build writes nothing here)."""
    src = copy_checkout(tmp_path_factory.mktemp("src") / "dlrover-rm")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        check=True, timeout=600,
    )  # fmt: skip
    (whl,) = out.glob("dlrover_rm-*.whl")
    return whl


def venv(path: Path, *installs: list[str]) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "-q"]
    for args in installs:
        r = subprocess.run([*pip, *args], capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, f"pip install {' '.join(args)}:\n{r.stderr[-3000:]}"
    return path / "bin" / "python"


def smoke(python: Path, which: str, work: Path) -> None:
    r = subprocess.run(
        [str(python), str(SMOKE), which, str(work)], capture_output=True, text=True, timeout=1200
    )
    assert r.returncode == 0, f"{which}:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert f"install path {which}: ok" in r.stdout


def test_core_install(tmp_path: Path, wheel: Path) -> None:
    """`pip install dlrover-rm`: plan, model, simulate; other commands name their extra."""
    smoke(venv(tmp_path / "venv", ["-c", CONSTRAINTS, str(wheel)]), "core", tmp_path / "w")


def test_cli_install(tmp_path: Path, wheel: Path) -> None:
    """The README's CLI path: the torch pair, torchrec without deps, [runtime,history]."""
    py = venv(
        tmp_path / "venv",
        ["-c", CONSTRAINTS, *TORCH],
        TORCHREC,
        ["-c", CONSTRAINTS, f"{wheel}[runtime,history]"],
    )
    smoke(py, "cli", tmp_path / "w")


def test_airflow_install(tmp_path: Path, wheel: Path) -> None:
    """The README's Airflow path: the torch pair, torchrec, [airflow]."""
    py = venv(
        tmp_path / "venv",
        ["-c", CONSTRAINTS, *TORCH],
        TORCHREC,
        ["-c", CONSTRAINTS, f"{wheel}[airflow]"],
    )
    smoke(py, "airflow", tmp_path / "w")


def dockerfile_pip_steps() -> list[list[str]]:
    """The Dockerfile's `pip install` commands, as argument lists (the project as the wheel)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    runs = [ln[4:] for ln in text.splitlines() if ln.startswith("RUN ")]
    steps = []
    for run in runs:
        for cmd in run.split("&&"):
            cmd = INDEX_FLAGS.sub("", cmd).strip()
            if cmd.startswith("pip install"):
                steps.append(shlex.split(cmd)[2:])
    assert steps, "the Dockerfile installs nothing with pip"
    return steps


def test_image_environment(tmp_path: Path, wheel: Path) -> None:
    """What the Dockerfile installs runs every step of the example KFP pipeline."""
    steps = []
    for args in dockerfile_pip_steps():
        args = [CONSTRAINTS if a == "constraints.txt" else a for a in args]
        args = [re.sub(r"^\.\[", f"{wheel}[", a) for a in args]
        steps.append(args)
    assert any(str(wheel) in " ".join(a) for a in steps), steps
    smoke(venv(tmp_path / "venv", *steps), "image", tmp_path / "w")
