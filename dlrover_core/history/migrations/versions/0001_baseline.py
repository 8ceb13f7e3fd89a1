"""Baseline: the ``dlrover_runs`` table as the store created it before migrations existed.

Revision ID: 0001_baseline
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dlrover_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("signature", sa.String(512), nullable=False),
        sa.Column("job", sa.String(256), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("succeeded", sa.Boolean, nullable=False),
        sa.Column("started_at_s", sa.Float, nullable=True),
        sa.Column("finished_at_s", sa.Float, nullable=False),
        sa.Column("wall_s", sa.Float, nullable=True),
        sa.Column("throughput_sps", sa.Float, nullable=True),
        sa.Column("auc", sa.Float, nullable=True),
        sa.Column("worker_cpu_used_millicores", sa.Integer, nullable=True),
        sa.Column("worker_memory_used_mib", sa.Integer, nullable=True),
        sa.Column("ps_cpu_used_millicores", sa.Integer, nullable=True),
        sa.Column("ps_memory_used_mib", sa.Integer, nullable=True),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("final_plan", sa.JSON, nullable=False),
        sa.Column("plans", sa.JSON, nullable=False),
        sa.Column("samples", sa.JSON, nullable=False),
        sa.Column("faults", sa.JSON, nullable=False),
        sa.Column("metrics", sa.JSON, nullable=False),
    )
    op.create_index("ix_dlrover_runs_signature", "dlrover_runs", ["signature"])
    op.create_index("ix_dlrover_runs_finished_at_s", "dlrover_runs", ["finished_at_s"])


def downgrade() -> None:
    op.drop_index("ix_dlrover_runs_finished_at_s", table_name="dlrover_runs")
    op.drop_index("ix_dlrover_runs_signature", table_name="dlrover_runs")
    op.drop_table("dlrover_runs")
