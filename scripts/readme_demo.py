"""Keep the README's demo sample output true: run the demo, put its side-by-side block in the
README between the ``demo-output`` markers, or (``--check``) only compare the block's shape
(its rows and columns, numbers aside) with the real run's.

    .venv/bin/python scripts/readme_demo.py           # run the demo, rewrite the block
    .venv/bin/python scripts/readme_demo.py --check   # exit 1 if the README's block is stale

The slow test tier runs the check (tests/test_readme_demo.py), so CI fails when the demo's
output changes shape and the README was not refreshed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN, END = "<!-- demo-output: begin (scripts/readme_demo.py) -->", "<!-- demo-output: end -->"
FIRST = "-- the two runs side by side"


def run_demo(jobs: int = 20) -> str:
    """The demo's stdout (a fresh run directory; the simulated trace kept short)."""
    with tempfile.TemporaryDirectory(prefix="dlrover-readme-demo-") as tmp:
        cmd = [sys.executable, "-m", "dlrover_core.cli", "demo", "--jobs", str(jobs),
               "--run-dir", f"{tmp}/demo"]  # fmt: skip
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
        if p.returncode != 0:
            raise SystemExit(f"the demo failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        return p.stdout.replace(f"{tmp}/demo", "runs/demo-...")


def side_by_side(out: str) -> str:
    """The block from '-- the two runs side by side' to its last 'report:' line."""
    lines = out.splitlines()
    start = lines.index(FIRST)
    end = start
    while end + 1 < len(lines) and lines[end + 1].strip():
        end += 1
    return "\n".join(lines[start : end + 1])


def readme_block(text: str) -> str:
    m = re.search(re.escape(BEGIN) + r"\n```\n(.*?)\n```\n" + re.escape(END), text, re.S)
    if not m:
        raise SystemExit(f"README.md has no demo block between {BEGIN!r} and {END!r}")
    return m.group(1)


def shape(block: str) -> list[str]:
    """Each line's words with numbers as '#' (values vary run to run; rows and units do not)."""
    out = []
    for ln in block.splitlines():
        ln = re.sub(r"\d[\d,]*(\.\d+)?", "#", ln)
        out.append(" ".join(ln.split()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare shapes only; write nothing")
    ap.add_argument("--jobs", type=int, default=20, help="simulated jobs after the two runs")
    a = ap.parse_args(argv)
    text = README.read_text()
    current = readme_block(text)
    real = side_by_side(run_demo(a.jobs))
    if a.check:
        if shape(current) != shape(real):
            print("README.md's demo block is stale; run scripts/readme_demo.py", file=sys.stderr)
            print("README:\n" + current + "\n\nthis run:\n" + real, file=sys.stderr)
            return 1
        print("README.md's demo block has the demo's shape")
        return 0
    README.write_text(text.replace(current, real))
    print(real)
    return 0


if __name__ == "__main__":
    sys.exit(main())
