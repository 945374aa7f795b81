"""Riding out a database that goes away: a PostgreSQL server restarted, failed over, or cut off by the network.

`retry_db` (db/engine.py) runs each transaction through here. When it fails because the connection broke or
could not be made (`is_disconnect`), the whole transaction is run again, with backoff, until the server answers,
for up to `CLUSTERX_DB_WAIT_S` seconds in all (default 120): a submit waits and then succeeds, and the daemon's
writes (a job started, a job ended) are made once the server is back. Past that time the call raises
`DatabaseUnavailableError`, one message naming the database, which the command line prints as its one error line.

Running a transaction again is safe because a transaction whose connection broke before its COMMIT was answered
was rolled back by the server; clusterx's writes are also idempotent where it matters (a job is stored once per
submit key; a state change is applied only from the state it expects). SQLite is never disconnected: its errors
keep their own handling (busy and locked are retried by `retry_db`).
"""

from __future__ import annotations

import logging
import os
import random
import time

from sqlalchemy.exc import DBAPIError, OperationalError

from clusterx.errors import ClusterxError

log = logging.getLogger("clusterx.db")

WAIT_ENV = "CLUSTERX_DB_WAIT_S"
DEFAULT_WAIT_S = 120.0
# SQLSTATEs of a connection that broke or a server that is not taking work: connection exceptions (class 08),
# admin_shutdown, crash_shutdown, cannot_connect_now (starting up or shutting down).
_DISCONNECT_STATES = ("57P01", "57P02", "57P03")


class DatabaseUnavailableError(ClusterxError):
    """The job database could not be reached for the whole wait (its server is down or unreachable)."""


def is_disconnect(exc: DBAPIError) -> bool:
    """The connection to a server database broke, or could not be made: worth waiting for the server."""
    if type(exc.orig).__module__.split(".")[0] not in ("psycopg", "psycopg2"):
        return False  # SQLite: a local file, never "disconnected"
    if exc.connection_invalidated:
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate is None:
        # The driver's own OperationalError without a server answer: connection refused, closed or lost.
        return isinstance(exc, OperationalError)
    return str(sqlstate).startswith("08") or sqlstate in _DISCONNECT_STATES


def wait_s() -> float:
    """How long one transaction waits for its database to come back (CLUSTERX_DB_WAIT_S, default 120 s)."""
    try:
        return max(0.0, float(os.environ.get(WAIT_ENV, DEFAULT_WAIT_S)))
    except ValueError:
        return DEFAULT_WAIT_S


class ReconnectWait:
    """The waiting of one transaction across its disconnects: call `pause(exc)` after each one."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.tries = 0

    def pause(self, exc: DBAPIError) -> None:
        """Sleep before the next try, or raise DatabaseUnavailableError once the wait is spent."""
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + wait_s()
            log.warning("the job database went away (%s); waiting up to %.0f s for it", _first_line(exc), wait_s())
        if now >= self.deadline:
            raise DatabaseUnavailableError(
                f"the job database could not be reached for {wait_s():.0f} s ({_first_line(exc)}); the operation"
                " stopped there: try it again once the database is back (a submit repeated with the same"
                f" --submit-key never stores a job twice; {WAIT_ENV}=SECONDS waits longer)"
            ) from None
        self.tries += 1
        delay = min(2.0, 0.05 * 2 ** min(self.tries, 6)) * (0.5 + random.random())
        time.sleep(max(0.0, min(delay, self.deadline - now)))


def _first_line(exc: DBAPIError) -> str:
    text = str(exc.orig).strip().splitlines()
    return text[0] if text else type(exc.orig).__name__
