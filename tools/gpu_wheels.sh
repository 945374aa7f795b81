#!/usr/bin/env bash
# Wheels of the pure-Python/binary packages the lent GPU machine's image lacks (Python 3.12 there), into .whl/
# (ignored by git; the device tool carries it). See tools/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d .whl $(for name in pydantic pydantic-core annotated-types typing-inspection orjson; do
        # The versions of uv.lock, so that pydantic and its compiled core match.
        echo "$name==$(grep -A1 "^name = \"$name\"$" uv.lock | sed -n 's/version = "\(.*\)"/\1/p')"
    done)
ls .whl
