"""Cluster simulator, trace generator and baseline policies (see runner.simulate)."""

from dlrover_core.sim.engine import Engine, EngineConfig, cluster_capacity, job_view
from dlrover_core.sim.policies import (
    POLICIES,
    ExitClass,
    JobView,
    Policy,
    RelaunchDecision,
    register_policy,
)
from dlrover_core.sim.runner import format_table, run_policy, simulate
from dlrover_core.sim.trace import PAI_COLUMNS, TraceJob, generate_trace, trace_to_rows
from dlrover_core.sim.truth import JobTruth, OracleConfig

__all__ = [
    "PAI_COLUMNS",
    "POLICIES",
    "Engine",
    "EngineConfig",
    "ExitClass",
    "JobTruth",
    "JobView",
    "OracleConfig",
    "Policy",
    "RelaunchDecision",
    "TraceJob",
    "cluster_capacity",
    "format_table",
    "generate_trace",
    "job_view",
    "register_policy",
    "run_policy",
    "simulate",
    "trace_to_rows",
]
