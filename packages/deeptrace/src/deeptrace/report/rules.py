"""--fail-on RULES: conditions on report.json that make `deeptrace analyze` exit non-zero (for CI).

RULES is a comma-separated list. Each rule is a name alone (true when present) or a name, a comparison
(<, <=, >, >=) and a number:

    overlap<50      some rank's overlap_pct is below 50
    exposed>20      some rank's exposed_comm_ms_per_step is above 20 (ms)
    idle>30         some rank's idle share of its analysis window is above 30 (%)
    skew>5          the largest arrival skew of a matched collective is above 5 (ms)
    straggler       the straggler verdict names a culprit
    hang            a hang was diagnosed
    warnings        the report has warnings
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from deeptrace.report.model import RankReport, Report

_RULE = re.compile(r"^\s*([a-z_]+)\s*(?:(<=|>=|<|>)\s*(-?\d+(?:\.\d+)?))?\s*$")
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _per_rank(field: Callable[[RankReport], float | None]) -> Callable[[Report], list[tuple[str, float]]]:
    def values(report: Report) -> list[tuple[str, float]]:
        found = [(f"rank {k}", field(r)) for k, r in report.ranks_sorted()]
        return [(who, v) for who, v in found if v is not None]

    return values


_MEASURES: dict[str, Callable[[Report], list[tuple[str, float]]]] = {
    "overlap": _per_rank(lambda r: r.overlap_pct),
    "exposed": _per_rank(lambda r: r.exposed_comm_ms_per_step),
    "idle": _per_rank(lambda r: r.breakdown.idle_pct),
    "skew": lambda rep: [("max skew", v)] if (v := rep.collectives.skew_ms.max) is not None else [],
}
_FLAGS: dict[str, Callable[[Report], bool]] = {
    "straggler": lambda rep: rep.stragglers.verdict == "straggler",
    "hang": lambda rep: rep.hang is not None,
    "warnings": lambda rep: bool(rep.warnings),
}


@dataclass(frozen=True)
class Rule:
    text: str
    name: str
    op: str | None = None
    threshold: float | None = None

    def met(self, report: Report) -> str | None:
        """A sentence saying why the rule is met, or None."""
        if self.op is None:
            return f"{self.text}: met" if _FLAGS[self.name](report) else None
        assert self.threshold is not None
        hits = [(who, v) for who, v in _MEASURES[self.name](report) if _OPS[self.op](v, self.threshold)]
        if not hits:
            return None
        return f"{self.text}: " + ", ".join(f"{who} {v:g}" for who, v in hits)


def parse_rules(text: str) -> list[Rule]:
    """Parse RULES; a ValueError says which rule is wrong and what is allowed."""
    rules = []
    allowed = f"{', '.join(f'{n}<N / {n}>N' for n in _MEASURES)}, {', '.join(_FLAGS)}"
    for part in filter(None, (p.strip() for p in text.split(","))):
        found = _RULE.match(part)
        if not found:
            raise ValueError(f"--fail-on: cannot read rule {part!r}; allowed: {allowed}")
        name, op, number = found.groups()
        if (op is None and name not in _FLAGS) or (op is not None and name not in _MEASURES):
            raise ValueError(f"--fail-on: unknown rule {part!r}; allowed: {allowed}")
        rules.append(Rule(part, name, op, float(number) if number is not None else None))
    return rules
