"""Rendering of sbatch scripts: directives, environment, launchers, and safe quoting of hostile values."""

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from clusterx.backends.base import SubmitRequest
from clusterx.backends.slurm import SlurmBackend
from clusterx.backends.slurm.options import SlurmOptions
from clusterx.backends.slurm.script import TEMPLATE_PATH, fill_template, render_sbatch_script, slurm_job_name
from clusterx.errors import SpecError
from clusterx.jobenv import CLUSTERX_VARIABLES
from clusterx.spec import JobSpec

HOSTILE_ARGS = [
    "it's",
    '"double"',
    "$(touch /tmp/clusterx-pwned)",
    "`id`",
    "a b\tc",
    "line\nbreak",
    "; rm -rf ~",
    "$HOME",
    "\\",
    "*",
    "",
]


def render(spec: JobSpec, tmp_path: Path, **options: str) -> str:
    """The script SlurmBackend would submit (backend-wide options merged with the spec's); runs no Slurm."""
    backend = SlurmBackend({"state_dir": str(tmp_path / "state"), **options})
    request = SubmitRequest(job_id=7, attempt=2, spec_json=spec.model_dump_json(), log_dir=tmp_path / "logs")
    return backend.render(request, submit_dir=tmp_path)


def directives(script: str) -> dict[str, str]:
    found = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH --"):
            key, sep, value = line.removeprefix("#SBATCH --").partition("=")
            (found[key],) = shlex.split(value) if sep else [""]  # Slurm's #SBATCH parser reads shell quoting too
    return found


def launch_text(script: str) -> str:
    """The launch command (it may span lines: a quoted argument can hold a line break)."""
    match = re.search(r"# Launch[^\n]*\n(.*) &\n__cx_child=", script, re.DOTALL)
    assert match, script
    return match.group(1)


def launch_line(script: str) -> list[str]:
    return shlex.split(launch_text(script))


def test_directives_of_a_plain_job(tmp_path: Path) -> None:
    spec = JobSpec(
        name="train",
        command=["python", "train.py"],
        nodes=2,
        procs_per_node=4,
        gpus_per_node=4,
        cpus_per_node=16,
        mem_per_node="64G",
        time_limit="01:30:30",
        partition="gpu",
        workdir="/work/dir",
    )
    found = directives(render(spec, tmp_path, launcher="srun"))
    assert found == {
        "job-name": "train",
        "nodes": "2",
        "ntasks-per-node": "4",  # srun launcher: one task per process
        "cpus-per-task": "4",
        "gres": "gpu:4",
        "mem": "65536M",
        "time": "91",  # 90.5 minutes, rounded up to whole minutes
        "partition": "gpu",
        "output": str(tmp_path / "logs" / "stdout.log"),
        "error": str(tmp_path / "logs" / "stderr.log"),
        "chdir": "/work/dir",
        "export": "NONE",
        "no-requeue": "",  # a flag: Slurm requeues only a spec with requeue = true
    }


def test_torchrun_launcher_runs_one_task_per_node_holding_all_cpus(tmp_path: Path) -> None:
    spec = JobSpec(command=["torchrun", "--nproc-per-node", "2", "train.py"], nodes=2, procs_per_node=2)
    script = render(spec, tmp_path)
    found = directives(script)
    assert (found["ntasks-per-node"], found["cpus-per-task"]) == ("1", "2")
    assert "gres" not in found  # no GPUs asked for, no gres line
    assert "time" not in found
    argv = launch_line(script)
    assert argv[:6] == ["srun", "--export=ALL", "--kill-on-bad-exit=1", "--ntasks-per-node=1", "--", "/bin/bash"]
    inner = argv[7]
    for expected in (
        '--nnodes="$SLURM_NNODES"',
        '--node-rank="$SLURM_NODEID"',
        "--nproc-per-node=2",
        "--rdzv-backend=static",  # ranks follow SLURM_NODEID, as rank_to_host reports them
        '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"',
    ):
        assert expected in inner
    assert argv[8:] == ["torchrun", "--nproc-per-node", "2", "train.py"]  # the user's own options come last
    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in script
    assert "MASTER_PORT=$((15000 + SLURM_JOB_ID % 15000))" in script


def test_requeue_is_what_the_spec_says(tmp_path: Path) -> None:
    assert "#SBATCH --requeue\n" in render(JobSpec(command=["true"], backend="slurm", requeue=True), tmp_path)
    assert "#SBATCH --no-requeue\n" in render(JobSpec(command=["true"], backend="slurm"), tmp_path)
    with pytest.raises(SpecError, match=r"the local backend cannot requeue a job itself .* max_retries"):
        JobSpec.from_mapping({"command": ["true"], "requeue": True})


def test_launcher_option_wraps_a_script_in_torchrun(tmp_path: Path) -> None:
    spec = JobSpec(command=["train.py", "--lr", "1e-3"], procs_per_node=2, backend_options={"launcher": "torchrun"})
    argv = launch_line(render(spec, tmp_path, torchrun="/opt/venv/bin/torchrun"))
    assert argv[8:] == ["/opt/venv/bin/torchrun", "train.py", "--lr", "1e-3"]
    spec = JobSpec(command=["python", "-u", "train.py"], backend_options={"launcher": "torchrun"})
    assert launch_line(render(spec, tmp_path))[8:] == ["torchrun", "--no-python", "python", "-u", "train.py"]


