"""Preferred-allocation policies (pure: no I/O, no gRPC, no global state).

`get_policy(name, **options)` builds one by name:

| name | for | objective (best first) |
|---|---|---|
| `numa-first` | GPUs (default) | span, W(S), W(A\\S), lowest positions |
| `link-first` | GPUs | W(S), span, W(A\\S), lowest positions |
| `spread` | NICs (default) | span, most ports, W(S), W(A\\S), lowest positions |
| `packed` | NICs | span, fewest ports, W(S), W(A\\S), lowest positions |
| `replicas` | time-slicing replicas | span, most GPUs, least load, W(GPUs), lowest positions |
| `mig` | MIG devices | span, fewest GPUs, fullest GPUs first, lowest positions |

`replicas` and `mig` read the parents of a graph built by `allocator.subdevices`;
they are chosen by the kind of resource, not configured, so `POLICY_NAMES` (the
choices a config offers) leaves them out and `SHARED_POLICY_NAMES` lists them.

Options: `time_budget_s` (float seconds or None, default 0.020) and
`exact_limit` (int, default 16); see `SearchPolicy`.
"""

from __future__ import annotations

from typing import Any

from ..request import Policy
from ..topology import DeviceGraph
from .base import DEFAULT_EXACT_LIMIT, DEFAULT_TIME_BUDGET_S, SearchPolicy
from .gpu import LinkFirstPolicy, NumaFirstPolicy
from .mig import MigPolicy
from .nic import PackedPolicy, SpreadPolicy
from .replicas import ReplicaPolicy
from .subsets import SubsetTableCache

_REGISTRY: dict[str, type[SearchPolicy]] = {
    "numa-first": NumaFirstPolicy,
    "link-first": LinkFirstPolicy,
    "spread": SpreadPolicy,
    "packed": PackedPolicy,
    "replicas": ReplicaPolicy,
    "mig": MigPolicy,
}

#: Every valid policy name, defaults first (GPU, then NIC).
POLICY_NAMES: tuple[str, ...] = ("numa-first", "link-first", "spread", "packed")
#: Policies of shared/partitioned GPU resources: time-slicing replicas and MIG devices.
SHARED_POLICY_NAMES: tuple[str, ...] = ("replicas", "mig")
DEFAULT_GPU_POLICY = "numa-first"
DEFAULT_NIC_POLICY = "spread"
_OPTIONS = ("time_budget_s", "exact_limit")


def get_policy(name: str, *, tables: SubsetTableCache | None = None, **options: Any) -> Policy:
    """The policy called `name`, configured by `options`; its subset tables in `tables` (the cache of
    whoever owns the topology, `subsets`), else in a cache of its own.

    Raises ValueError naming the valid choices for an unknown name or option.
    """
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(f"unknown allocation policy {name!r}: valid policies are {', '.join(POLICY_NAMES + SHARED_POLICY_NAMES)}")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ValueError(
            f"unknown option(s) for policy {name!r}: {', '.join(unknown)}; valid options are {', '.join(_OPTIONS)}"
        )
    return cls(**options) if tables is None else cls(tables=tables, **options)


def prepare_tables(name: str, graph: DeviceGraph, tables: SubsetTableCache) -> None:
    """Build in `tables` what policy `name` looks up for `graph` (`subsets`: small resources) now, where
    the resource is built, so that no request pays for it; nothing for other policies or an unknown name."""
    cls = _REGISTRY.get(name)
    tables.prepare(graph, cls.subset_order if cls is not None else None)


__all__ = [
    "DEFAULT_EXACT_LIMIT",
    "DEFAULT_GPU_POLICY",
    "DEFAULT_NIC_POLICY",
    "DEFAULT_TIME_BUDGET_S",
    "POLICY_NAMES",
    "LinkFirstPolicy",
    "MigPolicy",
    "NumaFirstPolicy",
    "PackedPolicy",
    "ReplicaPolicy",
    "SHARED_POLICY_NAMES",
    "SearchPolicy",
    "SpreadPolicy",
    "SubsetTableCache",
    "get_policy",
    "prepare_tables",
]
