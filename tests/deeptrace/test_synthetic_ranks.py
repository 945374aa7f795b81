"""tools/synthetic_ranks.py, the generator of the 1,024-rank benchmark (tools/bench/deeptrace_ranks.py), at a
size a test affords: seeded, realistic per-kind sequences, the planted straggler named by analyze and by diff."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import orjson
import pytest
from click.testing import CliRunner
from deeptrace.cli import main

TOOL = Path(__file__).resolve().parents[2] / "tools" / "synthetic_ranks.py"


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("synthetic_ranks", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["synthetic_ranks"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _json(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(main, [*args, "--json", "-j", "1"])
    assert result.exit_code == 0, result.output
    data: dict[str, object] = orjson.loads(result.stdout)
    return data


def test_seeded_and_the_straggler_is_named(generator: ModuleType, tmp_path: Path) -> None:
    plan = generator.Plan(ranks=16, steps=3, seed=3)
    assert [s.end.tolist() for s in generator.simulate(plan)] == [s.end.tolist() for s in generator.simulate(plan)]
    generator.write_run(tmp_path / "a", plan)
    spans = generator.write_run(tmp_path / "b", generator.Plan(ranks=16, steps=3, seed=3, straggler=11))
    assert spans == 16 * len(generator.simulate(plan))
    report = _json("analyze", str(tmp_path / "b"), "--no-png", "-o", str(tmp_path / "out"))
    assert [c["rank"] for c in report["stragglers"]["culprits"]] == [11]  # type: ignore[index]
    kinds = report["ranks"]["0"]["collective_kinds"]  # type: ignore[index]
    assert set(kinds) == {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"}
    purposes = report["ranks"]["0"]["collective_purposes"]  # type: ignore[index]
    assert set(purposes) == {"fsdp_param_gather", "grad_reduce_scatter", "hsdp_all_reduce", "ep_dispatch", "ep_combine"}
    diff = _json("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--step", "all")
    fell_most = min(diff["ranks"], key=lambda r: r["delta_exposed_us"])  # type: ignore[arg-type]
    assert fell_most["rank"] == 11
