"""`deeptrace analyze` on run directories written by the real RunWriter and Collector (fixtures_runs)."""

import json
import shutil
from pathlib import Path

from click.testing import CliRunner
from deeptrace.cli import main

from tests.deeptrace.fixtures_runs import build_clean_run, build_planted_hang


def test_clean_run_directory(tmp_path: Path) -> None:
    built = build_clean_run(tmp_path / "run", world_size=3, steps=3)
    result = CliRunner().invoke(main, ["analyze", str(built.run_dir), "--json", "--fail-on", "hang"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert sorted(report["ranks"]) == ["0", "1", "2"]
    assert all(r["source"] == "collector" for r in report["ranks"].values())
    assert report["hang"] is None
    # every dp and ep collective of every step matched across the 3 ranks by (group, seq)
    assert report["collectives"]["matched_by"]["order"] == 0
    assert report["collectives"]["matched"] == report["ranks"]["0"]["collectives"]["count"]
    assert (built.run_dir / "deeptrace" / "report.json").is_file()
    assert (built.run_dir / "deeptrace" / "summary.png").is_file()


def test_planted_hang_is_reported_and_fails_ci(tmp_path: Path) -> None:
    hang = build_planted_hang(tmp_path / "run", world_size=4, stuck_rank=2, hang_step=3)
    result = CliRunner().invoke(
        main, ["analyze", str(hang.run_dir), "--json", "--no-png", "--stall-after", "0", "--fail-on", "hang"]
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["hang"]["culprit_ranks"] == [2]
    assert sorted(report["hang"]["waiting_ranks"]) == [0, 1, 3]
    assert "--fail-on hang" in result.stderr


def test_kineto_in_profiler_folder_wins_for_time_collector_for_collectives(shared_data: Path, tmp_path: Path) -> None:
    built = build_clean_run(tmp_path / "run", world_size=2, steps=2)
    (built.run_dir / "profiler").mkdir()
    for name in ("rank-0.json.gz", "rank-1.json.gz"):
        shutil.copy(shared_data / "kineto" / name, built.run_dir / "profiler" / f"host-{name}")
    result = CliRunner().invoke(main, ["analyze", str(built.run_dir), "--json", "--no-png"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["source"] for r in report["ranks"].values()] == ["kineto", "kineto"]
    assert report["ranks"]["0"]["overlap_pct"] == 11.81
    assert report["collectives"]["matched_by"]["seq"] > 0 and report["collectives"]["matched_by"]["order"] == 0
