"""Alembic environment: runs on the connection the store hands over
(``config.attributes["connection"]``), or, for ``alembic`` on the command line, on the URL of
the ini file. Online only: the store always has a database at hand."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from dlrover_core.history.store import VERSION_TABLE, metadata

config = context.config


def _run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        render_as_batch=True,  # SQLite alters tables by copy-and-move
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = sa.create_engine(config.get_main_option("sqlalchemy.url") or "sqlite://")
    with engine.begin() as con:
        _run(con)
    engine.dispose()
