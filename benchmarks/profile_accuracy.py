"""Does profiling predict real runs? Profile, fit, then measure a held-out configuration.

    python benchmarks/profile_accuracy.py [--json OUT]

`dlrover-rm profile` runs short real trials (job master + PS + workers as processes) at the
planner's sampling configurations; the model is fitted on them and asked for a configuration
that was not profiled, which is then run for real the same way. Prints the relative error
(target: within 15 %).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SMALL = Path(__file__).resolve().parents[1] / "pipelines" / "specs" / "small.yaml"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)

    from dlrover_core.model.throughput import fit_throughput_model
    from dlrover_core.planner.scaling import plan_key
    from dlrover_core.runtime.profiler import profile, profile_configs, run_trial
    from dlrover_core.spec import load_spec
    from dlrover_core.types import NodeResources, RolePlan

    spec = load_spec(
        str(SMALL),
        ["data.rows=5000000", "pacing.sample_window_s=1", "pacing.heartbeat_interval_s=0.5"],
    )
    configs = profile_configs(spec, 6)
    samples, trials = profile(spec, configs=configs)
    for t in trials:
        print(
            f"profiled {t['workers']}w x {t['worker_cpu']:g} + {t['ps']}ps x {t['ps_cpu']:g}: "
            f"{t['throughput'] or 0:,.0f}/s"
        )
    model = fit_throughput_model(samples, "ps", batch_size=spec.training.batch_size)
    base = configs[0]
    # held out: 2 workers + 2 PS at 0.5 CPU each, the machine's 2 cores in all (the quota of
    # small.yaml; larger configurations would oversubscribe this machine's cores)
    held = base.replace(
        workers=RolePlan(2, NodeResources(500, base.workers.resources.memory_mib)),
        ps=RolePlan(2, NodeResources(500, base.ps.resources.memory_mib)),
    )
    assert plan_key(held) not in {plan_key(c) for c in configs}
    pred = model.predict(2, 2, 0.5, 0.5)
    with tempfile.TemporaryDirectory() as tmp:
        real = run_trial(spec, held, Path(tmp) / "held-out")
    if real is None:
        print("the held-out run produced no steady window")
        return 1
    err = pred.throughput_sps / real.throughput_sps - 1.0
    print(
        f"held-out 2w x 0.5 + 2ps x 0.5: predicted {pred.throughput_sps:,.0f}/s "
        f"[{pred.lower_sps:,.0f}, {pred.upper_sps:,.0f}], measured {real.throughput_sps:,.0f}/s, "
        f"error {err:+.1%} (target within 15 %)"
    )
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "trials": trials,
                    "predicted": pred.throughput_sps,
                    "measured": real.throughput_sps,
                    "error": err,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
