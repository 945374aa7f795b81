"""Command line of xtrain.

The group imports nothing heavy: each command imports torch and the model code inside its own body, so
``xtrain --help`` stays fast.
"""

import json
import os
import sys
from pathlib import Path

import click

from xtrain import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="xtrain")
def main() -> None:
    """xtrain: FSDP2 training engine for Mixture-of-Experts language models."""


@main.command()
@click.option("--model", "model_name", required=True, help="Named model size, e.g. debug or qwen3-30b-a3b.")
@click.option(
    "--seq-len",
    type=click.IntRange(min=1),
    default=4096,
    show_default=True,
    help="Document length for the attention part of FLOPs/token (one document of this length).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def info(model_name: str, seq_len: int, as_json: bool) -> None:
    """Parameter counts (total, active) and training FLOPs per token of a named model size."""
    # Deferred imports: the model code pulls in torch, which `xtrain --help` must not pay for.
    from xtrain.errors import XtrainError  # noqa: PLC0415
    from xtrain.model.flops import attention_training_flops, matmul_training_flops_per_token  # noqa: PLC0415
    from xtrain.model.sizes import count_parameters, model_config  # noqa: PLC0415

    try:
        config = model_config(model_name)
    except XtrainError as error:
        raise click.UsageError(str(error)) from None
    counts = count_parameters(config)
    matmul_per_token = matmul_training_flops_per_token(config)
    attention_per_token = attention_training_flops(config, [seq_len]) / seq_len
    figures = {
        "model": model_name,
        "architecture": config.hf_architecture,
        "parameters_total": counts.total,
        "parameters_active": counts.active,
        "parameters_active_without_input_embedding": counts.active_without_input_embedding,
        "parameters_embedding": counts.embedding,
        "parameters_active_matmul": counts.active_matmul,
        "seq_len": seq_len,
        "training_flops_per_token": matmul_per_token + attention_per_token,
        "training_flops_per_token_matmul": matmul_per_token,
        "training_flops_per_token_attention": attention_per_token,
    }
    if as_json:
        click.echo(json.dumps(figures))
        return
    click.echo(f"model                {model_name} ({config.hf_architecture})")
    click.echo(f"parameters total     {counts.total:,} ({counts.total / 1e9:.2f} B)")
    click.echo(f"parameters active    {counts.active:,} ({counts.active / 1e9:.2f} B per token)")
    click.echo(f"  without input emb. {counts.active_without_input_embedding / 1e9:.2f} B (the lookup is no compute)")
    click.echo(f"FLOPs/token (train)  {figures['training_flops_per_token']:.4g} at one document of {seq_len} tokens")
    click.echo(f"  weight matmuls     {matmul_per_token:.4g} (6 x {counts.active_matmul:,} active matmul weights)")
    click.echo(f"  attention          {attention_per_token:.4g} (causal)")


@main.command(context_settings={"show_default": True})
@click.argument("config_path", metavar="CONFIG.toml", type=click.Path(path_type=Path))
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path),
    help="Run directory [default: $CLUSTERX_RUN_DIR, else runs/<config name>].",
)
@click.option(
    "--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config key (repeatable)."
)
@click.option(
    "--resume",
    default="auto",
    metavar="auto|PATH|none",
    help="Continue from the newest checkpoint (auto), a given one, or start over.",
)
@click.option("--nproc", type=click.IntRange(min=1), help="Start this many processes on this node through torchrun.")
def train(config_path: Path, run_dir: Path | None, overrides: tuple[str, ...], resume: str, nproc: int | None) -> None:
    """Train the model CONFIG.toml describes (FSDP2; one process, --nproc N, or under torchrun)."""
    from xtrain.errors import TrainingStoppedError, XtrainError  # noqa: PLC0415 (keeps `xtrain --help` light)
    from xtrain.parallel.distributed import launched_by_torchrun  # noqa: PLC0415
    from xtrain.train import launch  # noqa: PLC0415

    try:
        config = launch.load_and_check(config_path, overrides)
        resolved_run_dir = launch.resolve_run_dir(run_dir, config_path)
        if nproc is None and not launched_by_torchrun():
            nproc = _processes_of_one_node_job()
        if nproc is not None and not launched_by_torchrun():
            launch.check_world_size(config, nproc)
            launch.check_resume(resume, resolved_run_dir, config)
            from xtrain.data import prepare_corpus  # noqa: PLC0415

            prepare_corpus(config.data, log=lambda message: click.echo(f"xtrain: {message}", err=True))
            sys.exit(launch.launch_torchrun(config_path, resolved_run_dir, overrides, resume, nproc))
        from xtrain.train.trainer import train as run_training  # noqa: PLC0415

        run_training(config, resolved_run_dir, resume=resume, config_name=config_path.stem)
    except XtrainError as error:
        if not launch.report_user_error(str(error)):
            click.echo(f"xtrain: error: {error}", err=True)
        sys.exit(2)
    except TrainingStoppedError as error:
        click.echo(f"xtrain: {error}", err=True)
        sys.exit(1)


