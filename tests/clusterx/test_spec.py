"""The job spec: parsing of sizes and durations, the environment allow-list, refusing secrets, spec files."""

from __future__ import annotations

from pathlib import Path

import pytest
from clusterx.errors import SpecError
from clusterx.spec import (
    JobSpec,
    env_from_shell,
    looks_secret,
    parse_duration_seconds,
    parse_env_assignment,
    parse_memory_mib,
)


@pytest.mark.parametrize(
    ("text", "mib"), [("16G", 16384), ("512M", 512), ("2048", 2048), ("1.5G", 1536), ("1T", 1048576), ("16GiB", 16384)]
)
def test_memory_sizes(text: str, mib: int) -> None:
    assert parse_memory_mib(text) == mib


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("01:30:00", 5400),
        ("90m", 5400),
        ("2h", 7200),
        ("45s", 45),
        ("90:00", 5400),
        ("1-12:00:00", 129600),
        ("300", 300),
    ],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["soon", "1:2:3:4", "-5", "10x"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="time limit"):
        parse_duration_seconds(text)


def test_spec_normalises_units_and_defaults_the_name() -> None:
    spec = JobSpec(command=["/usr/bin/python3", "train.py"], mem_per_node="16G", time_limit="01:30:00")  # type: ignore[arg-type]
    assert (spec.name, spec.mem_per_node, spec.time_limit) == ("python3", 16384, 5400)
    again = JobSpec.model_validate_json(spec.model_dump_json())
    assert again == spec


@pytest.mark.parametrize("key", ["GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "OPENAI_API_KEY", "HF_TOKEN"])
def test_secret_looking_keys(key: str) -> None:
    assert looks_secret(key)
    with pytest.raises(SpecError, match=f"{key} looks like a secret"):
        JobSpec.from_mapping({"command": ["true"], "env": {key: "x"}})


@pytest.mark.parametrize("key", ["MAX_TOKENS_PER_GPU", "PATH", "KEYBOARD", "TOKENIZERS_PARALLELISM"])
def test_ordinary_keys_are_not_secrets(key: str) -> None:
    assert not looks_secret(key)


def test_only_allow_listed_shell_variables_pass() -> None:
    shell = {"PATH": "/bin", "HOME": "/h", "LC_ALL": "C", "AWS_SECRET_ACCESS_KEY": "s", "RANDOM_THING": "1"}
    assert env_from_shell(shell) == {"PATH": "/bin", "HOME": "/h", "LC_ALL": "C"}


def test_env_assignment() -> None:
    assert parse_env_assignment("A=b=c") == ("A", "b=c")
    with pytest.raises(SpecError, match="KEY=VALUE"):
        parse_env_assignment("no-equals")


def test_spec_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('name = "demo"\ncommand = ["python", "x.py"]\nnodes = 1\nmem_per_node = "1G"\n[env]\nA = "1"\n')
    spec = JobSpec.from_toml(path, overrides={"priority": 5})
    assert (spec.name, spec.priority, spec.mem_per_node, spec.env) == ("demo", 5, 1024, {"A": "1"})


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('command = ["x"]\nnodes = 0\n', "key 'nodes': Input should be greater than or equal to 1"),
        ('command = ["x"]\ngpus = 2\n', "key 'gpus': unknown key"),
        ("nodes = 1\n", "key 'command': required key is missing"),
        ('command = ["x"\n', "not valid TOML"),
        ('command = ["x"]\ntime_limit = "soon"\n', "key 'time_limit'"),
    ],
)
def test_malformed_spec_files_name_file_and_key(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(content)
    with pytest.raises(SpecError) as info:
        JobSpec.from_toml(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_missing_spec_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="spec file not found"):
        JobSpec.from_toml(tmp_path / "nope.toml")
