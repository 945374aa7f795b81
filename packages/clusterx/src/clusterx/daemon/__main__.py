"""`python -m clusterx.daemon`: the daemon process (started by `clusterx daemon start` or by `submit`).

The database URL comes from CLUSTERX_DB; CLUSTERX_DAEMON_IDLE_EXIT (seconds) makes it exit when it has had
nothing to run for that long; CLUSTERX_DAEMON_CPUS offers that many CPU cores instead of the machine's (for jobs
that mostly wait). Exits at once, quietly, when another daemon already serves the database.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import sys

from clusterx.daemon.api import SubmitServer
from clusterx.daemon.control import lock_path
from clusterx.daemon.fastpath import socket_path
from clusterx.daemon.resources import gpu_indices, machine_capacity
from clusterx.daemon.service import Daemon
from clusterx.db.engine import resolve_db_url
from clusterx.store import JobStore


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s clusterx-daemon[%(process)d] %(message)s", stream=sys.stderr
    )
    url = resolve_db_url(None)
    path = lock_path(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another daemon serves this database
    handle.seek(0)
    handle.truncate()  # a previous daemon's pid: until ours is written, `daemon_pid` says "starting" (-1)
    handle.flush()
    idle = os.environ.get("CLUSTERX_DAEMON_IDLE_EXIT")
    store = JobStore(url)
    capacity = machine_capacity()
    if os.environ.get("CLUSTERX_DAEMON_CPUS"):
        capacity = dataclasses.replace(capacity, cpus=int(os.environ["CLUSTERX_DAEMON_CPUS"]))
    daemon = Daemon(store, capacity, gpu_indices(), idle_exit_s=float(idle) if idle else None)
    server = SubmitServer(url, socket_path(url))
    server.start()
    # The pid is written last: it tells `start_daemon` (and every client) that the socket already listens.
    handle.write(str(os.getpid()))
    handle.flush()
    logging.getLogger("clusterx.daemon").info("serving %s with %s", path.name, daemon.capacity)
    try:
        daemon.run()
    finally:
        server.close()
        handle.seek(0)
        handle.truncate()
        handle.close()  # releases the lock
    return 0


if __name__ == "__main__":
    sys.exit(main())
