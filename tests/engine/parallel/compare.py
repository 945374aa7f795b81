"""What the tests need to read the sharded jobs' results and to compute their unsharded references."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import torch

from .jobs import HFFolders

Test = TypeVar("Test", bound=Callable[..., None])


def marked(group: str) -> Callable[[Test], Test]:
    def mark(test: Test) -> Test:
        for marker in (pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.xdist_group(group)):
            test = marker(test)
        return test

    return mark


# One xdist group per job: the tests reading a job's results run on one worker, which spawns the job once.
on_two_ranks = marked("parallel-two-ranks")
on_four_ranks = marked("parallel-four-ranks")


@dataclass(frozen=True)
class References:
    """The checkpoints transformers wrote (conftest.py), and its models that wrote them."""

    folders: HFFolders
    dense: Any  # transformers' Qwen3ForCausalLM
    moe: Any  # transformers' Qwen3MoeForCausalLM


def check(results: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """Every rank's result of the check ``name``, failing the test with the rank's traceback if it raised."""
    for result in results:
        assert "error" not in result[name], result[name]["error"]
    return [result[name] for result in results]


def transformers_logits(model: Any, input_ids_1T: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """[T, V] logits of transformers' model on a packed row, one document at a time (their positions restart)."""
    bounds = cu_seqlens.tolist()
    with torch.no_grad():
        pieces = [model(input_ids=input_ids_1T[:, a:b]).logits[0] for a, b in itertools.pairwise(bounds)]
    return torch.cat(pieces)
