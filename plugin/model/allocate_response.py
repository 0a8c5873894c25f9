"""What a container gets for its devices, as plain data.

Why not protobuf here: the response builders (GPU, NIC pools) are pure and
testable without gRPC; the server converts this to
`ContainerAllocateResponse`. The kubelet checkpoints and replays the response
for the pod's whole life, so builders must only name things that stay valid
(device nodes, env, CDI names), never temporary files of this process.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class HostMount:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass
class ContainerAllocation:
    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[HostMount] = field(default_factory=list)
    devices: list[DeviceNode] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)

    def add_device(self, node: DeviceNode) -> None:
        """Add a device node once (several devices share /dev/nvidiactl, /dev/vfio/vfio...)."""
        if all(d.host_path != node.host_path for d in self.devices):
            self.devices.append(node)
