"""Which control daemons the device-plugin side needs (one per `sharing.mps` resource), and replicas gated on them.

Why one daemon per resource: that is NVIDIA's layout (one pipe directory per
resource under the MPS root), and the replicas of one resource are what a
daemon's health decides for. The daemon is told the resource's GPUs
(`CUDA_VISIBLE_DEVICES`, by UUID) and, per GPU, the same limits the Allocate
answers carry (`plugin.model.mps_allocate`): memory / replicas pinned, 100 /
replicas of the threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from allocator.subdevices import physical_id
from allocator.topology import UNHEALTHY, Device

from ..model.mps_allocate import MpsAllocateBuilder, MpsShare
from ..model.resource import Resource
from .control import DaemonSpec, default_commands


def mps_builder(resource: Resource) -> MpsAllocateBuilder | None:
    b = resource.builder
    return b if isinstance(b, MpsAllocateBuilder) else None


def device_plugin_specs(resources: Sequence[Resource]) -> list[DaemonSpec]:
    """A `DaemonSpec` per MPS resource among `resources`, its GPUs in the resource's order."""
    out = []
    for r in resources:
        b = mps_builder(r)
        if b is None:
            continue
        gpus: dict[str, Device] = {}
        for d in r.devices:
            gpus.setdefault(physical_id(d.id), d.device)
        shares = [MpsShare(b.replicas.get(p, 1), d.memory_mib) for p, d in gpus.items()]
        limits = [(n, s.pinned_mib) for n, s in enumerate(shares)]
        thread = min((s.active_thread_percentage for s in shares), default=None)
        out.append(DaemonSpec(name=r.name, pipe_dir=b.paths.host_pipe_dir, log_dir=b.paths.host_log_dir,
                              gpus=tuple(d.uuid or p for p, d in gpus.items()),
                              defaults=default_commands(limits, thread)))
    return out


def gated(resource: Resource, daemon_ready: bool) -> Resource:
    """`resource` as advertised: every replica Unhealthy while its control daemon is not ready."""
    if daemon_ready or mps_builder(resource) is None:
        return resource
    devices = tuple(replace(d, device=replace(d.device, health=UNHEALTHY)) for d in resource.devices)
    return replace(resource, devices=devices)
