from .component import dlrover_profile, dlrover_profile_size

__all__ = ["dlrover_profile", "dlrover_profile_size"]
