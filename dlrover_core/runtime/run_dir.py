"""What a job master checks in its run directory before it writes anything (the job there is
not finished, and it is the same job: its stored spec), and the signals that stop it cleanly
while it runs there."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlrover_core.errors import InputError
from dlrover_core.runtime.state import STATE_FILE, MasterState
from dlrover_core.spec import JobSpec, parse_spec, spec_to_dict

SPEC_FILE = "spec.json"
ADDR_FILE = "master.addr"
FINISHED_STATES = frozenset({"succeeded"})


class RunFinishedError(InputError):
    """``train`` on a run directory whose job already finished."""


def check_runnable(spec: JobSpec, run_dir: Path) -> None:
    """Raise (one line, nothing changed) when ``run_dir`` holds a finished job or another
    job's spec."""
    state_path = run_dir / STATE_FILE
    if state_path.exists():
        d = MasterState.read(state_path)
        if d.get("job_state") in FINISHED_STATES:
            raise RunFinishedError(
                f"the job in {run_dir} already finished ({d.get('job_state')}); its report is "
                f"{run_dir / 'report.json'}. Nothing was changed: train in a new run directory "
                "to train again"
            )
    spec_path = run_dir / SPEC_FILE
    if spec_path.exists():
        try:
            stored = parse_spec(json.loads(spec_path.read_text()), source=str(spec_path))
        except (OSError, ValueError) as e:
            raise InputError(
                f"{spec_path} is unreadable ({e}); restore it or start in a new run directory"
            ) from None
        a, b = spec_to_dict(stored), spec_to_dict(spec)
        if a != b:
            diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            raise InputError(
                f"{run_dir} holds a job with another spec (differs in: {', '.join(diff)}); "
                "resume it with the same spec, or train in a new run directory. Nothing was "
                "changed"
            )


def install_stop_signals(on_stop: Callable[[str], None]) -> Callable[[], None]:
    """SIGTERM and SIGINT call ``on_stop(why)`` (a clean stop) while the master runs; returns
    what restores the earlier handlers. Off the main thread (tests): nothing to install."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    names: dict[int, str] = {
        signal.SIGTERM: "terminated (SIGTERM)",
        signal.SIGINT: "interrupted (SIGINT)",
    }

    def on_signal(signum: int, frame: Any) -> None:
        on_stop(names.get(signum, f"signal {signum}"))

    old = {s: signal.signal(s, on_signal) for s in names}

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return restore
