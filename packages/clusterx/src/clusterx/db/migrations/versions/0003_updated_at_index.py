"""An index on jobs.updated_at, for reads of the jobs changed since a given time (xtop's refresh).

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_updated_at", "jobs", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_updated_at", table_name="jobs")
