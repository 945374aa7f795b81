"""What `xtrain plan` prints: one plan, or the search's ranking (and the best written as a config)."""

from __future__ import annotations

import json
from pathlib import Path

from xtrain.config import TrainConfig, load_train_config, to_toml
from xtrain.errors import ConfigError
from xtrain.plan.planner import Cluster, make_plan, planned_model, resolve_cluster
from xtrain.plan.render import plan_text, search_text
from xtrain.plan.search import Candidate
from xtrain.plan.search import search as search_combinations

TOP = 5


def run_plan(  # noqa: PLR0917 (the command's options, passed on)
    config_path: Path,
    overrides: tuple[str, ...],
    gpus: int | None,
    gpus_per_node: int | None,
    device_name: str | None,
    as_json: bool,
    search: bool,
    write_path: Path | None,
) -> str:
    """The command's output; ConfigError (a user error) for what cannot be planned."""
    config = load_train_config(config_path, overrides)
    cluster = resolve_cluster(config, gpus, gpus_per_node, device_name)
    if not search:
        plan = make_plan(config, cluster)
        return json.dumps(plan.to_json()) if as_json else plan_text(plan)
    ranked = search_combinations(config, planned_model(config), cluster)
    if write_path is not None:
        _write_best(ranked[0], cluster, write_path)
    if as_json:
        return json.dumps({"best": ranked[0].plan.to_json(), "top": [c.plan.to_json() for c in ranked[:TOP]]})
    text = search_text(ranked, TOP)
    return text + (f"\n\nwrote the best to {write_path}" if write_path is not None else "")


def _write_best(best: Candidate, cluster: Cluster, path: Path) -> None:
    """The best combination as a ready config, its ``[plan]`` naming the cluster, the plan's summary on top."""
    raw = best.config.model_dump(by_alias=True)
    raw["plan"].update(gpus=cluster.gpus, gpus_per_node=cluster.gpus_per_node, device=cluster.device.name)
    plan = best.plan
    header = (
        f"# Written by xtrain plan --search for {cluster.gpus} x {cluster.device.name} ({cluster.gpus_per_node} "
        f"per node): estimated {plan.tokens_per_s:,.0f} tokens/s, MFU {100 * plan.mfu:.1f}%, peak "
        f"{plan.peak_bytes / 2**30:.1f} GiB of {plan.capacity_bytes / 2**30:.0f} GiB per rank.\n"
    )
    try:
        path.write_text(header + to_toml(TrainConfig.model_validate(raw)))
    except OSError as error:
        raise ConfigError(f"--write {path}: {error.strerror}") from None
