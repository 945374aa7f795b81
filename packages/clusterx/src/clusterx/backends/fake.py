"""A backend for tests of everything above the backend: its jobs are JSON files in a folder (option
`state_dir`), so a test plays the cluster by writing a job's state there, and the client finds it by polling,
exactly as it would find a Slurm job's state.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from clusterx.backends.base import BackendStatus, SubmitRequest
from clusterx.errors import SpecError
from clusterx.fileio import write_atomically
from clusterx.spec import JobSpec
from clusterx.states import JobState


class FakeBackend:
    name = "fake"

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        options = dict(options or {})
        unknown = set(options) - {"state_dir"}
        if unknown:
            raise SpecError(f"fake backend: unknown option(s) {sorted(unknown)}; the only option is state_dir")
        self.state_dir = Path(options.get("state_dir") or Path(tempfile.gettempdir()) / "clusterx-fake")
        self.state_dir.mkdir(parents=True, exist_ok=True)

    def check(self, spec: JobSpec) -> None:
        """The fake cluster takes any request."""

    def dryrun(self, request: SubmitRequest) -> str:
        spec = JobSpec.model_validate_json(request.spec_json)
        return json.dumps({"job_id": request.job_id, "attempt": request.attempt, "command": spec.command})

    def submit(self, request: SubmitRequest) -> str:
        backend_job_id = f"fake-{uuid.uuid4().hex[:12]}"
        write_fake_state(self.state_dir, backend_job_id, {"state": "QUEUED", "raw_state": "FAKE_QUEUED"})
        return backend_job_id

    def poll(self, backend_job_ids: Sequence[str]) -> dict[str, BackendStatus]:
        statuses = {}
        for backend_job_id in backend_job_ids:
            path = self.state_dir / f"{backend_job_id}.json"
            if not path.exists():
                continue  # the backend no longer knows it
            data = json.loads(path.read_text())
            statuses[backend_job_id] = BackendStatus(
                backend_job_id=backend_job_id,
                state=JobState(data["state"]),
                raw_state=data.get("raw_state", data["state"]),
                exit_code=data.get("exit_code"),
                reason=data.get("reason"),
                hosts=tuple(data.get("hosts", ())),
                rank_to_host={int(k): v for k, v in data.get("rank_to_host", {}).items()},
            )
        return statuses

    def cancel(self, backend_job_id: str) -> None:
        path = self.state_dir / f"{backend_job_id}.json"
        if path.exists():
            data = json.loads(path.read_text())
            if not JobState(data["state"]).is_terminal:
                write_fake_state(self.state_dir, backend_job_id, {"state": "CANCELLED", "raw_state": "FAKE_CANCEL"})

    def log_paths(self, request: SubmitRequest) -> dict[str, Path]:
        return {"stdout": request.log_dir / "stdout.log", "stderr": request.log_dir / "stderr.log"}


def write_fake_state(state_dir: Path, backend_job_id: str, data: Mapping[str, Any]) -> None:
    """Set what the fake cluster reports for a job (atomically, as a real scheduler's answer is whole)."""
    write_atomically(state_dir / f"{backend_job_id}.json", json.dumps(dict(data)))
