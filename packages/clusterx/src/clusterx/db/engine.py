"""Where the database is, how to connect to it, and bringing its schema up to date.

SQLite (the default, one file in the user's data directory) is opened in WAL mode with a busy timeout, and every
write transaction starts with BEGIN IMMEDIATE so that concurrent writers queue on the busy timeout instead of
failing on a lock upgrade. PostgreSQL is used through psycopg 3 when the URL says so.
"""

from __future__ import annotations

import fcntl
import random
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError, OperationalError

from clusterx.db.reconnect import ReconnectWait, is_disconnect
from clusterx.errors import DatabaseConfigError
from clusterx.paths import resolve_db_url, sqlite_path

__all__ = ["HEAD_REVISION", "ensure_schema", "make_engine", "resolve_db_url", "retry_db", "sqlite_path"]

# The newest migration; the schema check compares against it without importing Alembic (a test keeps it true).
HEAD_REVISION = "0003"
MIGRATIONS_DIR = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000

T = TypeVar("T")


def make_engine(url: str) -> Engine:
    path = sqlite_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _configure_sqlite(engine)
        return engine
    if url.startswith("sqlite"):
        raise DatabaseConfigError(f"{url}: an in-memory SQLite database cannot be shared with the daemon")
    try:
        return create_engine(url, pool_pre_ping=True)
    except ImportError as exc:
        raise DatabaseConfigError(
            f"{url}: the PostgreSQL driver is missing ({exc}); install clusterx[postgres]"
        ) from None


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below emit BEGIN itself (the driver's own would be DEFERRED).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        write = connection.get_execution_options().get("clusterx_write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def is_retryable(exc: BaseException) -> bool:
    """SQLite busy/locked, PostgreSQL serialization failure or deadlock: worth trying again."""
    if isinstance(exc, OperationalError) and any(word in str(exc.orig).lower() for word in ("locked", "busy")):
        return True
    if isinstance(exc, DBAPIError):
        sqlstate = getattr(exc.orig, "sqlstate", None)
        return sqlstate in ("40001", "40P01")
    return False


def retry_db(fn: Callable[[], T], attempts: int = 8) -> T:
    """Run `fn` (one whole transaction), retrying it when the database was busy, and while its server is away
    (db/reconnect.py: for up to CLUSTERX_DB_WAIT_S, then DatabaseUnavailableError)."""
    away = ReconnectWait()
    attempt = 0
    while True:
        try:
            return fn()
        except DBAPIError as exc:
            if is_disconnect(exc):
                away.pause(exc)
                continue
            if attempt == attempts - 1 or not is_retryable(exc):
                raise
            time.sleep(min(1.0, 0.01 * 2**attempt) * (0.5 + random.random()))
            attempt += 1


def ensure_schema(engine: Engine) -> None:
    """Bring the schema to HEAD_REVISION; cheap when it already is (no Alembic import)."""
    if current_revision(engine) == HEAD_REVISION:
        return
    with _migration_lock(engine):
        if current_revision(engine) != HEAD_REVISION:
            upgrade_to_head(engine)


def current_revision(engine: Engine) -> str | None:
    try:
        with engine.connect() as connection:
            return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except DBAPIError as exc:
        if is_disconnect(exc):
            # Not waited for: a database that cannot be reached at the start is more often a wrong URL than a
            # restart (the caller says so at once); a server that goes away later is waited for (retry_db).
            raise

        return None  # no alembic_version table yet: a new database


def upgrade_to_head(engine: Engine) -> None:
    from alembic import command  # noqa: PLC0415 (lazy: only a new or old database needs Alembic)
    from alembic.config import Config  # noqa: PLC0415

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    """One process migrates at a time: a lock file beside a SQLite database, an advisory lock on PostgreSQL."""
    path = sqlite_path(str(engine.url))
    if path is not None:
        with open(f"{path}.migrate.lock", "w") as handle:  # noqa: PTH123
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        return
    key = zlib.crc32(b"clusterx-migrations")
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
        connection.commit()
        try:
            yield
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
            connection.commit()
