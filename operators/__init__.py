"""Airflow provider (thin shells over dlrover_core.api)."""
