"""The kubelet device manager's admission walk, over the stand-in's gRPC connections to the plugin.

Why: GPU–NIC pairing learns which container a call is for from the order of
the kubelet's calls, so the demo, the daemon tests and the benchmarks must
make exactly the kubelet's calls, over real gRPC. Read in `manager.go`
(`Allocate`, `allocateContainerResources`, `devicesToAllocate`; 1.34, 1.37):
- pods one at a time; per pod the init containers, then the app containers;
- per container its extended resources one after another in Go map order
  (random: `rng` shuffles them);
- per resource `devicesToAllocate` (the project's model in
  `allocator.topologymanager.devices_to_allocate`): an init container's
  devices first (then no GetPreferredAllocation if they cover the request),
  GetPreferredAllocation only where the kubelet has a choice, random fill;
  then one `Allocate` with the chosen devices, before the next resource;
- a non-restartable init container's devices go to the pod's reuse pool (so
  the next container's `Allocate` repeats them); other containers take theirs
  out of it.
The model is synchronous, so each resource's step runs in a worker thread
and its GetPreferredAllocation is sent from there on the event loop; the
loop itself is never blocked. The demo walks one pod; the test kit's subclass
(tests/support/topo_testkit/device_manager.py) adds the call log, pod
release and the pod-resources view that tests and benchmarks need.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from allocator.topologymanager.device_hints import DeviceInfo
from allocator.topologymanager.devices_to_allocate import devices_to_allocate
from allocator.topologymanager.hint import TopologyHint
from allocator.topologymanager.pod import Container, Pod

from .kubelet_standin import KubeletStandin

#: What the Topology Manager stores with policy `none`: no NUMA affinity.
NO_AFFINITY = TopologyHint(None, True)


def pod(uid: str, *containers: Mapping[str, int], init: Mapping[str, int] | None = None,
        names: tuple[str, ...] = ()) -> Pod:
    """A pod of app containers with these limits (named `names`, else `main`, `c1`, ...), and one
    non-restartable init container `init` with `init` limits when given."""
    apps = tuple(Container(names[i] if i < len(names) else ("main" if i == 0 else f"c{i}"), dict(lim))
                 for i, lim in enumerate(containers))
    return Pod(uid, apps, (Container("init", dict(init)),) if init else (), name=uid)


@dataclass
class StandinDeviceManager:
    """Admits pods on one node through `kubelet`'s plugin clients; keeps which devices are in use."""

    kubelet: KubeletStandin
    rng: random.Random = field(default_factory=random.Random)
    #: The NUMA affinity the Topology Manager stored for (pod, container); policy none by default.
    hint: Callable[[str, str], TopologyHint] = lambda pod, container: NO_AFFINITY
    #: Walk a container's resources in random order (the kubelet's); False: in the order of its limits.
    shuffle_resources: bool = True
    #: resource -> the devices admitted containers hold.
    in_use: dict[str, set[str]] = field(default_factory=dict)
    #: pod UID -> container -> resource -> devices.
    pods: dict[str, dict[str, dict[str, tuple[str, ...]]]] = field(default_factory=dict)

    async def admit(self, spec: Pod) -> dict[str, dict[str, tuple[str, ...]]]:
        """Admit one pod (init containers first); returns container -> resource -> devices.

        Raises `DeviceAllocationError` (the kubelet's message) or the plugin's gRPC error, as the
        kubelet fails the pod's admission; what was allocated before stays recorded until `release`.
        """
        loop = asyncio.get_running_loop()
        reuse: dict[str, set[str]] = {}
        pod = spec.uid
        got_pod = self.pods.setdefault(pod, {})
        for c in spec.all_containers():
            got: dict[str, tuple[str, ...]] = {}
            got_pod[c.name] = got
            order = list(c.limits)
            if self.shuffle_resources:
                self.rng.shuffle(order)
            for res in order:
                devices = {d.id: DeviceInfo(d.id, d.numa or None, d.health == "Healthy")
                           for d in self.kubelet.devices(res).values()}

                def ask(available: list[str], must: list[str], size: int, res: str = res,
                        who: str = c.name) -> list[str]:
                    fut = asyncio.run_coroutine_threadsafe(
                        self._preferred(res, pod, who, available, must, size), loop)
                    return fut.result()

                outcome = await asyncio.to_thread(
                    devices_to_allocate, resource=res, required=c.limits[res], all_devices=devices,
                    healthy=[i for i, d in devices.items() if d.healthy], in_use=self.in_use.get(res, set()),
                    hint=self.hint(pod, c.name), reusable=reuse.get(res, set()), preferred=ask,
                    order=self._order, pod_uid=pod, container_name=c.name)
                if not outcome.devices:
                    continue
                await self._allocate(res, pod, c.name, list(outcome.devices))
                self.in_use.setdefault(res, set()).update(outcome.devices)
                got[res] = outcome.devices
            for res, ids in got.items():
                if spec.is_init(c) and not c.restartable:
                    reuse.setdefault(res, set()).update(ids)
                else:
                    reuse.setdefault(res, set()).difference_update(ids)
        return got_pod

    def _order(self, ids) -> list[str]:
        """Go map order: random."""
        out = list(ids)
        self.rng.shuffle(out)
        return out

    async def _preferred(self, res: str, pod: str, container: str, available: list[str], must: list[str],
                         size: int) -> list[str]:
        """GetPreferredAllocation for (pod, container); the test kit logs it."""
        return await self.kubelet.preferred(res, available, must, size)

    async def _allocate(self, res: str, pod: str, container: str, ids: list[str]) -> None:
        """Allocate for (pod, container); the test kit logs it."""
        await self.kubelet.allocate(res, ids)
