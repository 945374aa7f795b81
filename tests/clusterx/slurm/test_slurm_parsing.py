"""Pure functions of the Slurm backend: state mapping, exit codes, host lists, command output parsing."""

from datetime import UTC, datetime
from pathlib import Path

import pytest
from clusterx.backends.slurm import SlurmBackend
from clusterx.backends.slurm.backend import _end_from_file, split_backend_id
from clusterx.backends.slurm.nodelist import HostlistError, expand_hostlist, rank_to_host
from clusterx.backends.slurm.records import (
    parse_sacct,
    parse_sbatch_parsable,
    parse_slurm_time,
    parse_squeue,
    parse_status_file,
)
from clusterx.backends.slurm.states import (
    SLURM_STATE_CODES,
    SLURM_STATE_MAP,
    combine,
    map_slurm_state,
    normalize_state,
    parse_exit_code,
)
from clusterx.errors import BackendError
from clusterx.states import JobState

# Every state the task names, with the canonical state a user expects (see docs/clusterx-slurm.md).
EXPECTED = {
    "PENDING": JobState.QUEUED,
    "CONFIGURING": JobState.STARTING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "COMPLETED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
    "CANCELLED by 0": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
    "PREEMPTED": JobState.PREEMPTED,
    "NODE_FAIL": JobState.NODE_FAIL,
    "OUT_OF_MEMORY": JobState.FAILED,
    "BOOT_FAIL": JobState.NODE_FAIL,
    "DEADLINE": JobState.TIMEOUT,
    "SUSPENDED": JobState.RUNNING,
    "REQUEUED": JobState.QUEUED,
    "REQUEUE_HOLD": JobState.QUEUED,
    "REQUEUE_FED": JobState.QUEUED,
    "RESIZING": JobState.RUNNING,
    "REVOKED": JobState.CANCELLED,
    "SPECIAL_EXIT": JobState.FAILED,
    "STOPPED": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "RESV_DEL_HOLD": JobState.QUEUED,
    "LAUNCH_FAILED": JobState.FAILED,
}


@pytest.mark.parametrize(("raw", "expected"), sorted(EXPECTED.items()))
def test_every_slurm_state_maps_to_its_canonical_state(raw: str, expected: JobState) -> None:
    mapped = map_slurm_state(raw)
    assert mapped.state is expected
    assert mapped.raw_state == raw  # Slurm's own word is kept


def test_the_table_covers_every_compact_code_and_nothing_maps_to_pending() -> None:
    assert set(SLURM_STATE_CODES.values()) <= set(SLURM_STATE_MAP)
    # PENDING is clusterx's "not yet accepted by a backend": a state Slurm reports was accepted.
    assert JobState.PENDING not in SLURM_STATE_MAP.values()
    assert JobState.LOST not in SLURM_STATE_MAP.values()


def test_cancelled_by_names_the_user_and_suffixes_and_codes_are_normalised() -> None:
    assert map_slurm_state("CANCELLED by 1000").reason == "cancelled by uid 1000"
    assert normalize_state("COMPLETING+") == "COMPLETING"
    assert normalize_state("CD") == "COMPLETED"
    assert map_slurm_state(" OOM ").state is JobState.FAILED
    assert "out of memory" in (map_slurm_state("OUT_OF_MEMORY").reason or "")


def test_an_unknown_state_stays_live_and_is_named() -> None:
    mapped = map_slurm_state("SOMETHING_NEW")
    assert not mapped.state.is_terminal
    assert mapped.reason == "unknown Slurm state 'SOMETHING_NEW'"


@pytest.mark.parametrize(
    ("text", "code", "reason"),
    [
        ("0:0", 0, None),
        ("3:0", 3, "exited with status 3"),
        ("0:9", 137, "killed by signal 9 (SIGKILL)"),
        ("0:15", 143, "killed by signal 15 (SIGTERM)"),
        ("", None, None),
        ("x:y", None, None),
    ],
)
def test_exit_codes_n_colon_s(text: str, code: int | None, reason: str | None) -> None:
    parsed = parse_exit_code(text)
    assert (parsed.exit_code, parsed.reason) == (code, reason)


