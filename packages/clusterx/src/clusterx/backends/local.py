"""The embedded backend for one machine. Its queue is the database itself: `submit` only makes sure the daemon
of this database runs, and the daemon starts QUEUED jobs, watches them and writes their state (so the client
never polls it). Cancelling is a flag on the job the daemon acts on.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from clusterx.backends.base import BackendStatus, SubmitRequest
from clusterx.errors import SpecError
from clusterx.spec import JobSpec

OPTIONS = ("autostart",)


class LocalBackend:
    name = "local"
    pollable = False  # the daemon writes job states into the database itself

    def __init__(self, options: Mapping[str, str] | None = None, db_url: str | None = None) -> None:
        options = dict(options or {})
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise SpecError(f"local backend: unknown option(s) {sorted(unknown)}; known: {', '.join(OPTIONS)}")
        self.autostart = options.get("autostart", "true").lower() not in ("false", "0", "no")
        self.db_url = db_url

    def dryrun(self, request: SubmitRequest) -> str:
        """What the daemon would run: the command, its directory and environment (clusterx's variables named,
        their per-run values filled in at start)."""
        spec = JobSpec.model_validate_json(request.spec_json)
        lines = [
            "# local backend: the clusterx daemon on this machine runs",
            f"cd {shlex.quote(spec.workdir or '.')}",
            "env -i \\",
            *(f"  {key}={shlex.quote(value)} \\" for key, value in sorted(spec.env.items())),
            "  CLUSTERX_JOB_ID=... CLUSTERX_ATTEMPT=... CLUSTERX_RUN_DIR=... MASTER_ADDR=127.0.0.1 MASTER_PORT=... \\",
            f"  WORLD_SIZE={spec.world_size} NODE_RANK=0 LOCAL_WORLD_SIZE={spec.procs_per_node} "
            "CUDA_VISIBLE_DEVICES=... \\",
            f"  {shlex.join(spec.command)}",
            f"# stdout: {request.log_dir / 'stdout.log'}",
            f"# stderr: {request.log_dir / 'stderr.log'}",
            "# resources: "
            + json.dumps({"cpus": spec.cpus_needed, "mem_mib": spec.mem_per_node, "gpus": spec.gpus_per_node}),
        ]
        return "\n".join(lines) + "\n"

    def submit(self, request: SubmitRequest) -> str:
        if self.autostart and self.db_url is not None:
            from clusterx.daemon.control import start_daemon  # noqa: PLC0415 (lazy: a CLI import cost)

            start_daemon(self.db_url)
        return f"local-{request.job_id}"

    def poll(self, backend_job_ids: Sequence[str]) -> dict[str, BackendStatus]:
        return {}  # never called: the daemon records states itself

    def cancel(self, backend_job_id: str) -> None:
        """Nothing to send: the client sets the job's cancel flag and the daemon kills its process group."""

    def log_paths(self, request: SubmitRequest) -> dict[str, Path]:
        return {"stdout": request.log_dir / "stdout.log", "stderr": request.log_dir / "stderr.log"}
