"""The job history in SQL: models, engine set-up (SQLite or PostgreSQL) and the Alembic migrations."""