def test_combine_explains_failures_and_never_reports_success_for_a_nonzero_exit() -> None:
    assert combine(map_slurm_state("FAILED"), parse_exit_code("3:0")) == (JobState.FAILED, "exited with status 3")
    assert combine(map_slurm_state("COMPLETED"), parse_exit_code("0:0")) == (JobState.SUCCEEDED, None)
    assert combine(map_slurm_state("COMPLETED"), parse_exit_code("2:0"))[0] is JobState.FAILED
    state, reason = combine(map_slurm_state("OUT_OF_MEMORY"), parse_exit_code("0:9"))
    assert state is JobState.FAILED
    assert reason is not None
    assert "out of memory" in reason
    assert "SIGKILL" in reason


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node[01-03,05]", ["node01", "node02", "node03", "node05"]),
        ("a[1-2],b3", ["a1", "a2", "b3"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("gpu[008-011]", ["gpu008", "gpu009", "gpu010", "gpu011"]),
        ("vm", ["vm"]),
        ("", []),
        ("(null)", []),
        ("None assigned", []),
    ],
)
def test_hostlists_expand_like_scontrol_show_hostnames(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("bad", ["node[1-3", "node1-3]", "node[3-1]", "node[a-b]"])
def test_malformed_hostlists_are_refused(bad: str) -> None:
    with pytest.raises(HostlistError):
        expand_hostlist(bad)


def test_rank_to_host_is_block_ordered() -> None:
    assert rank_to_host(["a", "b"], 2) == {0: "a", 1: "a", 2: "b", 3: "b"}


def test_sbatch_parsable_with_and_without_cluster() -> None:
    assert parse_sbatch_parsable("4242\n") == ("4242", None)
    assert parse_sbatch_parsable("4242;cluster-a\n") == ("4242", "cluster-a")
    assert split_backend_id("4242;cluster-a") == ("4242", "cluster-a")
    with pytest.raises(ValueError, match="no job id"):
        parse_sbatch_parsable("sbatch: error: Batch job submission failed")


def test_squeue_and_sacct_lines() -> None:
    squeue = parse_squeue("12|RUNNING|None|node[1-2]|2026-01-02T03:04:05\n13|PENDING|Resources||N/A\n")
    assert squeue["12"].nodelist == "node[1-2]"
    assert squeue["12"].pending_reason is None
    assert squeue["13"].pending_reason == "Resources"
    assert squeue["13"].started_at is None
    sacct = parse_sacct(
        "12|FAILED|3:0|node1|2026-01-02T03:04:05|2026-01-02T03:05:05\n"
        "12.batch|FAILED|3:0|node1|2026-01-02T03:04:05|2026-01-02T03:05:05\n"
        "14|PENDING|0:0|None assigned|Unknown|Unknown\n"
        "14|COMPLETED|0:0|node2|2026-01-02T03:04:05|2026-01-02T03:06:05\n"  # requeued: the last one wins
    )
    assert set(sacct) == {"12", "14"}
    assert sacct["12"].exit_code == "3:0"
    assert sacct["14"].raw_state == "COMPLETED"
    assert parse_slurm_time("Unknown") is None
    started = sacct["12"].started_at
    assert started is not None
    assert started.tzinfo is not None


def _status(text: str) -> tuple[JobState, str, int | None, str | None]:
    return _end_from_file(parse_status_file(text))


def test_exit_code_file_fallback() -> None:
    assert _status("start=100\ntime_limit_s=60\nnodelist=vm\nexit=0\nend=110\n")[0] is JobState.SUCCEEDED
    state, _, code, reason = _status("start=100\ntime_limit_s=0\nnodelist=vm\nexit=3\nend=110\n")
    assert (state, code, reason) == (JobState.FAILED, 3, "exited with status 3")
    state, _, code, reason = _status("start=100\ntime_limit_s=0\nnodelist=vm\nexit=137\nend=110\n")
    assert (state, code, reason) == (JobState.FAILED, 137, "killed by signal 9 (SIGKILL)")
    assert _status("start=100\ntime_limit_s=60\nnodelist=vm\nsignal=TERM\nend=165\n")[0] is JobState.TIMEOUT
    assert _status("start=100\ntime_limit_s=60\nnodelist=vm\nsignal=TERM\nend=120\n")[0] is JobState.CANCELLED
    # What the script saw of Slurm as it ended decides first: Slurm marks the job before it signals it.
    base = "start=100\ntime_limit_s=60\nnodelist=vm\n"
    assert _status(base + "signal=TERM\nslurm=COMPLETING|TimeLimit\nend=130\n")[0] is JobState.TIMEOUT
    assert _status(base + "exit=143\nslurm=COMPLETING|None\nend=130\n")[0] is JobState.CANCELLED
    assert _status(base + "exit=143\nslurm=COMPLETING|Preempted\nend=130\n")[0] is JobState.PREEMPTED
    assert _status(base + "exit=0\nslurm=RUNNING|None\nend=130\n")[0] is JobState.SUCCEEDED
    assert _status(base + "exit=2\nslurm=RUNNING|None\nend=130\n")[:3] == (JobState.FAILED, "EXIT_FILE exit=2", 2)
    state, _, _, reason = _status("start=100\ntime_limit_s=60\nnodelist=vm\n")
    assert state is JobState.LOST
    assert reason is not None
    assert "never recorded an end" in reason
    parsed = parse_status_file("start=100\nprocs_per_node=4\nnodelist=a[1-2]\nexit=0\nend=110\n")
    assert parsed.started_at == datetime.fromtimestamp(100, UTC)
    assert (parsed.nodelist, parsed.procs_per_node) == ("a[1-2]", 4)


def test_missing_slurm_commands_are_one_clear_error(tmp_path: Path) -> None:
    backend = SlurmBackend({"bin_dir": str(tmp_path), "state_dir": str(tmp_path)})
    with pytest.raises(BackendError, match=r"squeue not found; install Slurm's client commands or set .* bin_dir"):
        backend.poll(["12;alpha"])
