"""The repository's shape: no symlink is committed anywhere (a checkout without symlinks, e.g.
on Windows or from some archives, would break), the KFP components and the Airflow provider
sit at the top as ``components/`` and ``operators/``, each component has its test beside it,
and pyproject's explicit package list covers every package of the core."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _git_ls_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-s"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return out.stdout.splitlines()


def test_no_symlink_is_committed() -> None:
    # `git ls-files -s`: "<mode> <object> <stage>\t<path>"; 120000 is a symbolic link
    links = [line.split("\t", 1)[1] for line in _git_ls_files() if line.startswith("120000 ")]
    assert links == [], f"symlinks committed (use pyproject's package-dir mapping): {links}"
    on_disk = [str(p.relative_to(ROOT)) for p in (ROOT / "dlrover_rm").rglob("*") if p.is_symlink()]
    assert on_disk == [], on_disk


def test_components_and_operators_are_at_the_top() -> None:
    for name in ("components", "operators", "pipelines"):
        assert (ROOT / name / "__init__.py").is_file(), name
    assert not (ROOT / "dlrover_rm" / "components").exists()
    assert not (ROOT / "dlrover_rm" / "operators").exists()
    assert not (ROOT / "dlrover_rm" / "pipelines").exists()
    for comp in ("plan", "profile", "train"):
        d = ROOT / "components" / comp
        for f in ("component.py", "metadata.yaml", "README.md", f"test_{comp}_component.py"):
            assert (d / f).is_file(), d / f
    assert (ROOT / "operators" / "provider.py").is_file()


def test_pyproject_maps_the_top_folders_under_dlrover_rm_and_lists_every_package() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    assert tool["setuptools"]["package-dir"] == {
        "dlrover_rm.components": "components",
        "dlrover_rm.operators": "operators",
        "dlrover_rm.pipelines": "pipelines",
    }
    listed = set(tool["setuptools"]["packages"])
    core = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "dlrover_core").rglob("__init__.py")
    }
    comps = {
        "dlrover_rm.components." + p.parent.name
        for p in (ROOT / "components").glob("*/__init__.py")
    }
    want = core | comps | {"dlrover_rm", "dlrover_rm.components", "dlrover_rm.operators"}
    want |= {"dlrover_rm.pipelines", "dlrover_rm.pipelines.specs"}
    assert listed == want, (
        f"pyproject [tool.setuptools] packages: missing {sorted(want - listed)}, "
        f"extra {sorted(listed - want)}"
    )
    assert "tests" in tool["pytest"]["ini_options"]["testpaths"]
    assert "components" in tool["pytest"]["ini_options"]["testpaths"]
