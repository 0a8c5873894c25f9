"""What a container gets for GPUs: `NVIDIA_VISIBLE_DEVICES`, device nodes, CDI names.

Why these pieces: the NVIDIA container runtime hook reads the env var (the
`envvar` strategy); a CDI-capable runtime reads `cdi_devices` (`cdi-cri`) or
annotations (`cdi-annotations`); device specs keep GPU access working when
the static CPU manager rewrites cgroups. Device nodes are only listed where
they exist under `dev_root`, so a simulated node never hands the runtime a
path that would make container creation fail.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from allocator.topology import Device

from .allocate_response import ContainerAllocation, DeviceNode
from .errors import OptionError

DEVICE_LIST_STRATEGIES = ("envvar", "cdi-cri", "cdi-annotations")
_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


@dataclass(frozen=True)
class GpuAllocateOptions:
    device_list_strategy: tuple[str, ...] = ("envvar",)
    dev_root: str = "/dev"
    cdi_vendor: str = "nvidia.com"
    cdi_class: str = "gpu"
    cdi_annotation_prefix: str = "cdi.k8s.io/"

    def __post_init__(self) -> None:
        bad = [s for s in self.device_list_strategy if s not in DEVICE_LIST_STRATEGIES]
        if bad or not self.device_list_strategy:
            raise OptionError(
                f"device list strategy {', '.join(bad) or '(empty)'} is not one of {', '.join(DEVICE_LIST_STRATEGIES)}"
            )


class GpuAllocateBuilder:
    """Builds the response for one container's GPUs."""

    def __init__(self, options: GpuAllocateOptions, resource_name: str):
        self.options = options
        self.resource_name = resource_name

    def _node(self, name: str) -> DeviceNode | None:
        host = os.path.join(self.options.dev_root, name)
        if not os.path.exists(host):
            return None
        return DeviceNode(container_path=f"/dev/{name}", host_path=host, permissions="rw")

    def build(self, ids: Sequence[str], devices: Sequence[Device]) -> ContainerAllocation:
        out = ContainerAllocation()
        strategies = self.options.device_list_strategy
        if "envvar" in strategies:
            out.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
        cdi_names = [
            f"{self.options.cdi_vendor}/{self.options.cdi_class}={d.uuid or i}" for i, d in zip(ids, devices)
        ]
        if "cdi-cri" in strategies:
            out.cdi_devices.extend(cdi_names)
        if "cdi-annotations" in strategies:
            # One key per plugin and resource, as the CDI annotation convention asks.
            key = f"{self.options.cdi_annotation_prefix}topo-device-plugin_{self.resource_name.replace('/', '_')}"
            out.annotations[key] = ",".join(cdi_names)
        for d in devices:
            if d.minor is not None:
                node = self._node(f"nvidia{d.minor}")
                if node:
                    out.add_device(node)
        if out.devices:
            for name in _CONTROL_NODES:
                node = self._node(name)
                if node:
                    out.add_device(node)
        return out