@main.command("eval", context_settings={"show_default": True})
@click.argument("config_path", metavar="CONFIG.toml", type=click.Path(path_type=Path))
@click.option(
    "--checkpoint",
    "checkpoint",
    required=True,
    metavar="PATH|RUN_DIR",
    type=click.Path(path_type=Path),
    help="A checkpoint folder (RUN_DIR/checkpoints/step-N), or a run directory (its newest complete one).",
)
@click.option(
    "--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config key (repeatable)."
)
@click.option("--nproc", type=click.IntRange(min=1), help="Start this many processes on this node through torchrun.")
def evaluate(config_path: Path, checkpoint: Path, overrides: tuple[str, ...], nproc: int | None) -> None:
    """The held-out loss of a checkpoint on CONFIG.toml's [eval] packs, as training computes it (one JSON line)."""
    from xtrain.errors import XtrainError  # noqa: PLC0415 (keeps `xtrain --help` light)
    from xtrain.parallel.distributed import launched_by_torchrun  # noqa: PLC0415
    from xtrain.train import launch  # noqa: PLC0415
    from xtrain.train.eval_command import check_eval, evaluate_checkpoint  # noqa: PLC0415

    try:
        config = launch.load_and_check(config_path, overrides)
        if nproc is not None and not launched_by_torchrun():
            check_eval(config, checkpoint)
            launch.check_world_size(config, nproc)
            arguments = ["eval", str(config_path.resolve()), "--checkpoint", str(checkpoint.resolve())]
            sys.exit(launch.launch_command(arguments, overrides, nproc))
        evaluate_checkpoint(config, checkpoint)
    except XtrainError as error:
        if not launch.report_user_error(str(error)):
            click.echo(f"xtrain: error: {error}", err=True)
        sys.exit(2)


@main.command()
@click.argument("config_path", metavar="CONFIG.toml", type=click.Path(path_type=Path))
@click.option("--gpus", type=int, help="Devices of the whole job [default: plan.gpus].")
@click.option("--gpus-per-node", type=int, help="Devices per node [default: plan.gpus_per_node, else 8].")
@click.option(
    "--device", "device_name", metavar="NAME", help="h100, h200, h800, a100, b200 or cpu [default: plan.device]."
)
@click.option(
    "--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config key (repeatable)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--search", is_flag=True, help="Try every valid layout, memory and batch setting; rank those that fit.")
@click.option(
    "--write", "write_path", type=click.Path(path_type=Path), help="With --search: write the best as a config."
)
def plan(  # noqa: PLR0917 (one argument per option)
    config_path: Path,
    gpus: int | None,
    gpus_per_node: int | None,
    device_name: str | None,
    overrides: tuple[str, ...],
    as_json: bool,
    search: bool,
    write_path: Path | None,
) -> None:
    """Memory per rank, bytes per collective and the step time of CONFIG.toml on a cluster, before it runs."""
    from xtrain.errors import XtrainError  # noqa: PLC0415 (keeps `xtrain --help` light)
    from xtrain.plan.command import run_plan  # noqa: PLC0415

    if write_path is not None and not search:
        click.echo("xtrain: error: --write writes the best combination of --search: add --search", err=True)
        sys.exit(2)
    try:
        click.echo(run_plan(config_path, overrides, gpus, gpus_per_node, device_name, as_json, search, write_path))
    except XtrainError as error:
        click.echo(f"xtrain: error: {error}", err=True)
        sys.exit(2)


