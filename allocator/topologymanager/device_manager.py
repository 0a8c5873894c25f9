"""The kubelet's device manager as a Topology Manager hint provider, in memory.

Why a stateful object: within one pod admission the device manager's state
moves - each container's devices become "in use" for the next container, a
non-restartable init container's devices go to a reuse pool that the next
containers draw from first, sidecars keep theirs. The object holds exactly
that state (healthy / in-use / per-container devices / reuse pool) and nothing
global; it never does I/O. The plugin's GetPreferredAllocation is a callable
given per resource.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .device_hints import DeviceInfo, ResourceHints, resource_hints
from .devices_to_allocate import (
    DevicesToAllocate,
    PreferredFn,
    devices_to_allocate,
    natural_sorted,
)
from .hint import ProviderHints, TopologyHint
from .pod import Container, Pod, pod_effective_limits
from .scope import AffinityStore

#: The pseudo container name under which pod-scope hint outcomes are recorded.
POD_LEVEL = "<pod>"


@dataclass(frozen=True)
class ResourceSpec:
    """One device-plugin resource: its devices and the plugin's preferred-allocation callable."""

    name: str
    devices: tuple[DeviceInfo, ...]
    #: GetPreferredAllocation; None when the plugin does not offer it.
    preferred: PreferredFn | None = None
    #: The plugin's Allocate, called with the devices the kubelet chose (None: not observed). Why:
    #: a plugin that pairs GPUs with NICs learns from this call which container asks next.
    allocate: Callable[[tuple[str, ...]], None] | None = None


@dataclass(frozen=True)
class AllocationRecord:
    pod_uid: str
    container: str
    outcome: DevicesToAllocate


@dataclass
class _Resource:
    spec: ResourceSpec
    devices: dict[str, DeviceInfo]

    @property
    def healthy(self) -> set[str]:
        return {d for d, info in self.devices.items() if info.healthy}


class _NullStore:
    def get_affinity(self, pod_uid: str, container_name: str) -> TopologyHint:
        return TopologyHint(None, False)


