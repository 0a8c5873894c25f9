"""Time-slicing: NVIDIA's `sharing.timeSlicing` turned into replica resources.

Why here and not in the allocator: which devices are shared, under which
name and how Allocate answers are serving decisions; the allocator only
scores (`allocator.subdevices.replica_graph` and the `replicas` policy, the
spec's "Shared GPUs: time-slicing replicas").

What an operator gets, as with NVIDIA's plugin (k8s-device-plugin
`internal/rm/device_map.go`, README "With CUDA Time-Slicing"):

- an entry names a GPU-family resource: the GPU resource or a `mixed` MIG
  resource (`<domain>/mig-<profile>`); a name without a domain gets
  NVIDIA's (`gpu` -> `nvidia.com/gpu`, or the domain of --gpu-resource-name);
  an entry for a resource this node does not have changes nothing (one
  ConfigMap serves many nodes);
- each selected device `g` is advertised as `replicas` devices `<g's ID>::<r>`
  with g's NUMA node, under `rename`, `<name>.shared` (`renameByDefault`) or
  the name itself; devices an entry does not select stay in the original
  resource (NVIDIA ignores `rename`/`devices` with a warning; we honour them);
- `Allocate` hands each physical device out once (`NVIDIA_VISIBLE_DEVICES`
  lists distinct GPUs, device nodes and CDI names once); with
  `failRequestsGreaterThanOne` a request for more than one replica is
  refused with INVALID_ARGUMENT naming the rule (NVIDIA: "maximum request
  size for shared resources is 1");
- health needs nothing extra: every replica is its GPU's `Device`, so a GPU
  that turns Unhealthy turns all its replicas Unhealthy in the same list;
- unlike NVIDIA, a resource and the node advertise at most `MAX_REPLICAS`
  replicas (the kubelet's messages carry a whole resource at once); a config
  past it is refused naming the entry's `replicas` and the count that fits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from allocator import AllocationError
from allocator.subdevices import physical_id, replica_graph, replica_id
from allocator.topology import Device, DeviceGraph, DeviceKind

from .allocate_response import ContainerAllocation
from .mps_allocate import DEFAULT_HOST_ROOT, MpsAllocateBuilder, MpsPaths
from ..config.sharing import MAX_REPLICAS, SharedResource, SharingError, TimeSlicing, \
    device_limit_reason, qualify
from ..errors import OptionError
from .resource import AllocateBuilder, Resource, ResourceDevice
from .resource_names import check_resource_name

#: The policy of every replica resource (`allocator.policies.get_policy`).
REPLICA_POLICY = "replicas"


class ReplicaAllocateBuilder:
    """Allocate for replicas: the rule of `failRequestsGreaterThanOne`, then each physical device once."""

    def __init__(self, inner, resource_name: str, fail_requests_greater_than_one: bool,
                 rule: str = "sharing.timeSlicing.failRequestsGreaterThanOne is set",
                 fix: str = "request 1, or turn the rule off"):
        self.inner = inner
        self.resource_name = resource_name
        self.fail_greater_than_one = fail_requests_greater_than_one
        #: The rule, as the operator set it (MPS implies it, as in NVIDIA's plugin).
        self.rule = rule
        self.fix = fix

    def build(self, ids: Sequence[str], devices: Sequence[Device]) -> ContainerAllocation:
        if self.fail_greater_than_one and len(ids) > 1:
            raise AllocationError(
                f"{self.rule}: maximum request size for shared "
                f"resources is 1; a container asked for {len(ids)} {self.resource_name} replicas "
                f"({self.fix})")
        seen: dict[str, Device] = {}
        for i, d in zip(ids, devices):
            seen.setdefault(physical_id(i), d)
        return self.inner.build(list(seen), list(seen.values()))


@dataclass(frozen=True)
class _Plan:
    """Replica counts per device ID for one target resource, from one base resource."""

    target: str
    counts: dict[str, int]


def _family(name: str, gpu_resource_name: str) -> bool:
    domain = gpu_resource_name.partition("/")[0]
    return name == gpu_resource_name or name.startswith(f"{domain}/mig-")


def _matches(ref: str, device_id: str, d: Device) -> bool:
    if ref in (device_id, d.uuid):
        return True
    index = d.attributes.get("index") if d.kind is DeviceKind.MIG else str(d.index)
    return ref == index


def _select(entry: SharedResource, members: Sequence[tuple[str, Device]]) -> list[str]:
    """The IDs of the devices an entry shares (NVIDIA's `getIDsOfDevicesToReplicate`)."""
    sel = entry.devices
    if sel.all:
        return [i for i, _ in members]
    if sel.count is not None:
        if sel.count > len(members):
            raise SharingError(f"{entry.where}.devices: {sel.count} devices requested but {entry.name} has only "
                               f"{len(members)} on this node (fix: lower the count, or use devices: all)")
        return [i for i, _ in members[: sel.count]]
    out: list[str] = []
    for ref in sel.refs:
        found = [i for i, d in members if _matches(ref, i, d)]
        if not found:
            raise SharingError(f"{entry.where}.devices: no {entry.name} device on this node is {ref!r} "
                               "(fix: list GPU indexes, MIG indexes <gpu>:<mig> or UUIDs this node has)")
        out += [i for i in found if i not in out]
    return out


def plan_time_slicing(ts: TimeSlicing, gpu_resource_name: str,
                      bases: Mapping[str, Sequence[tuple[str, Device]]]) -> dict[str, list[_Plan]]:
    """{base resource: its replica plans}; raises `SharingError` naming the entry for what cannot be served."""
    domain = gpu_resource_name.partition("/")[0]
    plans: dict[str, dict[str, _Plan]] = {}
    owner: dict[tuple[str, str], str] = {}
    targets: dict[str, str] = {}
    node_total = 0  # replicas of all entries so far
    for entry in ts.resources:
        name = qualify(entry.name, domain)
        if ts.mps and name != gpu_resource_name:
            raise SharingError(f"{entry.where}.name: {name!r} cannot be shared with MPS: only whole GPUs "
                               f"({gpu_resource_name}) can, as in NVIDIA's plugin (fix: name {gpu_resource_name}, "
                               "or share MIG devices with sharing.timeSlicing)")
        if not _family(name, gpu_resource_name):
            raise SharingError(f"{entry.where}.name: {name!r} cannot be time-sliced: only {gpu_resource_name} and "
                               f"the MIG resources of --mig-strategy mixed ({domain}/mig-<profile>) can "
                               f"(fix: name one of them)")
        target = ts.target(entry, domain)
        try:
            check_resource_name(target)
        except OptionError as e:
            raise SharingError(f"{entry.where}.rename: {e}") from None
        if targets.setdefault(target, name) != name:
            raise SharingError(f"{entry.where}: {target} already holds replicas of {targets[target]} "
                               "(fix: give the replicas of each resource their own name)")
        members = bases.get(name)
        if not members:
            continue  # this node has no such resource
        ids = _select(entry, members)
        if target == name and len(ids) < len(members):
            raise SharingError(f"{entry.where}.devices: selects {len(ids)} of the {len(members)} {name} devices, "
                               f"but the replicas keep the name {name} that the others are served under "
                               "(fix: set rename, or renameByDefault: true)")
        for i in ids:
            if (name, i) in owner:
                raise SharingError(f"{entry.where}.devices: {i} is already shared by {owner[(name, i)]} "
                                   "(fix: share each device in one entry)")
            owner[(name, i)] = entry.where
        plan = plans.setdefault(name, {}).setdefault(target, _Plan(target, {}))
        _check_size(entry, target, len(ids), sum(plan.counts.values()), node_total)
        plan.counts.update({i: entry.replicas for i in ids})
        node_total += len(ids) * entry.replicas
    return {b: list(p.values()) for b, p in plans.items()}


def _check_size(entry: SharedResource, target: str, shared: int, in_target: int, in_node: int) -> None:
    """Refuse an entry that takes `target`, or the node, past `MAX_REPLICAS` replicas.

    Per resource, because both the kubelet's GetPreferredAllocation and our ListAndWatch carry the
    whole resource in one message (`MAX_REPLICAS` says how the bound fits both); per node too,
    so the daemon's memory has one ceiling, measured in the reliability suite and set as the
    chart's limit (several renamed entries could otherwise each fill a resource). Checked before
    anything is built, so a huge count costs nothing.
    """
    added = shared * entry.replicas
    if in_target + added > MAX_REPLICAS:
        total, before, why = in_target + added, in_target, (
            f"{target} devices, more than the {MAX_REPLICAS} one resource may advertise "
            f"({device_limit_reason()})")
    elif in_node + added > MAX_REPLICAS:
        total, before, why = in_node + added, in_node, (
            f"replicas on this node in all, more than the {MAX_REPLICAS} the daemon serves (its memory "
            "limit is sized for that many; see docs/sharing.md)")
    else:
        return
    earlier = f" (with {before} of earlier entries)" if before else ""
    room = (MAX_REPLICAS - before) // shared
    raise SharingError(
        f"{entry.where}.replicas: {entry.replicas} replicas of {shared} devices make {total}{earlier} {why} "
        f"(fix: replicas: {room} or fewer here, or share fewer devices)")


def subgraph(graph: DeviceGraph, keep: Sequence[str]) -> DeviceGraph:
    """`graph` restricted to the IDs in `keep` (in graph order); parents are kept as they are."""
    wanted = set(keep)
    pos = [i for i, d in enumerate(graph.ids) if d in wanted]
    return DeviceGraph(
        ids=tuple(graph.ids[i] for i in pos),
        numa=tuple(graph.numa[i] for i in pos),
        weights=tuple(tuple(graph.weights[a][b] for b in pos) for a in pos),
        ports=tuple(graph.ports[i] for i in pos) if graph.ports else (),
        parents=tuple(graph.parents[i] for i in pos) if graph.parents else (),
        parent_ids=graph.parent_ids,
    )


def apply_time_slicing(resources: list[Resource], ts: TimeSlicing | None, gpu_resource_name: str,
                       make_builder: Callable[[str], object], mps_root: str = DEFAULT_HOST_ROOT) -> list[Resource]:
    """`resources` with time-sliced ones replaced by (or split into) replica resources.

    `make_builder(name)` gives the Allocate builder of a GPU-family resource
    called `name` (the replicas wrap it); with `sharing.mps` the answer also
    carries the MPS pipe directory under `mps_root` and the share's limits
    (`plugin.model.mps_allocate`). Raises `SharingError`.
    """
    if ts is None:
        return resources
    family = {r.name: [(d.id, d.device) for d in r.devices] for r in resources
              if r.kind in (DeviceKind.GPU, DeviceKind.MIG)}
    plans = plan_time_slicing(ts, gpu_resource_name, family)
    out = []
    for r in resources:
        if r.name not in plans:
            out.append(r)
            continue
        shared = {i for p in plans[r.name] for i in p.counts}
        rest = tuple(d for d in r.devices if d.id not in shared)
        if rest:
            out.append(replace(r, devices=rest, graph=subgraph(r.graph, [d.id for d in rest])))
        for p in plans[r.name]:
            devices = tuple(ResourceDevice(replica_id(d.id, k), d.device, d.numa)
                            for d in r.devices for k in range(p.counts.get(d.id, 0)))
            graph = replica_graph(r.graph, {i: p.counts.get(i, 0) for i in r.graph.ids})
            assert graph.ids == tuple(d.id for d in devices), "replica devices follow the graph's order"
            builder: AllocateBuilder = ReplicaAllocateBuilder(make_builder(p.target), p.target,
                                                              ts.fail_requests_greater_than_one)
            if ts.mps:
                builder = MpsAllocateBuilder(
                    ReplicaAllocateBuilder(make_builder(p.target), p.target, True,
                                           "sharing.mps shares a GPU one replica per container",
                                           "request 1; a container needing more of a GPU needs fewer replicas"),
                    MpsPaths(mps_root, p.target), p.counts)
            out.append(Resource(p.target, r.kind, devices, REPLICA_POLICY, graph, builder, dict(r.policy_options)))
    names = [r.name for r in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SharingError(f"sharing.timeSlicing: {', '.join(dup)} would be served twice (the replicas' name is "
                           "that of another resource) (fix: rename the replicas)")
    return out
