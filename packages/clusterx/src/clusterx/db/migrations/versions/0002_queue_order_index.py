"""The scheduling pass's index in the pass's own order (priority descending) and covering what it reads.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

COLUMNS: list[str | sa.TextClause] = [
    "state",
    "backend",
    "submit_host",
    sa.text("priority DESC"),
    "id",
    "cancel_requested",
    "cpus",
    "gpus",
    "mem_mib",
    "time_limit_s",
]


def upgrade() -> None:
    op.drop_index("ix_jobs_queue", table_name="jobs")
    op.create_index("ix_jobs_queue_order", "jobs", COLUMNS)


def downgrade() -> None:
    op.drop_index("ix_jobs_queue_order", table_name="jobs")
    op.create_index("ix_jobs_queue", "jobs", ["state", "backend", "priority", "id"])
