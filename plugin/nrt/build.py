"""The NodeResourceTopology object of one node, from what the daemon knows (pure).

Why pure: the object is a function of the topology (NUMA nodes, distances,
links), the served resources (IDs, NUMA, health), the devices pods hold (from
the kubelet's pod-resources `List`) and the kubelet's Topology Manager
settings; a table-driven test checks it on every built-in simulated node, and
the writer only compares and sends.

Shape (`topology.node.k8s.io/v1alpha2`, k8stopologyawareschedwg/noderesourcetopology-api):
- one zone per NUMA node, `name: node-<N>`, `type: Node`;
- per zone, each device-plugin resource with a device on that NUMA node:
  `capacity` (all its devices there), `allocatable` (the healthy ones),
  `available` (healthy and not held by a pod); quantities as decimal strings;
- zone `costs`: the NUMA distance to every zone (the machine's distance table;
  simulated nodes state it or get Linux's 10/20);
- top-level `attributes`: `topologyManagerPolicy` and `topologyManagerScope`
  as the kubelet's config says (left out when it cannot be read: see
  `plugin.nrt.kubelet_config`), and `topo.dev/source` (who wrote it);
- zone `attributes` of our own, below NUMA: `topo.dev/free-gpu-nic-pairs-<LINK>`,
  the most disjoint free GPU–NIC pairs in the zone joined at least as well as
  `<LINK>` (`PIX`, `PXB`, `PHB`, `NODE`), so a scheduler can tell a zone with
  two GPUs and two NICs on one switch from one whose NICs hang off the CPU.
Devices without a NUMA node belong to no zone and are not published (the
kubelet gives them no NUMA affinity either).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from allocator.topology import Device, DeviceKind, LinkLevel, NodeTopology

API_VERSION = "topology.node.k8s.io/v1alpha2"
KIND = "NodeResourceTopology"
#: Our domain (the DRA driver's name) for labels, annotations and attributes.
DOMAIN = "topo.dev"
#: The label that says we wrote the object (the coexistence check reads it back).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "topo-device-plugin"
#: The pair classes published per zone, closest first.
PAIR_LEVELS: tuple[LinkLevel, ...] = (LinkLevel.PIX, LinkLevel.PXB, LinkLevel.PHB, LinkLevel.NODE)


@dataclass(frozen=True)
class TopologyManagerSettings:
    """The kubelet's Topology Manager policy and scope; None each: not known (not published)."""

    policy: str | None = None
    scope: str | None = None
    #: Where they came from, for the log and docs (`/var/lib/kubelet/config.yaml`, `unreadable: ...`).
    origin: str = ""


@dataclass(frozen=True)
class PublishedDevice:
    """One advertised device as the publisher needs it (a `ResourceDevice`'s ID, NUMA, health, device)."""

    id: str
    numa: int | None
    healthy: bool
    device: Device


@dataclass(frozen=True)
class PublishedResource:
    """One device-plugin resource: its name and devices (the daemon's `Resource`, reduced)."""

    name: str
    kind: DeviceKind
    devices: tuple[PublishedDevice, ...]


def zone_name(numa: int) -> str:
    return f"node-{numa}"


def build_nrt(node_name: str, topology: NodeTopology, resources: Sequence[PublishedResource],
              held: Collection[tuple[str, str]], settings: TopologyManagerSettings,
              node_uid: str | None = None) -> dict[str, Any]:
    """The whole object for `node_name`; `held` is (resource, device ID) of every device a pod holds."""
    numa_nodes = sorted(set(topology.numa_nodes) | {d.numa for r in resources for d in r.devices
                                                     if d.numa is not None})
    zones = [_zone(n, numa_nodes, topology, resources, held) for n in numa_nodes]
    attributes = []
    if settings.policy is not None:
        attributes.append({"name": "topologyManagerPolicy", "value": settings.policy})
    if settings.scope is not None:
        attributes.append({"name": "topologyManagerScope", "value": settings.scope})
    attributes.append({"name": f"{DOMAIN}/source", "value": MANAGED_BY})
    metadata: dict[str, Any] = {"name": node_name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}}
    if node_uid:
        # Owned by the Node: the garbage collector deletes the object with it.
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}]
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata,
            "attributes": attributes, "zones": zones}


def _zone(numa: int, numa_nodes: Sequence[int], topology: NodeTopology, resources: Sequence[PublishedResource],
          held: Collection[tuple[str, str]]) -> dict[str, Any]:
    entries = []
    free: dict[DeviceKind, list[Device]] = {DeviceKind.GPU: [], DeviceKind.NIC: []}
    for r in resources:
        here = [d for d in r.devices if d.numa == numa]
        if not here:
            continue
        healthy = [d for d in here if d.healthy]
        available = [d for d in healthy if (r.name, d.id) not in held]
        entries.append({"name": r.name, "capacity": str(len(here)), "allocatable": str(len(healthy)),
                        "available": str(len(available))})
        if r.kind in free:
            free[r.kind].extend(d.device for d in available)
    costs = [{"name": zone_name(other), "value": topology.numa_distance(numa, other)} for other in numa_nodes]
    attributes = [{"name": f"{DOMAIN}/free-gpu-nic-pairs-{level.name}",
                   "value": str(free_pairs(topology, _unique(free[DeviceKind.GPU]), _unique(free[DeviceKind.NIC]),
                                           level))}
                  for level in PAIR_LEVELS] if free[DeviceKind.GPU] and free[DeviceKind.NIC] else []
    zone: dict[str, Any] = {"name": zone_name(numa), "type": "Node", "costs": costs, "resources": entries}
    if attributes:
        zone["attributes"] = attributes
    return zone


def _unique(devices: Iterable[Device]) -> list[Device]:
    """One entry per physical device (two NIC pools may list one NIC; pairs count it once)."""
    seen: dict[str, Device] = {}
    for d in devices:
        seen.setdefault(d.name, d)
    return list(seen.values())


def free_pairs(topology: NodeTopology, gpus: Sequence[Device], nics: Sequence[Device], level: LinkLevel) -> int:
    """The most disjoint (GPU, NIC) pairs joined at `level` or closer (a maximum bipartite matching).

    Why a matching and not a count: two GPUs below one switch with one NIC make one pair, not two.
    Small inputs (a zone's free devices), so the simple augmenting-path search is enough.
    """
    good = [[j for j, n in enumerate(nics) if topology.link(g.name, n.name).nvlinks == 0
             and topology.link(g.name, n.name).level >= level] for g in gpus]
    match_of_nic: dict[int, int] = {}

    def augment(i: int, seen: set[int]) -> bool:
        for j in good[i]:
            if j in seen:
                continue
            seen.add(j)
            if j not in match_of_nic or augment(match_of_nic[j], seen):
                match_of_nic[j] = i
                return True
        return False

    return sum(1 for i in range(len(gpus)) if augment(i, set()))


def published_resources(resources: Iterable[Any]) -> tuple[PublishedResource, ...]:
    """The daemon's `Resource`s (anything with name, kind and devices of id/numa/health/device), reduced."""
    return tuple(PublishedResource(r.name, r.kind, tuple(
        PublishedDevice(d.id, d.numa, d.health == "Healthy", d.device) for d in r.devices)) for r in resources)


def available_by_zone(obj: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """zone -> resource -> available, read back from an object (tests, `explain --cluster`)."""
    out: dict[str, dict[str, int]] = {}
    for z in obj.get("zones") or ():
        out[z.get("name", "")] = {r["name"]: int(r.get("available", 0)) for r in z.get("resources") or ()}
    return out
