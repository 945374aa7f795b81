"""Every user error of ``xtrain train`` through the real command line: exit code 2, one message that names the
file or the key (with the closest valid key for a misspelt one), no traceback, nothing started or lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

XTRAIN = str(Path(sys.executable).parent / "xtrain")
SAMPLE = REPO_ROOT / "tools" / "demo_data" / "sample.jsonl"
TOKENIZER = REPO_ROOT / "examples" / "tokenizer"


def config_text(
    *, data: Path = SAMPLE, tokenizer: Path = TOKENIZER, train: str = "max_steps = 2\nglobal_batch = 2"
) -> str:
    return (
        f'[model]\nsize = "debug"\n\n[data]\nsources = [{{ path = "{data}" }}]\ntokenizer = "{tokenizer}"\n'
        f"pack_tokens = 64\n\n[train]\n{train}\n"
    )


def xtrain(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [XTRAIN, *map(str, args)], capture_output=True, text=True, timeout=300, check=False, cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "XTRAIN_CACHE_DIR": str(cwd / "cache"), "OMP_NUM_THREADS": "1",
             **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})},
    )  # fmt: skip


def assert_user_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("xtrain: error:")]
    assert len(errors) == 1, result.stderr  # one message, once
    for needle in needles:
        assert needle in errors[0], errors[0]


@pytest.mark.parametrize(
    ("mutate", "needles"),
    [
        (lambda text: text.replace("max_steps", "max_step"), ["unknown key 'train.max_step'", "'train.max_steps'"]),
        (lambda text: text + '\n[optim]\nschedule = "cosin"\n', ["optim.schedule", "cosin"]),
        (lambda text: text.replace("max_steps = 2\n", ""), ["missing key 'train.max_steps'"]),
        (lambda text: text.replace("global_batch = 2", "global_batch = 0"), ["train.global_batch"]),
        (lambda text: text + "\n[parallel]\nreplicat = 2\n", ["'parallel.replicat'", "'parallel.replicate'"]),
        (
            lambda text: text.replace('size = "debug"', 'size = "debug"\nhf_path = "/nowhere"'),
            ["model.size", "hf_path"],
        ),
        (lambda text: text.replace("[train]", "[train"), ["config.toml", "not valid TOML", "line"]),
        (
            lambda text: text + '\n[memory]\ncheckpointing = "every:0"\n',
            ["memory.checkpointing", "'every:0'", "none | full | every:K | ratio:F"],
        ),
        (lambda text: text + "\n[memory]\noffload = true\n", ["memory.offload", "memory.checkpointing"]),
    ],
    ids=[
        "misspelt-key",
        "bad-value",
        "missing-key",
        "out-of-range",
        "misspelt-section-key",
        "two-models",
        "bad-toml",
        "bad-checkpointing",
        "offload-without-checkpointing",
    ],
)
def test_a_bad_config_is_one_message_naming_the_key(tmp_path: Path, mutate, needles: list[str]) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "config.toml"
    config.write_text(mutate(config_text()))
    result = xtrain("train", config, "--run-dir", tmp_path / "run", cwd=tmp_path)
    assert_user_error(result, str(config) if "config.toml" not in needles else "config.toml", *needles)
    assert not (tmp_path / "run").exists()  # nothing started


def test_missing_files_are_named_before_any_process_starts(tmp_path: Path) -> None:
    assert_user_error(xtrain("train", tmp_path / "absent.toml", cwd=tmp_path), "absent.toml", "does not exist")

    config = tmp_path / "config.toml"
    config.write_text(config_text(data=tmp_path / "no-such.jsonl", tokenizer=tmp_path / "no-tokenizer"))
    result = xtrain("train", config, "--nproc", "2", "--run-dir", tmp_path / "run", cwd=tmp_path)
    assert_user_error(result, "data.sources[0].path", "no-such.jsonl", "(and 1 more)")
    assert not (tmp_path / "run").exists()


def test_bad_overrides_and_world_sizes_are_named(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(config_text(train="max_steps = 2\nglobal_batch = 3"))
    run = ("--run-dir", tmp_path / "run")
    assert_user_error(xtrain("train", config, "--set", "train.max_steps", *run, cwd=tmp_path), "--set", "section.key")
    assert_user_error(
        xtrain("train", config, "--set", "train.seeed=1", *run, cwd=tmp_path), "'train.seeed'", "'train.seed'"
    )
    assert_user_error(xtrain("train", config, "--nproc", "2", *run, cwd=tmp_path), "train.global_batch = 3", "(2)")
    assert_user_error(xtrain("train", config, "--resume", tmp_path / "ckpt", *run, cwd=tmp_path), "--resume")
    assert not (tmp_path / "run").exists()


def test_a_bad_ep_size_is_named_with_the_values_before_any_process_starts(tmp_path: Path) -> None:
    # The other layouts the check refuses: tests/engine/ep/test_mesh.py and test_expert_parallel_checks.py.
    config = tmp_path / "config.toml"
    config.write_text(config_text() + "\n[parallel]\nep_size = 4\n")
    result = xtrain("train", config, "--nproc", "2", "--run-dir", tmp_path / "run", cwd=tmp_path)
    assert_user_error(
        result,
        "parallel.ep_size = 4 with 2 processes (2 per node) and 8 experts",
        "must divide the number of processes",
    )
    assert not (tmp_path / "run").exists()


def test_a_layout_that_cannot_run_is_named_with_the_values_before_any_process_starts(tmp_path: Path) -> None:
    # EP inside HSDP replicas is a layout (not a config error), and the launcher's check of the layout
    # (xtrain.parallel.layout.check_layout) refuses it when the processes cannot hold it: 2 replicas of an ep
    # group of 2 need 4 processes. Every other refusal: tests/engine/parallel/test_layout.py.
    config = tmp_path / "config.toml"
    config.write_text(config_text() + "\n[parallel]\nep_size = 2\nreplicate = 2\n")
    result = xtrain("train", config, "--nproc", "2", "--run-dir", tmp_path / "run", cwd=tmp_path)
    assert_user_error(
        result,
        "parallel.ep_size = 2 with parallel.replicate = 2, 2 processes (2 per node) and 8 experts",
        "replicate * ep_size = 4 must divide the number of processes",
    )
    assert not (tmp_path / "run").exists()


def test_a_source_without_one_valid_line_is_named_and_bad_lines_are_counted(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": ""}\nnot json\n{"txt": "x"}\n')
    config = tmp_path / "config.toml"
    config.write_text(config_text(data=bad))
    result = xtrain("train", config, "--nproc", "2", "--run-dir", tmp_path / "run", cwd=tmp_path)
    assert_user_error(result, str(bad))

    # Mixed with good lines, the bad ones are skipped, counted in the metrics and logged with file and line.
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(SAMPLE.read_text() + 'not json\n{"text": ""}\n')
    config.write_text(config_text(data=mixed, train="max_steps = 1\nglobal_batch = 1"))
    result = xtrain("train", config, "--run-dir", tmp_path / "run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["skipped_lines"] == 2
    assert f"{mixed}:121" in result.stderr  # the first bad line, by file and line number

    # Starting over (--resume none) in the same directory would mix two runs' metrics: refused, the first kept.
    again = xtrain("train", config, "--run-dir", tmp_path / "run", "--resume", "none", cwd=tmp_path)
    assert_user_error(again, "already holds a run")
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1


def test_steps_that_are_not_finite_are_skipped_and_too_many_in_a_row_stop_the_run(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(config_text(train="max_steps = 6\nglobal_batch = 1\nmax_skipped_steps_in_a_row = 2"))
    # An absurd learning rate: the first update is finite, then every loss is inf or NaN.
    result = xtrain("train", config, "--set", "optim.lr=1e30", "--run-dir", tmp_path / "run", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "2 steps in a row" in result.stderr and "train.max_skipped_steps_in_a_row" in result.stderr
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m.get("skipped", False) for m in metrics] == [False, True, True]
    assert [m["skipped_steps"] for m in metrics] == [0, 1, 2]
