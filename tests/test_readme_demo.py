"""The README's demo sample output has the shape of a real demo run (scripts/readme_demo.py
rewrites it; this fails when the demo's output changed and the README was not refreshed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import readme_demo


def test_shape_ignores_values_not_rows() -> None:
    a = "completion time     25.4 s    15.2 s\nthroughput   33,818/s   55,377/s"
    b = "completion time     9.0 s    7.25 s\nthroughput   818/s   1,055,377/s"
    assert readme_demo.shape(a) == readme_demo.shape(b)
    assert readme_demo.shape(a) != readme_demo.shape(a.replace("throughput", "speed"))


def test_the_readme_has_one_demo_block() -> None:
    block = readme_demo.readme_block(readme_demo.README.read_text())
    assert block.startswith(readme_demo.FIRST)


@pytest.mark.slow
def test_the_readme_block_matches_a_real_demo_run() -> None:
    assert readme_demo.main(["--check", "--jobs", "5"]) == 0
