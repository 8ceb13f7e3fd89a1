"""Kubeflow Pipelines components (thin shells over dlrover_core.api)."""
