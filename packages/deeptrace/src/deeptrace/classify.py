"""Which kind of work a GPU kernel (or a Kineto GPU event) is: communication, memory, sync or compute.

The patterns are regular expressions matched from the start of the kernel name (`re.match`), tried in the order
communication, memory, sync, compute. The defaults follow HTA's rules (so overlap numbers compare) and add the
collective-library names HTA misses (RCCL, HCCL). A kernel that matches no pattern, or that *looks* like
communication (its name mentions nccl, allreduce, ...) without matching a communication pattern, is left
unclassified: counted and reported, never silently called compute.

Users override the lists with a TOML file (`deeptrace analyze --classify FILE`)::

    comm = ['^nccl.*Kernel', '^my_allreduce_kernel']
    memory = ['^Memcpy', '^Memset']
    sync = ['.*Sync']
    compute = ['.*']
    suspect_comm = ['(?i).*(nccl|rccl|hccl)']

Lists given in the file replace the default list of that name; lists not given keep their defaults.
"""

from __future__ import annotations

import re
import tomllib
from functools import cached_property
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from deeptrace.spans import Category

# Kineto event categories (`cat`) that run on the GPU and are classified here.
GPU_EVENT_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"})


class ClassifyConfig(BaseModel):
    """Regular expressions (Python `re`, matched at the start of the name) for each kind of GPU work."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    comm: list[str] = Field(
        default=[
            r"^nccl.*Kernel",  # NCCL and RCCL: ncclKernel_AllReduce_..., ncclDevKernel_Generic
            r"^rccl",  # RCCL-specific kernels
            r"^(?i:hccl|hcom)",  # Huawei HCCL / HCOM collectives on Ascend
            r"^(?i:c10d::|nvshmem)",
        ],
        description="communication kernels (collectives and point-to-point)",
    )
    memory: list[str] = Field(
        default=[r"^Memcpy", r"^Memset", r"^dma"], description="memory copies and sets (HTA: MEMORY)"
    )
    sync: list[str] = Field(
        default=[r".*Sync"], description="synchronisation events (Event Sync, Stream Sync, Context Sync)"
    )
    compute: list[str] = Field(default=[r".*"], description="compute kernels; the default takes all the rest")
    suspect_comm: list[str] = Field(
        default=[r"(?i:.*(nccl|rccl|hccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|sendrecv))"],
        description="names that look like communication: unclassified unless a comm pattern matched",
    )

    @field_validator("comm", "memory", "sync", "compute", "suspect_comm")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"invalid regular expression {pattern!r}: {err}") from None
        return patterns


def load_classify_config(path: Path) -> ClassifyConfig:
    """Read a classification TOML file; a ValueError names the file and the key at fault."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{path}: cannot read the classification file ({err.strerror})") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: invalid TOML ({err})") from None
    try:
        return ClassifyConfig(**raw)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
        raise ValueError(
            f"{path}: {problems} (allowed keys: comm, memory, sync, compute, suspect_comm, each a list of regular"
            " expressions)"
        ) from None


class KernelClassifier:
    """Classifies names with a ClassifyConfig, caching each distinct name (traces repeat names a lot)."""

    def __init__(self, config: ClassifyConfig | None = None) -> None:
        self.config = config or ClassifyConfig()
        self._cache: dict[tuple[str, str], Category] = {}

    @cached_property
    def _rules(self) -> list[tuple[Category, list[re.Pattern[str]]]]:
        # Each pattern is compiled on its own: a user's pattern may carry global flags such as (?i).
        c = self.config
        named = [
            (Category.COMM, c.comm),
            (Category.MEMORY, c.memory),
            (Category.SYNC, c.sync),
            (Category.OTHER, c.suspect_comm),
            (Category.COMPUTE, c.compute),
        ]
        return [(cat, [re.compile(p) for p in pats]) for cat, pats in named]

    def classify(self, name: str, event_category: str = "kernel") -> Category:
        """The Category of one GPU event; Category.OTHER when unclassified."""
        key = (name, event_category)
        found = self._cache.get(key)
        if found is None:
            found = self._classify(name, event_category)
            self._cache[key] = found
        return found

    def _classify(self, name: str, event_category: str) -> Category:
        for category, patterns in self._rules:
            if category is Category.OTHER and event_category in ("gpu_memcpy", "gpu_memset", "cuda_sync"):
                # Kineto says what these are even when the name is unusual.
                return Category.MEMORY if event_category != "cuda_sync" else Category.SYNC
            if any(p.match(name) for p in patterns):
                return category
        return Category.OTHER
