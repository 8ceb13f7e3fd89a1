"""The profile component's function called directly (``.python_func``) on a tiny job; its
size step is tested with the compiled pipelines in ``tests/components/test_kfp_profile_size.py``."""

import csv
from pathlib import Path

import pytest

pytest.importorskip("kfp")


@pytest.mark.slow
def test_profile_writes_samples_csv(samples_csv: Path) -> None:
    """``samples_csv`` (components/conftest.py) is this component's output on small.yaml."""
    with samples_csv.open() as f:
        rows = list(csv.DictReader(f))
    assert rows, "the profile step wrote no samples"
