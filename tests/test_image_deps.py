"""What the component image installs covers what its code imports: the third-party imports of
dlrover_core (minus the Airflow-free simulator peer), the KFP components and the example
pipelines, mapped to their distributions, are all required by the extras the Dockerfile names
(torch's pair and torchrec are installed beside them, as the Makefile does)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions, requires
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# installed by the Dockerfile's own steps (torchrec without its deps), or not the image's job
BESIDE = {"torch", "fbgemm-gpu-cpu", "torchrec", "dlrover-rm"}
NOT_IN_IMAGE = {"apache-airflow", "apache-airflow-core", "apache-airflow-task-sdk", "dlrover"}


def _imports(paths: list[Path]) -> set[str]:
    out: set[str] = set()
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.add(node.module.split(".")[0])
    return out - set(sys.stdlib_module_names) - {"dlrover_core", "dlrover_rm", "__future__"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _extra_dists(extras: list[str], table: dict[str, list[str]]) -> set[str]:
    out: set[str] = set()
    for e in extras:
        for req in table[e]:
            name = _norm(re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0])
            if name == "dlrover-rm":
                inner = re.search(r"\[(.*)\]", req)
                assert inner is not None
                out |= _extra_dists(inner.group(1).split(","), table)
            else:
                out.add(name)
    return out


def test_the_image_installs_what_its_code_imports() -> None:
    docker = (ROOT / "Dockerfile").read_text()
    m = re.search(r'"\.\[([a-z,]+)\]"', docker)
    assert m, "the Dockerfile installs the project with extras"
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    table = py["optional-dependencies"]
    have = _extra_dists(m.group(1).split(","), table) | {_norm(d) for d in py["dependencies"]}
    have = {_norm(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0]) for d in have}
    # what those distributions bring with them counts too (kfp brings protobuf, ...)
    for d in list(have):
        for r in requires(d) or []:
            if "extra ==" not in r:
                have.add(_norm(re.split(r"[<>=!~\[; (]", r, maxsplit=1)[0]))
    code = [
        p
        for p in (ROOT / "dlrover_core").rglob("*.py")
        if "sim/dlrover_oss" not in str(p) and "sim/oss" not in str(p)
    ]
    code += [  # the components' code, not the tests beside it
        p
        for p in (ROOT / "components").rglob("*.py")
        if not p.name.startswith("test_") and p.name != "conftest.py"
    ]
    code += [ROOT / "pipelines" / "kfp_recurring_retrain.py"]
    dists = packages_distributions()
    missing = {}
    for mod in sorted(_imports(code)):
        names = {_norm(d) for d in dists.get(mod, [])}
        if not names:
            continue  # not installed here: an optional import guarded in the code
        if names & (BESIDE | NOT_IN_IMAGE):
            continue
        if not names & have:
            missing[mod] = sorted(names)
    assert missing == {}, f"imported by the image's code, installed by no extra it names: {missing}"
