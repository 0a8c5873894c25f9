"""From a node topology to the extended resources the kubelet sees.

Why a layer of its own: the servers must know nothing of discovery or
scoring. A `Resource` carries everything one server needs: the plugin IDs
with health and NUMA, the allocator's `DeviceGraph` (built here, once per
topology, never inside an RPC), the policy name and the Allocate builder.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from allocator.topology import Device, DeviceGraph, DeviceKind, NodeTopology

from .allocate_response import ContainerAllocation
from .errors import OptionError
from .gpu_allocate import GpuAllocateBuilder, GpuAllocateOptions
from .nic_pools.pools import NicPool, default_pool
from .resource_names import check_resource_name
from .sources.errors import TopologyError

__all__ = [
    "AllocateBuilder", "NicPool", "Resource", "ResourceDevice", "ResourceOptions", "build_resources",
    "check_resource_name", "gpu_id", "simulated_uuid",
]

ID_STRATEGIES = ("uuid", "index")
_UUID_NS = uuid.UUID("6f1c3b9e-2a41-4d3f-9b7e-0c5d8e4f1a22")


class AllocateBuilder(Protocol):
    def build(self, ids: Sequence[str], devices: Sequence[Device]) -> ContainerAllocation: ...


@dataclass(frozen=True)
class ResourceDevice:
    """One advertised device: its plugin ID and the device behind it."""

    id: str
    device: Device
    #: NUMA node advertised in TopologyInfo (None: no topology; also when the pool excludes topology).
    numa: int | None

    @property
    def health(self) -> str:
        return self.device.health


@dataclass(frozen=True)
class Resource:
    name: str
    kind: DeviceKind
    devices: tuple[ResourceDevice, ...]
    policy: str
    graph: DeviceGraph
    builder: AllocateBuilder = field(compare=False)
    #: Policy options passed to `get_policy` (e.g. the time budget).
    policy_options: Mapping[str, object] = field(default_factory=dict, compare=False)

    @property
    def socket_name(self) -> str:
        """`topo-<domain>-<name>.sock`: unique per resource, readable in `ls device-plugins/`."""
        return "topo-" + re.sub(r"[^A-Za-z0-9_.-]", "-", self.name) + ".sock"

    def by_id(self) -> dict[str, ResourceDevice]:
        return {d.id: d for d in self.devices}

    def listing(self) -> tuple[tuple[str, str, int | None], ...]:
        """(ID, health, NUMA) of every device: what ListAndWatch sends; equal listings need no resend."""
        return tuple((d.id, d.health, d.numa) for d in self.devices)

    def allocate(self, ids: Sequence[str]) -> ContainerAllocation:
        table = self.by_id()
        return self.builder.build(list(ids), [table[i].device for i in ids])


@dataclass(frozen=True)
class ResourceOptions:
    device_id_strategy: str = "uuid"
    gpu_resource_name: str = "nvidia.com/gpu"
    gpu_policy: str = "numa-first"
    gpu_policy_options: Mapping[str, object] = field(default_factory=dict)
    gpu_allocate: GpuAllocateOptions = field(default_factory=GpuAllocateOptions)
    #: NIC pools; when empty, every NIC goes to one pool named `nic_resource_name`.
    nic_pools: tuple[NicPool, ...] = ()
    nic_resource_name: str = "topo.dev/nic"
    nic_policy: str = "spread"
    #: Where NIC Allocate responses find device nodes (vfio, /dev/infiniband...), for the default pool.
    dev_root: str = "/dev"
    #: The GPU–NIC pairing window in seconds (0: off). Not used to build resources: it travels with
    #: them because a config reload applies it live, as it applies them (`plugin.pairing_service`).
    pairing_window_s: float = 1.0

    def __post_init__(self) -> None:
        if self.device_id_strategy not in ID_STRATEGIES:
            raise OptionError(f"device ID strategy {self.device_id_strategy!r} is not one of uuid, index")
        check_resource_name(self.gpu_resource_name)
        check_resource_name(self.nic_resource_name)
        for p in self.nic_pools:
            check_resource_name(p.resource_name)


def simulated_uuid(source: str, name: str) -> str:
    """A stable made-up GPU UUID: the same node source and device always give the same ID."""
    return "GPU-" + str(uuid.uuid5(_UUID_NS, f"{source}/{name}"))


def gpu_id(topology: NodeTopology, device: Device, strategy: str) -> str:
    if strategy == "index":
        return str(device.index)
    return device.uuid or simulated_uuid(topology.source, device.name)


def _resource(
    topology: NodeTopology, name: str, kind: DeviceKind, members: list[tuple[str, Device, int | None]],
    policy: str, builder: AllocateBuilder, policy_options: Mapping[str, object] | None = None,
) -> Resource:
    devs = tuple(ResourceDevice(i, d, numa) for i, d, numa in members)
    graph = DeviceGraph.from_topology(topology, [d for _, d, _ in members], [i for i, _, _ in members])
    # NUMA in the graph follows what is advertised (an excluded topology means no NUMA preference).
    graph = DeviceGraph(graph.ids, tuple(n for _, _, n in members), graph.weights, graph.ports)
    return Resource(name, kind, devs, policy, graph, builder, dict(policy_options or {}))


def build_resources(topology: NodeTopology, options: ResourceOptions) -> list[Resource]:
    """The resources to serve for `topology`; resources with no device are left out."""
    out: list[Resource] = []
    gpus = topology.gpus
    if gpus:
        members = [(gpu_id(topology, d, options.device_id_strategy), d, d.numa) for d in gpus]
        ids = [m[0] for m in members]
        if len(set(ids)) != len(ids):
            raise TopologyError(topology.source, f"GPU IDs are not unique: {', '.join(ids)}",
                                fix="give every GPU its own uuid (or use --device-id-strategy index)")
        out.append(
            _resource(topology, options.gpu_resource_name, DeviceKind.GPU, members, options.gpu_policy,
                      GpuAllocateBuilder(options.gpu_allocate, options.gpu_resource_name),
                      options.gpu_policy_options)
        )
    nics = topology.nics
    if nics:
        pools = options.nic_pools or (default_pool(options.nic_resource_name, options.nic_policy, options.dev_root),)
        taken: set[str] = set()
        for pool in pools:
            members = []
            for d in nics:
                if d.name in taken or not pool.select(d):
                    continue
                taken.add(d.name)
                members.append((d.name, d, None if pool.exclude_topology else d.numa))
            if members:
                out.append(
                    _resource(topology, pool.resource_name, DeviceKind.NIC, members, pool.policy,
                              pool.builder or default_pool(pool.resource_name, pool.policy, options.dev_root).builder)
                )
    return out
