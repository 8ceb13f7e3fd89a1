"""The three-stage planner (pure): warm start, model-based scaling, post-scaling."""

from dlrover_core.planner.config import PlannerConfig
from dlrover_core.planner.planner import PlanDecision, Planner
from dlrover_core.planner.warm_start import major_cluster_mean

__all__ = ["PlanDecision", "Planner", "PlannerConfig", "major_cluster_mean"]