def _processes_of_one_node_job() -> int | None:
    """The processes a one-node clusterx job asked for (CLUSTERX_PROCS_PER_NODE > 1), which xtrain then starts
    itself as --nproc would: `clusterx submit --procs-per-node 2 -- xtrain train CONFIG` needs nothing more. A
    job over several nodes needs a launcher on each node (torchrun through srun): docs/engine-train.md."""
    procs, nodes = os.environ.get("CLUSTERX_PROCS_PER_NODE", ""), os.environ.get("CLUSTERX_NODES", "1")
    return int(procs) if procs.isdigit() and int(procs) > 1 and nodes == "1" else None


@main.command(context_settings={"show_default": True})
@click.argument("source", metavar="RUN_DIR|CHECKPOINT", type=click.Path(path_type=Path))
@click.argument("out", metavar="OUT", type=click.Path(path_type=Path))
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", help="Dtype of the weights.")
@click.option("--max-shard-size", default="5GB", help="Split the safetensors into shards (with an index) above this.")
@click.option("--replace", is_flag=True, help="Replace OUT if it exists.")
def export(source: Path, out: Path, dtype: str, max_shard_size: str, replace: bool) -> None:
    """Write a checkpoint (or a run's newest complete one) as a Hugging Face folder: config.json, safetensors,
    tokenizer files."""
    from xtrain.errors import XtrainError  # noqa: PLC0415 (keeps `xtrain --help` light)
    from xtrain.train.checkpoint.export import export_hf, parse_size  # noqa: PLC0415
    from xtrain.train.checkpoint.locate import open_checkpoint  # noqa: PLC0415

    try:
        import torch  # noqa: PLC0415

        max_bytes = parse_size(max_shard_size)
        point = open_checkpoint(source, lambda message: click.echo(f"xtrain: warning: {message}", err=True))
        written = export_hf(point, out, dtype=getattr(torch, dtype), max_shard_bytes=max_bytes, replace=replace)
    except XtrainError as error:
        click.echo(f"xtrain: error: {error}", err=True)
        sys.exit(2)
    click.echo(f"xtrain: wrote {written} (step {point.step} of {point.folder})", err=True)


@main.command()
@click.argument("run_dirs", metavar="RUN_DIR...", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--plot", type=click.Path(path_type=Path), metavar="FILE.png", help="Draw the curves into a PNG.")
@click.option("--csv", "csv_path", type=click.Path(path_type=Path), metavar="FILE", help="Write every step as CSV.")
@click.option("--last", type=click.IntRange(min=0), default=10, show_default=True, help="Steps in the table.")
def metrics(run_dirs: tuple[Path, ...], plot: Path | None, csv_path: Path | None, last: int) -> None:
    """A run's last steps, best eval loss and throughput medians; with several RUN_DIRs, compared (curves
    overlaid in --plot)."""
    from xtrain.errors import XtrainError  # noqa: PLC0415 (keeps `xtrain --help` light)
    from xtrain.metrics_report import run_metrics  # noqa: PLC0415

    try:
        click.echo(run_metrics(list(run_dirs), plot, csv_path, last))
    except XtrainError as error:
        click.echo(f"xtrain: error: {error}", err=True)
        sys.exit(2)


@main.group()
def data() -> None:
    """Training data: tokenise and cache ahead of a run."""


@data.command()
@click.argument("config_path", metavar="CONFIG.toml", type=click.Path(path_type=Path))
@click.option(
    "--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config key (repeatable)."
)
def prepare(config_path: Path, overrides: tuple[str, ...]) -> None:
    """Build the token cache of CONFIG.toml's data sources (what `xtrain train` would build at start)."""
    from xtrain.data import run_prepare  # noqa: PLC0415
    from xtrain.errors import XtrainError  # noqa: PLC0415
    from xtrain.train import launch  # noqa: PLC0415

    try:
        config = launch.load_and_check(config_path, overrides)
        summary = run_prepare(config.data, log=lambda message: click.echo(f"xtrain: {message}", err=True))
    except XtrainError as error:
        click.echo(f"xtrain: error: {error}", err=True)
        sys.exit(2)
    click.echo(summary.describe())
