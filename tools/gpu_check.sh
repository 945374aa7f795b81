#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, as ONE script for a lent GPU machine (its python3 has its own CUDA torch).
# Here, first:   bash tools/gpu_wheels.sh        (packages that machine lacks, as wheels in .whl/)
# Then, through the device tool:  bash tools/gpu_check.sh   with carry [".whl"]
# Prints each check and ends with one JSON line per part; exits non-zero when a check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="packages/engine/src:packages/deeptrace/src:packages/clusterx/src:apps/tui/src:.${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || status=1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"

echo "== GPU paths against the CPU fp32 reference"
timeout 300 python3 tools/gpu_check.py || status=1

echo "== attention tests (the CUDA backends run here; they are skipped on CPU machines)"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/engine/test_attention.py || status=1

echo "== MoE block benchmark on CUDA"
timeout 300 python3 tools/bench/moe_block.py --device cuda --dtypes bfloat16 || status=1
exit $status
