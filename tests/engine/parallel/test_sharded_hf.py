"""Hugging Face checkpoints and a sharded model: a folder written by transformers loads into two ranks with the
logits of the unsharded load (and of transformers itself), loading holds no more than one rank's share plus one
tensor, and ``save_hf_sharded`` from two ranks writes a folder transformers loads with the same logits."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import xtrain
from transformers import AutoModelForCausalLM
from xtrain.model.hf import read_hf_config

from .compare import References, check, on_two_ranks, transformers_logits
from .tiny import inputs_of_rank, logits_head, unsharded

TRANSFORMERS_ATOL = 1e-4  # fp32, another implementation's order of operations (as tests/engine/test_hf_parity.py)


@on_two_ranks
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_transformers_checkpoint_loads_into_two_ranks_with_unsharded_logits(
    two_ranks: list[dict[str, Any]], references: References, kind: str
) -> None:
    sharded = check(two_ranks, f"load {kind}")
    folder = getattr(references.folders, kind)
    model = xtrain.load_hf(folder)
    for rank, result in enumerate(sharded):
        input_ids_1T, cu_seqlens = inputs_of_rank(rank, model.config.vocab_size)
        with torch.no_grad():
            expected_TV, _ = model.forward_with_head(input_ids_1T, cu_seqlens, head=logits_head)
        torch.testing.assert_close(result["logits"], expected_TV, rtol=1e-5, atol=1e-5, msg=f"rank {rank}")
        theirs_TV = transformers_logits(getattr(references, kind), input_ids_1T, cu_seqlens)
        difference = float((result["logits"] - theirs_TV).abs().max())
        assert difference <= TRANSFORMERS_ATOL, f"rank {rank}: {difference:.3g} from transformers' logits"


@on_two_ranks
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_loading_into_two_ranks_holds_one_share_plus_one_tensor(two_ranks: list[dict[str, Any]], kind: str) -> None:
    for rank, result in enumerate(check(two_ranks, f"load {kind}")):
        model, largest, peak = result["model bytes"], result["largest tensor bytes"], result["peak"]
        # The slack: while a layer's fused expert tensor is filled, one expert's checkpoint tensor (its gate, up or
        # down projection: 1/(2E) of the fused tensor) is held beside it; 4 KiB covers the tensors of a few bytes
        # the loader allocates on the way (none is counted twice: each is dropped before the next is read).
        slack = largest // 16 + 4096
        bound = model // 2 + largest + slack
        assert peak <= bound, f"rank {rank}: {peak} bytes at peak > share {model // 2} + tensor {largest} + {slack}"
        assert largest * 8 < model  # the model is large enough for the distinction to mean something
        assert peak < 0.7 * model, f"rank {rank}: {peak} bytes at peak, the whole model is {model}"


@on_two_ranks
def test_save_hf_sharded_writes_a_folder_transformers_loads_with_the_same_logits(
    two_ranks: list[dict[str, Any]], references: References
) -> None:
    check(two_ranks, "save moe")
    out = f"{references.folders.out}/saved-moe"
    loaded, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    # The job saved seeded weights (seed 11), not the folder's: compare with the unsharded model of that seed.
    model = unsharded(read_hf_config(references.folders.moe), seed=11, prepare=lambda model: None)
    input_ids_1T, cu_seqlens = inputs_of_rank(0, model.config.vocab_size)
    with torch.no_grad():
        ours_TV, _ = model.forward_with_head(input_ids_1T, cu_seqlens, head=logits_head)
    theirs_TV = transformers_logits(loaded.float().eval(), input_ids_1T, cu_seqlens)
    difference = float((ours_TV - theirs_TV).abs().max())
    assert difference <= TRANSFORMERS_ATOL, f"{difference:.3g} from transformers' logits"
    reference_TV = transformers_logits(references.moe, input_ids_1T, cu_seqlens)
    assert float((theirs_TV - reference_TV).abs().max()) > 0.1  # not the original folder's weights
