"""dlrover-rm core: resource-performance model, three-stage planner, fault policies,
cluster simulator and (later) the elastic training runtime.

Nothing in this package imports Airflow or Kubeflow Pipelines.
"""

__version__ = "0.1.0"
