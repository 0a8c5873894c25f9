"""The demo's admission walk with what tests and benchmarks read on top: the call log, pod release, free counts.

Why a subclass here: the walk itself (plugin/demo/device_manager.py) is what
`demo` runs; a log of every RPC with its timing, the kubelet's release of a
finished pod and the admitted pods' specs (for the pod-resources stand-in)
are for the daemon tests, the pairing benchmarks and their oracles only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from allocator.topologymanager.pod import Pod
from plugin.demo import device_manager as demo
from plugin.demo.device_manager import pod

__all__ = ["Call", "StandinDeviceManager", "pod"]


@dataclass(frozen=True)
class Call:
    """One RPC the walk made: GetPreferredAllocation (available, must_include, size -> answer) or Allocate."""

    method: str
    resource: str
    pod: str
    container: str
    available: tuple[str, ...] = ()
    must_include: tuple[str, ...] = ()
    size: int = 0
    #: The preferred answer, or the IDs of the Allocate.
    ids: tuple[str, ...] = ()
    #: Wall time of the RPC as the client saw it.
    seconds: float = 0.0
    #: When it was sent (time.monotonic).
    t: float = 0.0


@dataclass
class StandinDeviceManager(demo.StandinDeviceManager):
    calls: list[Call] = field(default_factory=list)
    #: The admitted pods by UID, the one being admitted included (for the pod-resources view).
    specs: dict[str, Pod] = field(default_factory=dict)

    def free(self, resource: str) -> int:
        healthy = [d for d in self.kubelet.devices(resource).values() if d.health == "Healthy"]
        return len(healthy) - len(self.in_use.get(resource, ()))

    async def admit(self, spec: Pod) -> dict[str, dict[str, tuple[str, ...]]]:
        self.specs[spec.uid] = spec
        return await super().admit(spec)

    def release(self, pod: str) -> None:
        """The pod is gone: its devices are free again (the kubelet's GC of inactive pods)."""
        for got in self.pods.pop(pod, {}).values():
            for res, ids in got.items():
                self.in_use.get(res, set()).difference_update(ids)
        self.specs.pop(pod, None)

    async def _preferred(self, res: str, pod: str, container: str, available: list[str], must: list[str],
                         size: int) -> list[str]:
        t, started = time.monotonic(), time.perf_counter()
        ids = await super()._preferred(res, pod, container, available, must, size)
        self.calls.append(Call("GetPreferredAllocation", res, pod, container, tuple(available), tuple(must), size,
                               tuple(ids), time.perf_counter() - started, t))
        return ids

    async def _allocate(self, res: str, pod: str, container: str, ids: list[str]) -> None:
        t, started = time.monotonic(), time.perf_counter()
        await super()._allocate(res, pod, container, ids)
        self.calls.append(Call("Allocate", res, pod, container, ids=tuple(ids),
                               seconds=time.perf_counter() - started, t=t))
