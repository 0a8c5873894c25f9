"""NIC pools as the daemon serves them: from `nics.resourceList` (or the default pool) to `NicPool`s.

Why a pool type of its own: `build_resources` needs, per NIC resource, which
NICs it takes (first matching pool wins), its policy, whether it advertises
NUMA, and how Allocate answers; it must not care whether the pool came from a
config entry or is the default one that takes every NIC. Both answer
Allocate with the same builder, so an RDMA NIC gets its device nodes and
`_INFO` in any pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocator.topology import Device

from .allocate import NicAllocateBuilder
from .config import CONFIG_PATH, DEFAULT_PREFIX, parse_pool_specs
from .selectors import PoolSpec, Selector


@dataclass(frozen=True)
class NicPool:
    """A NIC resource: which NICs it takes and how it allocates.

    `select` is the pool's selector (SR-IOV-network-device-plugin style); the
    first pool that matches a NIC gets it. `builder` answers Allocate
    (`plugin.model.resources.AllocateBuilder`).
    """

    resource_name: str
    select: Callable[[Device], bool]
    policy: str = "spread"
    exclude_topology: bool = False
    builder: Any = None


def parse_pools(raw: Any, source: str, *, default_prefix: str = DEFAULT_PREFIX, dev_root: str = "/dev",
                path: str = CONFIG_PATH) -> tuple[NicPool, ...]:
    """`nics.resourceList` -> the `NicPool`s for `ResourceOptions(nic_pools=...)`.

    `source` (the config file) and `path` name the place in errors. `dev_root`
    is where Allocate looks for (and points the runtime at) device nodes.
    """
    return tuple(
        NicPool(
            resource_name=spec.resource_name,
            select=spec,
            policy=spec.policy,
            exclude_topology=spec.exclude_topology,
            builder=NicAllocateBuilder(spec, dev_root),
        )
        for spec in parse_pool_specs(raw, source, default_prefix=default_prefix, path=path)
    )


def default_pool(resource_name: str, policy: str = "spread", dev_root: str = "/dev") -> NicPool:
    """The pool that takes every NIC when the config defines none (`--nic-resource-name`).

    It answers Allocate like a configured pool with an empty selector, so an
    RDMA-capable NIC gets its `/dev/infiniband` nodes and `_INFO` here too
    (docs/nics.md).
    """
    prefix, _, name = resource_name.partition("/")
    spec = PoolSpec(prefix, name, (Selector(),), policy)
    return NicPool(resource_name, spec, policy, False, NicAllocateBuilder(spec, dev_root))


def pool_of(device: Device, pools: Sequence[NicPool]) -> NicPool | None:
    """The pool that gets `device` (first match), or None."""
    for pool in pools:
        if pool.select(device):
            return pool
    return None


@dataclass(frozen=True)
class PoolSummary:
    """For `discover`: which NICs each pool gets."""

    resource_name: str
    policy: str
    exclude_topology: bool
    devices: tuple[str, ...] = field(default_factory=tuple)


def summarize(devices: Sequence[Device], pools: Sequence[NicPool]) -> tuple[tuple[PoolSummary, ...], tuple[str, ...]]:
    """Pool membership (first match wins) and the NICs no pool takes."""
    members: dict[str, list[str]] = {p.resource_name: [] for p in pools}
    left: list[str] = []
    for d in devices:
        pool = pool_of(d, pools)
        if pool is None:
            left.append(d.name)
        else:
            members[pool.resource_name].append(d.name)
    return (
        tuple(PoolSummary(p.resource_name, p.policy, p.exclude_topology, tuple(members[p.resource_name]))
              for p in pools),
        tuple(left),
    )
