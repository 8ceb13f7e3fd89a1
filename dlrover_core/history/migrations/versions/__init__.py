"""Revisions of the run-history schema, oldest first (``0001_baseline``)."""
