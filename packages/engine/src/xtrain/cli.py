"""Command line of xtrain.

The group imports nothing heavy: each command imports torch and the model code inside its own body, so
``xtrain --help`` stays fast.
"""

import json

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
    click.echo(f"FLOPs/token (train)  {figures['training_flops_per_token']:.4g} at one document of {seq_len} tokens")
    click.echo(f"  weight matmuls     {matmul_per_token:.4g} (6 x {counts.active_matmul:,} active matmul weights)")
    click.echo(f"  attention          {attention_per_token:.4g} (causal)")
