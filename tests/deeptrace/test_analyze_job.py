"""`deeptrace analyze --job ID`: the run directory comes from `clusterx describe ID --json` (a real clusterx
database, the fake backend), read as clusterx's typed JobRecord: a record newer than deeptrace's clusterx reads is
refused with one message, never misread."""

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from clusterx import Client
from clusterx.record import RECORD_VERSION
from clusterx.spec import JobSpec
from deeptrace.cli import main

from tests.deeptrace.fixtures_runs import build_clean_run


def _submit(db: Path, run_dir: Path, fake: Path) -> int:
    client = Client(str(db))
    try:
        spec = JobSpec(name="traced", command=["true"], backend="fake", run_dir=str(run_dir),
                       backend_options={"state_dir": str(fake)})  # fmt: skip
        return int(client.submit(spec).id)
    finally:
        client.close()


def test_analyze_job_finds_the_run_directory_through_clusterx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    build_clean_run(run_dir, world_size=2, steps=2)
    db = tmp_path / "jobs.db"
    job = _submit(db, run_dir, tmp_path / "fake")
    monkeypatch.setenv("CLUSTERX_DB", str(db))
    runner = CliRunner()
    result = runner.invoke(main, ["analyze", "--job", str(job), "--json", "--no-png"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert Path(report["run_dir"]).resolve() == run_dir.resolve()
    assert sorted(report["ranks"]) == ["0", "1"]
    assert (run_dir / "deeptrace" / "report.json").is_file()

    missing = runner.invoke(main, ["analyze", "--job", "99"])
    assert missing.exit_code == 2 and "Traceback" not in missing.output
    assert "deeptrace: error: --job 99: clusterx: error: no job 99" in missing.output
    both = runner.invoke(main, ["analyze", str(run_dir), "--job", str(job)])
    assert both.exit_code == 2 and "give either RUN_DIR or --job ID" in both.output
    neither = runner.invoke(main, ["analyze"])
    assert neither.exit_code == 2 and "give either RUN_DIR or --job ID" in neither.output


def _clusterx_that_prints(record: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `clusterx` beside the interpreter (where deeptrace looks first) that prints `record` for any job."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "record.json").write_text(json.dumps(record))
    command = folder / "clusterx"
    command.write_text(f"#!/bin/sh\ncat {folder / 'record.json'}\n")
    command.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(folder / "python"))


def test_analyze_job_refuses_a_newer_job_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    build_clean_run(run_dir, world_size=2, steps=2)
    db = tmp_path / "jobs.db"
    job = _submit(db, run_dir, tmp_path / "fake")
    client = Client(str(db))
    record = client.describe(job, poll=False).to_dict()
    client.close()
    newer = RECORD_VERSION + 1
    _clusterx_that_prints({**record, "record_version": newer, "later_field": "x"}, tmp_path, monkeypatch)
    result = CliRunner().invoke(main, ["analyze", "--job", str(job), "--no-png"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (
        f"deeptrace: error: --job {job}: clusterx describe {job} --json: job record version {newer} is newer than "
        f"this clusterx reads ({RECORD_VERSION}): upgrade clusterx"
    ) in result.output
    assert not (run_dir / "deeptrace").exists()  # nothing analysed


def test_analyze_job_refuses_what_is_not_a_job_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _clusterx_that_prints({"run_dir": str(tmp_path)}, tmp_path, monkeypatch)  # a run_dir alone is no record
    result = CliRunner().invoke(main, ["analyze", "--job", "1", "--no-png"])
    assert result.exit_code == 2
    assert "--job 1: clusterx describe 1 --json: not a job record (record_version missing" in result.output
