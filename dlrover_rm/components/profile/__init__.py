from .component import dlrover_profile

__all__ = ["dlrover_profile"]
