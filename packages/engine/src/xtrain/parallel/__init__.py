"""Parallelism applied to a model from outside: the model files know nothing of it.

One function per technique, applied in this order by the trainer (torchtitan's order):

1. ``apply_activation_checkpointing`` (checkpointing.py): the decoder layers a policy selects wrapped in
   non-reentrant checkpointing that saves the routing (optional).
2. ``apply_activation_offload`` (offload.py): the checkpointed layers' checkpoints moved to host memory during
   forward and brought back one layer ahead in backward (optional).
3. ``apply_compile`` (compile.py): each decoder layer compiled on its own (optional).
4. ``apply_fsdp`` (fsdp.py): FSDP2 ``fully_shard`` per decoder layer, the embedding, the [final norm + output
   projection] group, then the root; mixed precision; explicit prefetch of the neighbouring layer.
5. ``materialize`` (materialize.py): parameters allocated on the device and initialised (or loaded from a Hugging
   Face folder) after sharding, so no rank ever holds the full model.

``distributed.py`` starts the process group (torchrun's environment, or one process) and ``mesh.py`` builds the
data-parallel device mesh (plain FSDP, or HSDP replicate × shard).
"""
