"""``_k8s.py`` (the Kubernetes harness) sits next to the Airflow tests."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # appended: `from conftest import ...` elsewhere must not find this one
    sys.path.append(_HERE)
