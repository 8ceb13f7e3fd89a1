"""dlrover-rm core: resource-performance model, three-stage planner, fault policies, cluster
simulator, and the elastic training runtime.

Nothing in this package imports Airflow or Kubeflow Pipelines.
"""

import warnings as _warnings

# torch probes the deprecated pynvml at import: whoever imports this package (the CLI, the API,
# a KFP step, an Airflow task) does not see that warning, which is about torch's packaging
_warnings.filterwarnings(
    "ignore", message="The pynvml package is deprecated", category=FutureWarning
)

__version__ = "0.1.0"
