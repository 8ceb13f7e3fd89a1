from .component import dlrover_plan

__all__ = ["dlrover_plan"]
