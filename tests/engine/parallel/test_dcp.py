"""torch.distributed.checkpoint on the sharded model: get_model_state_dict + dcp.save, then dcp.load +
set_model_state_dict into a model initialised differently, restores every shard and buffer bit for bit."""

from __future__ import annotations

from typing import Any

from .compare import check, on_two_ranks


@on_two_ranks
def test_dcp_round_trip_restores_identical_parameters_and_buffers(two_ranks: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(check(two_ranks, "dcp")):
        assert any(key.endswith("e_score_correction_bias") for key in result["keys"])
        assert len(result["keys"]) > 30, result["keys"]
        assert result["different after load"] == [], f"rank {rank}"
        # Only the norms (ones for every seed) and nothing else may agree before loading: the load did the work.
        assert all(key.endswith("norm.weight") for key in result["equal before load"]), result["equal before load"]
