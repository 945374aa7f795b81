"""Mixture-of-Experts block: router, dropless grouped experts, auxiliary losses, HF layout of one layer.

Interface used by the model:

    from xtrain.model.moe import MoEConfig, MoEBlock, RouterStats

    cfg = MoEConfig.from_hf_config(hf_config_dict)      # Qwen3-MoE or DeepSeek-V3 keys
    block = MoEBlock(hidden_size, cfg)                  # on any device, also "meta"
    block.to_empty(device=...); block.init_weights()    # deterministic (global seed or a generator)
    y_TD, stats = block(x_TD)                           # x [T, D] -> y [T, D], RouterStats

Losses (`xtrain.model.moe.aux_loss`), over the stats of every MoE layer of one micro-batch:

    load_balancing_loss(stats, global_tokens_per_expert=counts_LE, global_num_tokens=n)
    router_z_loss(stats, global_num_tokens=n)

With the global arguments each micro-batch's value is its exact share of the global-batch loss (the trainer
sums the counts over micro-batches and ranks, see aux_loss's docstring); the trainer applies the coefficients
`cfg.aux_loss_coef` and `cfg.z_loss_coef`.

Aux-loss-free balancing (sigmoid router): `update_expert_bias(block.router.e_score_correction_bias,
global_tokens_per_expert_E, cfg.bias_update_rate)` once per optimizer step; the bias changes selection only.

Checkpoints (`xtrain.model.moe.hf_keys`): `moe_state_from_hf(get, "model.layers.3.mlp.", cfg)`,
`moe_state_to_hf(state, prefix, cfg)`, `moe_hf_keys(prefix, cfg)`.

Parameters of the block: `router.weight` [E, D], buffer `router.e_score_correction_bias` [E] (fp32, sigmoid
router only), `experts.gate_up_proj` [E, 2F, D], `experts.down_proj` [E, D, F], and with shared experts
`shared_experts.{gate,up,down}_proj.weight`. No torch.distributed anywhere in this package.
"""

from xtrain.model.moe.block import MoEBlock, RouterStats
from xtrain.model.moe.config import MoEConfig, UnsupportedHFMoEConfigError
from xtrain.model.moe.router import update_expert_bias

__all__ = ["MoEBlock", "MoEConfig", "RouterStats", "UnsupportedHFMoEConfigError", "update_expert_bias"]
