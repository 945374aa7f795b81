"""A 2-process gloo job for the clusterx torchrun test: all_reduce of the ranks, each rank writes what it saw."""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
out = Path(os.environ["CLUSTERX_RUN_DIR"]) / f"rank-{rank}.json"
out.write_text(json.dumps({"rank": rank, "world": world, "sum": value.item(), "job": os.environ["CLUSTERX_JOB_ID"]}))
dist.destroy_process_group()
