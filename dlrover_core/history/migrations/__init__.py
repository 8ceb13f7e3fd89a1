"""Alembic migrations of the run-history schema (``dlrover_runs``).

Run by :class:`dlrover_core.history.store.HistoryStore` on open: a fresh database is brought to
head; a database created before migrations existed (tables, no version row) is stamped at the
baseline first, then upgraded. The version table is ``dlrover_rm_alembic_version``, so the
history can share a database with an application that has its own Alembic history (Airflow's
metadata database, say).

A new revision, from a checkout:

    alembic -c dlrover_core/history/migrations/alembic.ini revision -m "what changes"
"""
