"""A copy of the checkout (tracked and unignored files), for builds that must read nothing
else and write nothing into the working tree (the wheel, the image)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def copy_checkout(dest: Path) -> Path:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
        capture_output=True, text=True,
    ).stdout.split("\n")  # fmt: skip
    for f in filter(None, files):
        p = ROOT / f
        if p.is_symlink() or p.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest / f, follow_symlinks=False)
    return dest
