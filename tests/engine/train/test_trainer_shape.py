"""The trainer's code stays small enough to hold in one's head (issue 20): no function in xtrain/train/ is longer
than 60 lines, and none silences ruff's size checks to get there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import xtrain.train

TRAIN = Path(xtrain.train.__file__).parent
LIMIT = 60
SIZE_RULES = re.compile(r"noqa:[^\n]*\b(PLR0915|PLR0912|PLR0913|PLR0917|C901)\b")


def test_no_function_of_the_trainer_is_longer_than_60_lines() -> None:
    too_long = []
    for path in sorted(TRAIN.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > LIMIT:
                    too_long.append(f"{path.relative_to(TRAIN)}:{node.lineno} {node.name} ({length} lines)")
    assert not too_long


def test_no_size_check_is_silenced_in_the_trainer() -> None:
    silenced = [str(path) for path in TRAIN.rglob("*.py") if SIZE_RULES.search(path.read_text())]
    assert not silenced
