"""Filled in by later issues."""
