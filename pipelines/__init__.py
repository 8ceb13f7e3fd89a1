"""Example recurring-retrain pipelines and job specs."""
