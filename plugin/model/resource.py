"""One served resource: the data a device-plugin server or the DRA driver needs of it.

Why a module of its own: the steps that build resources (`plugin.model.resources`)
import time-slicing, MIG and CDI, and time-slicing makes resources too; with the
data here, below all of them, every step imports it downward and none imports
the builder back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from allocator.topology import Device, DeviceGraph, DeviceKind

from .allocate_response import ContainerAllocation
from .cdi.spec import CdiSpec


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
    #: The CDI spec we write for this resource (None: no CDI strategy, `--cdi-specs external`, or
    #: nothing to inject); Allocate names its devices from it.
    cdi_spec: CdiSpec | None = field(default=None, compare=False)

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