def test_environment_is_the_spec_plus_clusterx_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUBMIT_SHELL_ONLY", "must-not-appear")
    spec = JobSpec(command=["true"], env={"PATH": "/usr/bin:/bin", "NOTE": "it's $HOME"}, run_dir="/runs/r1")
    script = render(spec, tmp_path)
    exports = [line for line in script.splitlines() if line.startswith("export ")]
    names = [line.split()[1].split("=")[0] for line in exports]
    assert names == [
        "NOTE",
        "PATH",
        *CLUSTERX_VARIABLES,  # the one builder of every backend (clusterx.jobenv)
        "CLUSTERX_ATTEMPT",  # plus Slurm's restart count: a requeued run is the next attempt
        "SLURM_EXPORT_ENV",
        "MASTER_ADDR",
    ]
    assert "must-not-appear" not in script
    assert "export CLUSTERX_ATTEMPT=2" in exports
    assert "export CLUSTERX_BACKEND=slurm" in exports
    assert "export CLUSTERX_RUN_DIR=/runs/r1" in exports
    # The value round-trips through the shell unchanged.
    line = next(e for e in exports if e.startswith("export NOTE="))
    out = subprocess.run(["bash", "-c", f'{line}; printf %s "$NOTE"'], capture_output=True, text=True, check=True)
    assert out.stdout == "it's $HOME"


def test_a_secret_is_never_written_into_a_script(tmp_path: Path) -> None:
    # JobSpec refuses it already; a spec built around validation must still not reach a script.
    spec = JobSpec.model_construct(**{**JobSpec(command=["true"]).model_dump(), "env": {"HF_TOKEN": "hf_abc"}})
    with pytest.raises(SpecError, match="HF_TOKEN looks like a secret"):
        render_sbatch_script(spec, job_id=1, attempt=1, log_dir=tmp_path, options=SlurmOptions(), submit_dir=tmp_path)


def test_hostile_arguments_reach_the_program_unchanged(tmp_path: Path) -> None:
    spec = JobSpec(command=["printf", "%s|", *HOSTILE_ARGS])
    script = render(spec, tmp_path)
    assert launch_line(script)[4:] == ["printf", "%s|", *HOSTILE_ARGS]
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
    # Run the launch line itself through bash with `srun ... --` stripped: the argv arrives intact.
    command = launch_text(script).split(" -- ", 1)[1]
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout == "".join(f"{arg}|" for arg in HOSTILE_ARGS)
    assert not Path("/tmp/clusterx-pwned").exists()


def test_hostile_names_and_paths(tmp_path: Path) -> None:
    assert slurm_job_name("x JobState=COMPLETED") == "x_JobState_COMPLETED"
    assert slurm_job_name("$(id);`id`") == "__id___id_"
    assert slurm_job_name("") == "clusterx-job"
    weird = tmp_path / 'it\'s a "dir" $x 100%'
    found = directives(render(JobSpec(command=["true"], name="a\nb", workdir=str(weird)), tmp_path))
    assert found["chdir"] == str(weird)
    assert found["job-name"] == "a_b"
    log_dir = tmp_path / "logs 100%"
    script = render_sbatch_script(
        JobSpec(command=["true"]),
        job_id=1,
        attempt=1,
        log_dir=log_dir,
        options=SlurmOptions(),
        submit_dir=tmp_path,
    )
    assert directives(script)["output"] == str(log_dir / "stdout.log").replace("%", "%%")  # '%%' is a literal %
    with pytest.raises(SpecError, match="line break"):
        render(JobSpec(command=["true"], workdir="/tmp/a\n#SBATCH --nodes=99"), tmp_path)


def test_unknown_backend_options_are_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="unknown Slurm backend option 'lanucher'"):
        render(JobSpec(command=["true"], backend_options={"lanucher": "torchrun"}), tmp_path)
    with pytest.raises(SpecError, match="'launcher'"):
        SlurmOptions.from_maps({"launcher": "mpirun"})


def test_the_template_is_bash_and_every_rendering_too(tmp_path: Path) -> None:
    checked = subprocess.run(["bash", "-n", str(TEMPLATE_PATH)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr
    assert TEMPLATE_PATH.read_text().startswith("#!/bin/bash\n")
    for spec in (
        JobSpec(command=["printf", "%s|", *HOSTILE_ARGS], time_limit="1h", nodes=2),
        JobSpec(command=["torchrun", "--nproc-per-node", "2", "t.py"], procs_per_node=2, gpus_per_node=2),
    ):
        script = render(spec, tmp_path)
        assert "{{" not in script
        checked = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, check=False)
        assert checked.returncode == 0, checked.stderr


def test_template_placeholders_are_filled_once_and_all() -> None:
    # A value holding a placeholder's spelling is not expanded again (a job name cannot inject a line).
    assert fill_template("a={{a}} b={{b}}", {"a": "{{b}}", "b": "2"}) == "a={{b}} b=2"
    with pytest.raises(KeyError, match="'b'"):
        fill_template("{{a}}{{b}}", {"a": "1"})
