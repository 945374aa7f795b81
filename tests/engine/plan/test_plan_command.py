"""`xtrain plan` through the real command line: the JSON interface, one model of FLOPs with `xtrain info`, the
same refusals as `xtrain train`, the search and its written config, every example, and bad input."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from xtrain.config import load_train_config

from tests.conftest import REPO_ROOT
from tests.engine.train.test_cli_errors import XTRAIN, assert_user_error, config_text, xtrain

EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.toml"))
PARTS = {"parameters", "gradients", "optimizer", "fsdp_buffers", "activations", "loss", "all_to_all", "headroom"}
KINDS = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"}


def plan_json(*args: str | Path, cwd: Path) -> dict[str, object]:
    result = xtrain("plan", *args, "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    parsed: dict[str, object] = json.loads(result.stdout)
    return parsed


def test_json_has_the_fields_of_the_interface(tmp_path: Path) -> None:
    plan = plan_json(REPO_ROOT / "examples" / "debug_moe.toml", "--gpus", "2", "--device", "cpu", cwd=tmp_path)
    assert isinstance(plan["fits"], bool) and plan["fits"]
    assert isinstance(plan["peak_bytes"], int) and plan["peak_bytes"] > 0
    parts = plan["parts"]
    assert isinstance(parts, dict) and set(parts) == PARTS
    assert plan["peak_bytes"] == sum(parts.values())
    assert isinstance(plan["host_bytes"], int)
    comm = plan["comm_bytes"]
    assert isinstance(comm, dict) and set(comm) == KINDS
    assert all(set(links) == {"intra", "inter"} for links in comm.values())
    assert comm["all_gather"]["intra"] > 0 and comm["all_gather"]["inter"] == 0  # one node
    for key in ("flops_per_step", "step_time_s", "tokens_per_s", "mfu"):
        assert isinstance(plan[key], float) and plan[key] > 0, key
    assert isinstance(plan["assumptions"], dict) and plan["assumptions"]["device"] == "cpu"


def test_flops_are_those_of_xtrain_info(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(config_text(train="max_steps = 2\nglobal_batch = 4"))
    plan = plan_json(config, "--gpus", "2", "--device", "h100", cwd=tmp_path)
    info = subprocess.run(
        [XTRAIN, "info", "--model", "debug", "--seq-len", "64", "--json"], capture_output=True, text=True, check=True
    )
    per_token = json.loads(info.stdout)["training_flops_per_token"]
    assert plan["flops_per_step"] == pytest.approx(per_token * 64 * 4, rel=1e-12)


def test_a_config_training_refuses_is_refused_with_the_same_message(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(config_text(train="max_steps = 2\nglobal_batch = 3"))
    planned = xtrain("plan", config, "--gpus", "2", "--device", "cpu", cwd=tmp_path)
    trained = xtrain("train", config, "--nproc", "2", "--run-dir", tmp_path / "run", cwd=tmp_path)
    assert_user_error(planned, "global_batch = 3")
    assert_user_error(trained, "global_batch = 3")
    assert planned.stderr.strip().splitlines()[-1] == trained.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--gpus", "2", "--device", "tpu"), "unknown device 'tpu'"),
        (("--gpus", "12", "--gpus-per-node", "8", "--device", "h100"), "--gpus 12 does not divide into nodes of 8"),
        (("--gpus", "2", "--device", "h100", "--set", "parallel.ep_size=3"), "parallel.ep_size = 3"),
        (("--device", "h100"), "--gpus N"),
        (("--gpus", "2", "--device", "h100", "--write", "best.toml"), "--write"),
    ],
)
def test_bad_input_is_one_message_naming_the_value(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    config = tmp_path / "run.toml"  # no [plan] section: the flags are all there is
    config.write_text(config_text())
    assert_user_error(xtrain("plan", config, *args, cwd=tmp_path), needle)


def test_a_model_that_fits_no_combination_is_said(tmp_path: Path) -> None:
    config = tmp_path / "big.toml"
    config.write_text(config_text().replace('size = "debug"', 'size = "kimi-k2-1t"'))
    result = xtrain("plan", config, "--gpus", "8", "--device", "a100", "--search", cwd=tmp_path)
    assert_user_error(result, "no combination fits 8 x a100")


def test_search_ranks_the_five_best_and_writes_the_best_as_a_ready_config(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(config_text().replace('size = "debug"', 'size = "qwen3-30b-a3b"'))
    best = tmp_path / "best.toml"
    result = xtrain("plan", config, "--gpus", "16", "--device", "h100", "--search", "--write", best, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if re.match(r"\s*\d+\s+[\d,]+\s", line)]
    assert len(rows) == 5
    rates = [float(row.split()[1].replace(",", "")) for row in rows]
    assert rates == sorted(rates, reverse=True)
    written = load_train_config(best)
    assert (written.plan.gpus, written.plan.gpus_per_node, written.plan.device) == (16, 8, "h100")
    again = plan_json(best, cwd=tmp_path)  # the written config plans on its own [plan] section
    assert again["fits"] and again["tokens_per_s"] == pytest.approx(rates[0], rel=1e-3)


@pytest.mark.parametrize("example", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_every_example_is_accepted_by_plan_and_by_training_validation(example: Path, tmp_path: Path) -> None:
    config = load_train_config(example)  # what `xtrain train` validates first
    assert config.plan.gpus is not None and config.plan.device is not None, f"{example.name} names no cluster"
    plan = plan_json(example, cwd=tmp_path)
    assert plan["fits"], f"{example.name} does not fit the cluster it names"
