"""Which resources the device-plugin API serves and which Dynamic Resource Allocation serves.

Why one decision, made per resource and checked before anything starts: a
device served both ways could be handed to two pods, one by the kubelet's
device manager, one by the scheduler's DRA allocator, and neither would know.
So the option `--dra-resources` (`flags.draResources`) names whole resources
(the GPU resource, NIC pools); every resource is served exactly one way, and
the devices of a DRA resource are what the DRA driver publishes and prepares,
and nothing else.

Combinations refused, with the file/field and the fix:
- a name that is not a resource of this configuration (a typo would silently
  leave the devices with the device plugin);
- the GPU resource with a MIG strategy other than `none` (through DRA, MIG is
  `--dra-mig`'s business: static MIG devices or partitionable GPUs, docs/dra.md);
- the GPU resource with time-slicing (DRA devices are never shared between
  claims here).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from allocator.topology import Device

from ..errors import OptionError
from .resources import Resource, ResourceOptions


def configured_names(options: ResourceOptions) -> list[str]:
    """The resource names this configuration can serve (before the node is known)."""
    nics = [p.resource_name for p in options.nic_pools] or [options.nic_resource_name]
    return [options.gpu_resource_name, *nics]


def check_modes(options: ResourceOptions, dra: Sequence[str], where: str) -> frozenset[str]:
    """The checked set of resources served through DRA; `where` names the option's source for messages."""
    names = configured_names(options)
    for name in dra:
        if name not in names:
            raise OptionError(f"{where}: {name!r} is not a resource of this configuration; it serves "
                              f"{', '.join(names)} (fix: name one of these, or add a NIC pool called so "
                              "under nics.resourceList)")
    gpu = options.gpu_resource_name
    if gpu in dra and options.mig_strategy != "none":
        raise OptionError(f"{where}: {gpu} through DRA needs MIG strategy none, not {options.mig_strategy!r}: "
                          "migStrategy is the device-plugin side's; through DRA, MIG devices are chosen by draMig "
                          "(fix: set flags.migStrategy none and flags.draMig static or dynamic, or remove "
                          f"{gpu} from draResources to keep MIG on the device-plugin side)")
    if gpu in dra and options.time_slicing is not None and options.time_slicing.resources:
        raise OptionError(f"{where}: {gpu} through DRA cannot be time-sliced: a DRA device belongs to one claim "
                          f"at a time (fix: remove sharing.timeSlicing, or remove {gpu} from draResources)")
    return frozenset(dra)


def split(resources: Iterable[Resource], dra: frozenset[str]) -> tuple[list[Resource], list[Resource]]:
    """(served through the device-plugin API, served through DRA): every resource in exactly one."""
    plugin_side: list[Resource] = []
    dra_side: list[Resource] = []
    for r in resources:
        (dra_side if r.name in dra else plugin_side).append(r)
    return plugin_side, dra_side


@dataclass
class DraDevices:
    """The devices the DRA driver may publish and prepare: those of the DRA resources of the current topology.

    The driver asks `include(device)` for every device; the daemon calls `set` before every
    topology it hands to the driver, so hot-plugged devices follow their resource's mode.
    """

    names: frozenset[str] = field(default_factory=frozenset)

    def set(self, resources: Iterable[Resource]) -> None:
        self.names = frozenset(d.device.name for r in resources for d in r.devices)

    def include(self, device: Device) -> bool:
        return device.name in self.names
