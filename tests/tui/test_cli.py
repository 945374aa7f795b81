"""xtop's command line: a RUN_DIR that is a file is refused with one message and exit 2, before any screen."""

import subprocess
import sys
from pathlib import Path

XTOP = str(Path(sys.executable).parent / "xtop")


def test_a_run_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "metrics.jsonl"
    not_a_dir.write_text("{}\n")
    result = subprocess.run([XTOP, str(not_a_dir)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == f"xtop: error: {not_a_dir}: not a directory (give a run directory)"


def test_help_names_the_screens() -> None:
    result = subprocess.run([XTOP, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0
    assert "1 jobs, 2 run, 3 devices, 4 trace" in " ".join(result.stdout.split())
