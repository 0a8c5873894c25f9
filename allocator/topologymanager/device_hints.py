"""The device manager's topology hints (the kubelet's `devicemanager/topology_hints.go`).

Why this matters for a device plugin: what the kubelet calls a *preferred*
hint depends on the devices *installed*, not on the free ones.
`minAffinitySize` is the smallest number of NUMA nodes that could hold the
request counting every device of the resource (allocated and unhealthy ones
included); a mask is preferred only if it has exactly that many nodes. So with
4 GPUs per node, 2 in use on each, a request for 4 only fits on {0,1}, which is
*not* preferred, and `restricted` / `single-numa-node` reject the pod.

Other rules kept exactly (kubelet 1.37):
- masks are built from the NUMA nodes that hold devices of the resource (and
  that the machine has), not from every machine node (1.37; 1.34 and older
  iterate every machine node, so they also offer masks with device-less nodes);
- a resource is topology-aware if any device reports at least one NUMA node;
  otherwise its hints are None ("no preference");
- devices without topology (or with IDs that are not machine nodes) never
  count towards any mask;
- a reusable device (from an earlier init container) with topology must lie
  inside the mask, or the mask is skipped; a reusable device whose topology
  is present but empty rules out every mask (a kubelet quirk);
- a container that already has devices gets hints regenerated from them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .bitmask import iterate_bitmasks
from .hint import TopologyHint


@dataclass(frozen=True)
class DeviceInfo:
    """One device as the plugin reports it in ListAndWatch.

    `numa_nodes is None`: no TopologyInfo at all; `()`: a TopologyInfo with no
    nodes. The kubelet treats the two slightly differently (see module doc).
    """

    id: str
    numa_nodes: tuple[int, ...] | None = None
    healthy: bool = True

    @property
    def numa_ids(self) -> tuple[int, ...]:
        return self.numa_nodes or ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "numa_nodes": None if self.numa_nodes is None else list(self.numa_nodes),
            "healthy": self.healthy,
        }


def device_has_topology_alignment(devices: Iterable[DeviceInfo]) -> bool:
    """True if any device reports a NUMA node: only then does the resource give hints."""
    return any(d.numa_nodes for d in devices)


def device_numa_nodes(numa_nodes: Sequence[int], all_devices: Mapping[str, DeviceInfo]) -> tuple[int, ...]:
    """The machine NUMA nodes holding at least one device of the resource, sorted; all
    machine nodes if none does (the kubelet's `deviceNUMANodes` and its fallback).

    Why: the kubelet (1.37) only iterates masks over these, so a node without devices
    never appears in a device hint.
    """
    machine = set(numa_nodes)
    held = sorted({n for d in all_devices.values() for n in d.numa_ids if n in machine})
    return tuple(held) if held else tuple(numa_nodes)


def min_affinity_size(numa_nodes: Sequence[int], all_devices: Mapping[str, DeviceInfo], request: int) -> int:
    """Fewest NUMA nodes whose *installed* devices could hold `request` (all nodes that
    hold devices if none can)."""
    numa_nodes = device_numa_nodes(numa_nodes, all_devices)
    smallest = len(numa_nodes)
    for mask in iterate_bitmasks(numa_nodes):
        in_mask = sum(1 for d in all_devices.values() if mask.any_set(d.numa_ids))
        if in_mask >= request and mask.count() < smallest:
            smallest = mask.count()
    return smallest


def generate_device_topology_hints(
    numa_nodes: Sequence[int],
    all_devices: Mapping[str, DeviceInfo],
    available: Iterable[str],
    reusable: Iterable[str],
    request: int,
) -> list[TopologyHint]:
    """One hint per NUMA mask that can hold the request, in the kubelet's mask order."""
    available = list(available)
    reusable = list(reusable)
    smallest = min_affinity_size(numa_nodes, all_devices, request)
    numa_nodes = device_numa_nodes(numa_nodes, all_devices)
    hints: list[TopologyHint] = []
    for mask in iterate_bitmasks(numa_nodes):
        matching = 0
        skip = False
        for d in reusable:
            dev = all_devices.get(d)
            if dev is None or dev.numa_nodes is None:
                continue  # no topology information: neither counts nor excludes
            if not mask.any_set(dev.numa_nodes):
                skip = True
                break
            matching += 1
        if skip:
            continue
        for d in available:
            dev = all_devices.get(d)
            if dev is not None and mask.any_set(dev.numa_ids):
                matching += 1
        if matching < request:
            continue
        hints.append(TopologyHint(mask, mask.count() == smallest))
    return hints


# Why each outcome happened, worded like the kubelet's log lines.
NOTE_NO_TOPOLOGY = "Resource does not have a topology preference"
NOTE_COUNT_MISMATCH = "Resource already allocated to pod with different number than request"
NOTE_REGENERATED = "Regenerating TopologyHints for resource already allocated to pod"
NOTE_UNAVAILABLE = "Unable to generate topology hints: requested number of devices unavailable"
NOTE_GENERATED = "TopologyHints generated from available devices"


@dataclass(frozen=True)
class ResourceHints:
    """The hints for one resource and how they came about (for `explain`)."""

    resource: str
    request: int
    #: None: no preference; []: no possible affinity.
    hints: tuple[TopologyHint, ...] | None
    note: str
    min_affinity_size: int | None = None
    available: tuple[str, ...] = ()
    reusable: tuple[str, ...] = ()
    already_allocated: tuple[str, ...] = field(default=())

    def hint_list(self) -> list[TopologyHint] | None:
        return None if self.hints is None else list(self.hints)

    def to_dict(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "request": self.request,
            "hints": None if self.hints is None else [h.to_dict() for h in self.hints],
            "note": self.note,
            "min_affinity_size": self.min_affinity_size,
            "available": list(self.available),
            "reusable": list(self.reusable),
            "already_allocated": list(self.already_allocated),
        }


def resource_hints(
    *,
    resource: str,
    request: int,
    numa_nodes: Sequence[int],
    all_devices: Mapping[str, DeviceInfo],
    healthy: Iterable[str],
    in_use: Iterable[str],
    already_allocated: Iterable[str] = (),
    reusable: Iterable[str] = (),
    order: Any = sorted,
) -> ResourceHints:
    """The per-resource body of `GetTopologyHints` (container scope) or
    `GetPodTopologyHints` (pod scope: pass no `reusable`).

    `in_use` is every device of the resource allocated to any container;
    `already_allocated` the devices this container (or pod) already holds.
    """
    if not device_has_topology_alignment(all_devices.values()):
        return ResourceHints(resource, request, None, NOTE_NO_TOPOLOGY)
    mine = set(already_allocated)
    if mine:
        if len(mine) != request:
            return ResourceHints(
                resource, request, (), NOTE_COUNT_MISMATCH, already_allocated=tuple(order(mine))
            )
        hints = generate_device_topology_hints(numa_nodes, all_devices, mine, (), request)
        return ResourceHints(
            resource,
            request,
            tuple(hints),
            NOTE_REGENERATED,
            min_affinity_size(numa_nodes, all_devices, request),
            already_allocated=tuple(order(mine)),
        )
    available = set(healthy) - set(in_use)
    reuse = set(reusable)
    if len(available | reuse) < request:
        return ResourceHints(
            resource,
            request,
            (),
            NOTE_UNAVAILABLE,
            available=tuple(order(available)),
            reusable=tuple(order(reuse)),
        )
    hints = generate_device_topology_hints(numa_nodes, all_devices, available, reuse, request)
    return ResourceHints(
        resource,
        request,
        tuple(hints),
        NOTE_GENERATED,
        min_affinity_size(numa_nodes, all_devices, request),
        available=tuple(order(available)),
        reusable=tuple(order(reuse)),
    )