@dataclass
class DeviceManagerModel:
    """Hint generation and Allocate for device-plugin resources, as kubelet 1.37 does them."""

    numa_nodes: tuple[int, ...]
    resources: Sequence[ResourceSpec]
    store: AffinityStore = field(default_factory=_NullStore)
    #: resource -> devices in use by any container (the kubelet's allocatedDevices).
    allocated: dict[str, set[str]] = field(default_factory=dict)
    #: pod uid -> container -> resource -> devices (the kubelet's podDevices).
    pod_devices: dict[str, dict[str, dict[str, set[str]]]] = field(default_factory=dict)
    #: pod uid -> resource -> devices of non-restartable init containers.
    devices_to_reuse: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    hint_log: dict[tuple[str, str], list[ResourceHints]] = field(default_factory=dict)
    allocation_log: list[AllocationRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.numa_nodes = tuple(self.numa_nodes)
        self._res: dict[str, _Resource] = {
            r.name: _Resource(r, {d.id: d for d in r.devices}) for r in self.resources
        }
        for name in self._res:
            self.allocated.setdefault(name, set())

    # -- state helpers ------------------------------------------------------
    def is_device_plugin_resource(self, resource: str) -> bool:
        return resource in self._res or resource in self.allocated

    def devices(self, resource: str) -> dict[str, DeviceInfo]:
        return self._res[resource].devices

    def mark_in_use(
        self, resource: str, ids: Iterable[str], pod_uid: str = "other-pod", container: str = "other"
    ) -> None:
        """Record devices held by another pod (what `--allocated` means)."""
        ids = set(ids)
        unknown = ids - set(self.devices(resource))
        if unknown:
            raise KeyError(f"{resource}: unknown device IDs {', '.join(natural_sorted(unknown))}")
        self.allocated.setdefault(resource, set()).update(ids)
        self.pod_devices.setdefault(pod_uid, {}).setdefault(container, {}).setdefault(resource, set()).update(ids)

    def container_devices(self, pod_uid: str, container: str, resource: str) -> set[str]:
        return set(self.pod_devices.get(pod_uid, {}).get(container, {}).get(resource, set()))

    def pod_resource_devices(self, pod_uid: str, resource: str) -> set[str]:
        out: set[str] = set()
        for res in self.pod_devices.get(pod_uid, {}).values():
            out |= res.get(resource, set())
        return out

    def _requests(self, limits: Mapping[str, int]) -> dict[str, int]:
        return {r: int(n) for r, n in limits.items() if self.is_device_plugin_resource(r)}

    # -- HintProvider -------------------------------------------------------
    def get_topology_hints(self, pod: Pod, container: Container) -> ProviderHints | None:
        out: dict[str, list[TopologyHint] | None] = {}
        records: list[ResourceHints] = []
        for resource, requested in self._requests(container.limits).items():
            res = self._res.get(resource)
            if res is None:
                continue
            rh = resource_hints(
                resource=resource,
                request=requested,
                numa_nodes=self.numa_nodes,
                all_devices=res.devices,
                healthy=res.healthy,
                in_use=self.allocated.get(resource, set()),
                already_allocated=self.container_devices(pod.uid, container.name, resource),
                reusable=self.devices_to_reuse.get(pod.uid, {}).get(resource, set()),
                order=natural_sorted,
            )
            records.append(rh)
            out[resource] = rh.hint_list()
        self.hint_log[(pod.uid, container.name)] = records
        return out

    def get_pod_topology_hints(self, pod: Pod) -> ProviderHints | None:
        out: dict[str, list[TopologyHint] | None] = {}
        records: list[ResourceHints] = []
        limits = pod_effective_limits(pod, [r for r in self._res])
        for resource, requested in limits.items():
            res = self._res[resource]
            rh = resource_hints(
                resource=resource,
                request=requested,
                numa_nodes=self.numa_nodes,
                all_devices=res.devices,
                healthy=res.healthy,
                in_use=self.allocated.get(resource, set()),
                already_allocated=self.pod_resource_devices(pod.uid, resource),
                order=natural_sorted,
            )
            records.append(rh)
            out[resource] = rh.hint_list()
        self.hint_log[(pod.uid, POD_LEVEL)] = records
        return out

    def allocate(self, pod: Pod, container: Container) -> None:
        """The kubelet's `Allocate`: reuse pool bookkeeping around the container's allocation."""
        self.devices_to_reuse.setdefault(pod.uid, {})
        for uid in list(self.devices_to_reuse):
            if uid != pod.uid:
                del self.devices_to_reuse[uid]
        reuse = self.devices_to_reuse[pod.uid]
        self._allocate_container_resources(pod, container, reuse)
        mine = self.pod_devices.get(pod.uid, {}).get(container.name, {})
        keep_for_reuse = pod.is_init(container) and not container.restartable
        for resource, devs in mine.items():
            if keep_for_reuse:
                reuse[resource] = reuse.get(resource, set()) | devs
            else:
                reuse[resource] = reuse.get(resource, set()) - devs

    def _allocate_container_resources(self, pod: Pod, container: Container, reuse: dict[str, set[str]]) -> None:
        for resource, needed in self._requests(container.limits).items():
            res = self._res.get(resource)
            hint = self.store.get_affinity(pod.uid, container.name)
            outcome = devices_to_allocate(
                resource=resource,
                required=needed,
                all_devices=res.devices if res else {},
                healthy=res.healthy if res else set(),
                in_use=self.allocated.get(resource, set()),
                hint=hint,
                already_allocated=self.container_devices(pod.uid, container.name, resource) or None,
                reusable=reuse.get(resource, set()),
                preferred=res.spec.preferred if res else None,
                registered=res is not None,
                pod_uid=pod.uid,
                container_name=container.name,
            )
            self.allocation_log.append(AllocationRecord(pod.uid, container.name, outcome))
            if not outcome.devices:
                continue
            if res is not None and res.spec.allocate is not None:
                res.spec.allocate(outcome.devices)
            self.allocated.setdefault(resource, set()).update(outcome.devices)
            self.pod_devices.setdefault(pod.uid, {}).setdefault(container.name, {}).setdefault(
                resource, set()
            ).update(outcome.devices)
