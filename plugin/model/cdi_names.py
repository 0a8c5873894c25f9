"""CDI names in an Allocate response, for the `cdi-cri` and `cdi-annotations` device list strategies.

Why one place: GPUs, time-slicing replicas, MIG devices and NICs all name
their devices the same way, from the spec we wrote for their resource
(`plugin.model.cdi.names_for`: replicas map to their GPU, each GPU once; a device
with nothing to inject has no name). `cdi-cri` puts the names in the
response's `cdi_devices` (kubelet >= 1.28 with the DevicePluginCDIDevices
feature); `cdi-annotations` in one annotation per plugin and resource, as the
CDI annotation convention asks (`cdi.k8s.io/<plugin>_<resource>`).
"""

from __future__ import annotations

from collections.abc import Sequence

from allocator.topology import Device

from .allocate_response import ContainerAllocation
from .cdi import CdiSpec, names_for

CDI_STRATEGIES = ("cdi-cri", "cdi-annotations")
PLUGIN_NAME = "topo-device-plugin"


def uses_cdi(strategies: Sequence[str]) -> bool:
    return any(s in CDI_STRATEGIES for s in strategies)


def annotation_key(prefix: str, resource_name: str) -> str:
    return f"{prefix}{PLUGIN_NAME}_{resource_name.replace('/', '_')}"


def add_names(out: ContainerAllocation, names: Sequence[str], strategies: Sequence[str], prefix: str,
              resource_name: str) -> None:
    """Put `names` where the strategies say (nothing when there is no name)."""
    if not names:
        return
    if "cdi-cri" in strategies:
        out.cdi_devices.extend(n for n in names if n not in out.cdi_devices)
    if "cdi-annotations" in strategies:
        out.annotations[annotation_key(prefix, resource_name)] = ",".join(names)


class CdiNamingBuilder:
    """Wraps a resource's Allocate builder: its answer plus the CDI names of our spec for the devices."""

    def __init__(self, inner, spec: CdiSpec, strategies: Sequence[str], prefix: str, resource_name: str,
                 pass_device_specs: bool = True, also: Sequence[str] = ()):
        self.inner = inner
        #: Qualified names every answer with devices also gets (the IMEX channels of `imex.channelIDs`).
        self.also = tuple(also)
        self.pass_device_specs = pass_device_specs
        self.spec = spec
        self.strategies = tuple(strategies)
        self.prefix = prefix
        self.resource_name = resource_name

    def build(self, ids: Sequence[str], devices: Sequence[Device]) -> ContainerAllocation:
        out = self.inner.build(ids, devices)
        names = names_for(self.spec, ids)
        if names:
            names += [n for n in self.also if n not in names]
        add_names(out, names, self.strategies, self.prefix, self.resource_name)
        if names and not self.pass_device_specs:
            # CDI alone: our spec holds every node the inner builder listed (`plugin.model.cdi` builds both from the
            # same device paths), and the runtime adds them with their cgroup rules, so nothing is lost.
            out.devices.clear()
        return out
