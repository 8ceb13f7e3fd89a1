from .component import dlrover_train

__all__ = ["dlrover_train"]
