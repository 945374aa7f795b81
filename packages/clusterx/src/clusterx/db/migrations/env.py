"""Alembic environment: clusterx runs migrations programmatically on a connection it passes in."""

from alembic import context
from clusterx.db.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
