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
from clusterx.errors import ResourceError, SpecError
from clusterx.spec import JobSpec

OPTIONS = ("autostart",)
# Values the daemon fills in at start, shown as such by the dry run.
_AT_START = {"MASTER_PORT": "...", "CUDA_VISIBLE_DEVICES": "..."}


class LocalBackend:
    name = "local"

    def __init__(self, options: Mapping[str, str] | None = None, db_url: str | None = None) -> None:
        options = dict(options or {})
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise SpecError(f"local backend: unknown option(s) {sorted(unknown)}; known: {', '.join(OPTIONS)}")
        self.autostart = options.get("autostart", "true").lower() not in ("false", "0", "no")
        self.db_url = db_url

    def check(self, spec: JobSpec) -> None:
        """Refuse what this machine can never run, before anything is stored."""
        if spec.nodes != 1:
            raise ResourceError(
                f"the local backend runs a job on this one machine, so nodes must be 1 (got {spec.nodes}); "
                "use --backend slurm for several nodes"
            )
        if spec.workdir is not None and not Path(spec.workdir).is_dir():
            raise SpecError(f"working directory {spec.workdir} does not exist")
        import psutil  # noqa: PLC0415 (lazy: the other backends never need it)

        cpus = psutil.cpu_count(logical=True) or 1
        if spec.cpus_needed > cpus:
            raise ResourceError(
                f"the job needs {spec.cpus_needed} CPU cores per node but this machine has {cpus}; "
                "lower --cpus-per-node / --procs-per-node"
            )
        mem_mib = psutil.virtual_memory().total // (1024 * 1024)
        if spec.mem_per_node is not None and spec.mem_per_node > mem_mib:
            raise ResourceError(
                f"the job needs {spec.mem_per_node} MiB of memory but this machine has {mem_mib} MiB; lower --mem"
            )
        if spec.gpus_per_node > 0:
            from clusterx.daemon.resources import gpu_indices  # noqa: PLC0415 (NVML only for GPU requests)

            gpus = len(gpu_indices())
            if spec.gpus_per_node > gpus:
                raise ResourceError(
                    f"the job needs {spec.gpus_per_node} GPU(s) but this machine has {gpus}; lower --gpus-per-node "
                    "or submit to a backend with GPUs"
                )

    def dryrun(self, request: SubmitRequest) -> str:
        """What the daemon would run: the command, its directory and environment (the values it chooses at start
        shown as '...')."""
        from clusterx.daemon.launch import local_environment  # noqa: PLC0415 (the daemon's own builder)

        spec = JobSpec.model_validate_json(request.spec_json)
        env = local_environment(
            spec, job_id=request.job_id, attempt=request.attempt, run_dir=spec.run_dir or str(request.log_dir),
            gpu_ids=[], master_port=0,
        )  # fmt: skip
        env.update(_AT_START)
        lines = [
            "# local backend: the clusterx daemon on this machine runs",
            f"cd {shlex.quote(spec.workdir or '.')}",
            "env -i \\",
            *(f"  {key}={shlex.quote(value) if value != '...' else value} \\" for key, value in env.items()),
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
