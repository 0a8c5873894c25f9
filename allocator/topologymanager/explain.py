"""A whole pod admission, run through the model, as a report.

Why: operators ask "will this pod be admitted on this node with this kubelet
policy, and which devices will it get?". The answer needs the Topology
Manager (policy, scope, options), the device manager's hints and its
devicesToAllocate logic, and the plugin's preferred allocation - all of which
this package models. `explain` wires them as the kubelet does
(`NewManager` -> device manager as hint provider -> `Admit`) and returns every
intermediate result as data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .device_hints import ResourceHints
from .device_manager import POD_LEVEL, DeviceManagerModel, ResourceSpec
from .devices_to_allocate import DevicesToAllocate
from .hint import PodAdmitResult, TopologyHint
from .options import FeatureGates
from .pod import Pod
from .scope import SCOPE_CONTAINER, providers_hints_to_dict
from .topology_manager import TopologyManager

if TYPE_CHECKING:  # pragma: no cover
    from allocator.topology import NodeTopology


@dataclass(frozen=True)
class MergeReport:
    """One merge: which containers it was for, each resource's hints, the result."""

    containers: tuple[str, ...]
    resources: tuple[ResourceHints, ...]
    providers_hints: list[dict[str, Any] | None]
    best_hint: TopologyHint
    admit: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "containers": list(self.containers),
            "resources": [r.to_dict() for r in self.resources],
            "providers_hints": self.providers_hints,
            "best_hint": self.best_hint.to_dict(),
            "admit": self.admit,
        }


@dataclass(frozen=True)
class AllocationReport:
    """What one container got of one resource, with the NUMA nodes of the devices."""

    container: str
    outcome: DevicesToAllocate
    #: device ID -> its NUMA nodes (None: no topology).
    numa: Mapping[str, tuple[int, ...] | None]

    @property
    def devices(self) -> tuple[str, ...]:
        return self.outcome.devices

    @property
    def numa_span(self) -> tuple[int, ...]:
        """The distinct NUMA nodes of the chosen devices (devices without NUMA add none)."""
        nodes: set[int] = set()
        for d in self.outcome.devices:
            nodes.update(self.numa.get(d) or ())
        return tuple(sorted(nodes))

    def to_dict(self) -> dict[str, Any]:
        data = self.outcome.to_dict()
        data["container"] = self.container
        data["numa"] = {d: (None if n is None else list(n)) for d, n in self.numa.items()}
        data["numa_span"] = list(self.numa_span)
        return data


@dataclass
class ExplainResult:
    """The full what-if report (JSON-serialisable through `to_dict`)."""

    policy: str
    scope: str
    policy_options: dict[str, str]
    numa_nodes: tuple[int, ...]
    pod: Pod
    result: PodAdmitResult
    merges: list[MergeReport] = field(default_factory=list)
    allocations: list[AllocationReport] = field(default_factory=list)
    #: Container whose merge or allocation failed.
    failed_container: str | None = None
    warnings: list[str] = field(default_factory=list)
    #: The container -> hint the kubelet stored (GetAffinity).
    affinities: dict[str, TopologyHint] = field(default_factory=dict)

    @property
    def admitted(self) -> bool:
        return self.result.admit

    def devices_for(self, container: str, resource: str) -> tuple[str, ...]:
        for a in self.allocations:
            if a.container == container and a.outcome.resource == resource:
                return a.devices
        return ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "scope": self.scope,
            "policy_options": dict(self.policy_options),
            "numa_nodes": list(self.numa_nodes),
            "pod": self.pod.to_dict(),
            "admit": self.result.admit,
            "reason": self.result.reason,
            "message": self.result.message,
            "failed_container": self.failed_container,
            "merges": [m.to_dict() for m in self.merges],
            "affinities": {c: h.to_dict() for c, h in self.affinities.items()},
            "allocations": [a.to_dict() for a in self.allocations],
            "warnings": list(self.warnings),
        }


def explain(
    *,
    numa_nodes: Iterable[int],
    resources: Sequence[ResourceSpec],
    pod: Pod,
    policy: str,
    scope: str = SCOPE_CONTAINER,
    policy_options: Mapping[str, str] | None = None,
    distances: Mapping[int, Sequence[int] | None] | None = None,
    in_use: Mapping[str, Iterable[str]] | None = None,
    gates: FeatureGates = FeatureGates(),
) -> ExplainResult:
    """Admit `pod` on a node with these NUMA nodes and device-plugin resources.

    `in_use` maps a resource to device IDs already held by other pods.
    Raises TopologyManagerError where the kubelet would refuse to start with
    this policy, scope or options; raises KeyError for an unknown in-use ID.
    """
    nodes = tuple(numa_nodes)
    manager = TopologyManager.new(nodes, policy, scope, policy_options, distances, gates)
    dm = DeviceManagerModel(nodes, resources, store=manager)
    for resource, ids in (in_use or {}).items():
        dm.mark_in_use(resource, ids)
    manager.add_hint_provider(dm)

    admission = manager.admit(pod)

    merges: list[MergeReport] = []
    for step in admission.steps:
        key = step.containers[0] if manager.scope.name == SCOPE_CONTAINER else POD_LEVEL
        records = tuple(dm.hint_log.get((pod.uid, key), ()))
        merges.append(
            MergeReport(
                step.containers,
                records,
                providers_hints_to_dict(step.providers_hints),
                step.best_hint,
                step.admit,
            )
        )
    numa_of = {r.name: {d.id: d.numa_nodes for d in r.devices} for r in resources}
    allocations = [
        AllocationReport(
            rec.container,
            rec.outcome,
            {d: numa_of.get(rec.outcome.resource, {}).get(d) for d in rec.outcome.devices},
        )
        for rec in dm.allocation_log
        if rec.pod_uid == pod.uid
    ]
    # What GetAffinity answers afterwards: every hint the scope stored, including those of
    # containers that a later failure kept from being allocated (pod scope stores the
    # pod's hint for all containers before allocating any).
    no_hint = TopologyHint(None, False)
    affinities = {
        c.name: hint
        for c in pod.all_containers()
        if (hint := manager.get_affinity(pod.uid, c.name)) != no_hint or c.name in admission.allocated_containers
    }
    return ExplainResult(
        policy=policy,
        scope=scope if policy != "none" else "none",
        policy_options=dict(policy_options or {}),
        numa_nodes=nodes,
        pod=pod,
        result=admission.result,
        merges=merges,
        allocations=allocations,
        failed_container=admission.failed_container,
        warnings=list(manager.opts.warnings),
        affinities=affinities,
    )


def machine_numa(topology: NodeTopology) -> tuple[tuple[int, ...], dict[int, list[int]]]:
    """NUMA node IDs and cadvisor-style distance rows for a node model.

    A machine always has at least NUMA node 0 (cadvisor reports one even
    without NUMA), so a topology with no NUMA information gets (0,).
    """
    nodes = tuple(topology.numa_nodes) or (0,)
    top = max(nodes)
    rows = {a: [topology.numa_distance(a, b) for b in range(top + 1)] for a in nodes}
    return nodes, rows
