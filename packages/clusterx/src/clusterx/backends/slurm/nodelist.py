"""Slurm host lists: 'node[01-03,05],gpu7' → ['node01', 'node02', 'node03', 'node05', 'gpu7'].

Written here rather than calling `scontrol show hostnames` so that polling many jobs costs no process per job.
Follows Slurm's hostlist syntax: comma-separated names, each with zero or more bracket groups of
comma-separated numbers and ranges; a range keeps the zero-padding of its lower bound ('[01-10]').
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping


class HostlistError(ValueError):
    """A host list Slurm would not have printed."""


def split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"host list {text!r}: ']' without '['")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise HostlistError(f"host list {text!r}: '[' without ']'")
    parts.append("".join(current))
    return [part for part in parts if part]


def _expand_group(group: str, whole: str) -> list[str]:
    """'01-03,05' → ['01', '02', '03', '05']."""
    values: list[str] = []
    for item in group.split(","):
        low, dash, high = item.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise HostlistError(f"host list {whole!r}: bad range {item!r}")
        if not dash:
            values.append(low)
            continue
        if int(high) < int(low):
            raise HostlistError(f"host list {whole!r}: range {item!r} runs backwards")
        width = len(low)
        values.extend(str(number).zfill(width) for number in range(int(low), int(high) + 1))
    return values


def _expand_name(name: str) -> list[str]:
    """One name with bracket groups → every host it stands for (groups combine as a cartesian product)."""
    pieces: list[list[str]] = []
    rest = name
    while "[" in rest:
        prefix, _, tail = rest.partition("[")
        group, closed, rest = tail.partition("]")
        if not closed:
            raise HostlistError(f"host list {name!r}: '[' without ']'")
        pieces.append([prefix])
        pieces.append(_expand_group(group, name))
    pieces.append([rest])
    return ["".join(combo) for combo in itertools.product(*pieces)]


def expand_hostlist(text: str) -> list[str]:
    """Every host of a Slurm host list, in Slurm's order; '', '(null)' and 'None assigned' give []."""
    text = text.strip()
    if text in ("", "(null)", "None assigned", "None"):
        return []
    return [host for name in split_top_level(text) for host in _expand_name(name)]


def rank_to_host(hosts: list[str], procs_per_node: int) -> Mapping[int, str]:
    """Global rank → host: node i runs ranks i*procs_per_node ... (i+1)*procs_per_node-1.

    This is both torchrun's numbering (node rank i, local ranks 0..n-1) and srun's default block distribution.
    """
    return {
        node_index * procs_per_node + local_rank: host
        for node_index, host in enumerate(hosts)
        for local_rank in range(procs_per_node)
    }
