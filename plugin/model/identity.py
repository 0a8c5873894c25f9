"""The UUID a GPU or MIG device is known by, in one place.

Why one place: the device-plugin IDs (`--device-id-strategy uuid`), the DRA
slices' `uuid` attribute and the `TOPO_DEV_<device>` variable of a DRA
container must name a device the same way: a claim that selects a GPU by the
UUID its slice publishes must find that UUID in the container. Real devices
carry NVML's UUID; a simulated one without a `uuid:` (every `nvidia-smi topo
-m` node, most built-ins) gets a stable made-up one from the node source and
the device name, so restarts keep it (`shared/spec/topology-input.md`).
"""

from __future__ import annotations

import uuid

from allocator.topology import Device, DeviceKind

__all__ = ["device_uuid", "simulated_uuid"]

_UUID_NS = uuid.UUID("6f1c3b9e-2a41-4d3f-9b7e-0c5d8e4f1a22")


def simulated_uuid(source: str, name: str) -> str:
    """A stable made-up GPU UUID: the same node source and device always give the same ID."""
    return "GPU-" + str(uuid.uuid5(_UUID_NS, f"{source}/{name}"))


def device_uuid(source: str, device: Device) -> str:
    """The device's UUID (`GPU-…`, `MIG-…`): its own, else the made-up one of topology `source`."""
    if device.uuid:
        return device.uuid
    made_up = simulated_uuid(source, device.name)
    return "MIG-" + made_up[len("GPU-"):] if device.kind is DeviceKind.MIG else made_up
