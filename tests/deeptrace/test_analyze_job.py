"""`deeptrace analyze --job ID`: the run directory comes from `clusterx describe ID --json` (a real clusterx
database, the fake backend), never from importing clusterx."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from clusterx import Client
from clusterx.spec import JobSpec
from deeptrace.cli import main

from tests.deeptrace.fixtures_runs import build_clean_run


def _submit(db: Path, run_dir: Path, fake: Path) -> int:
    client = Client(str(db))
    try:
        spec = JobSpec(name="traced", command=["true"], backend="fake", run_dir=str(run_dir),
                       backend_options={"state_dir": str(fake)})  # fmt: skip
        return int(client.submit(spec)["id"])
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
