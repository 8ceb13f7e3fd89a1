"""Before/after table of two simulate_paper_table.py --seeds JSONs (dlrover-rm vs dlrover-oss).

python notes/issue-10-mplan-compare.py BEFORE.json AFTER.json
"""

import json
import sys
from pathlib import Path
from typing import Any


def load(path: str) -> dict[int, dict[str, Any]]:
    return {t["seed"]: t for t in json.loads(Path(path).read_text())["traces"]}


def row(seed: int, name: str, t: dict[str, Any]) -> str:
    rm, oss, n = t["policies"]["dlrover-rm"], t["policies"]["dlrover-oss"], t["jobs"]
    cells = [
        str(seed),
        name,
        "/".join(f"{rm[k] / 60:.0f}" for k in ("jct_median_s", "jct_mean_s", "jct_p90_s")),
        *(f"{rm[k] / oss[k]:.2f}" for k in ("jct_median_s", "jct_mean_s", "jct_p90_s")),
        f"{rm['scaling_ops'] / n:.2f}/{oss['scaling_ops'] / n:.2f}",
        f"{100 * rm['completion_rate']:.1f}/{100 * oss['completion_rate']:.1f}",
        f"{rm['oracle_throughput_ratio']:.3f}/{oss['oracle_throughput_ratio']:.3f}",
        f"{100 * rm['cpu_util']:.1f}/{100 * oss['cpu_util']:.1f}",
        f"{100 * rm['mem_util']:.1f}/{100 * oss['mem_util']:.1f}",
        f"{t['passed']}/10",
        f"{rm['cpu_s']:.1f}",
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    runs = {"before": load(sys.argv[1]), "after": load(sys.argv[2])}
    head = [
        "seed",
        "run",
        "rm JCT med/mean/p90 (min)",
        "rm/oss med",
        "mean",
        "p90",
        "ops/job rm/oss",
        "compl rm/oss %",
        "per-core rm/oss",
        "CPU util rm/oss %",
        "mem util rm/oss %",
        "passed",
        "rm CPU s",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    seeds = sorted(set(runs["before"]) & set(runs["after"]))
    for s in seeds:
        for name, d in runs.items():
            print(row(s, name, d[s]))
    for name, d in runs.items():
        cpu = sum(d[s]["policies"]["dlrover-rm"]["cpu_s"] for s in seeds)
        worst = {
            k: max(
                d[s]["policies"]["dlrover-rm"][k] / d[s]["policies"]["dlrover-oss"][k]
                for s in seeds
            )
            for k in ("jct_median_s", "jct_mean_s", "jct_p90_s")
        }
        print(
            f"{name}: rm CPU s {cpu:.1f}; worst rm/oss "
            + ", ".join(f"{k[4:-2]} {v:.2f}" for k, v in worst.items())
        )


if __name__ == "__main__":
    main()
