"""Which nodes can admit a pod aligned, from their published NodeResourceTopology objects (pure).

Why: `explain` answers for one node from its hardware; before a rollout an
operator asks the same of the cluster: "which of my nodes would the kubelet
admit this pod on under its Topology Manager policy?". The published objects
say, per node, the policy and scope and per NUMA zone how many devices of each
resource are allocatable and available; that is all the kubelet's decision
depends on for device-plugin resources, so the Topology Manager model
(`allocator.topologymanager`, the same one `explain` runs) gives the verdict:
each zone's devices become `count` devices on that NUMA node, the held ones in
use, the unhealthy ones unhealthy.

What it cannot see: CPUs and memory (we publish devices only, so a pod's CPU or
memory alignment is not judged), devices without a NUMA node (not published),
and which exact devices are held (any of a zone's are equivalent to the model,
as they are to the kubelet's hints). A node published without the policy
attributes is judged as `none`, as scheduler-plugins does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from allocator.topologymanager import (
    Container,
    DeviceInfo,
    Pod,
    ResourceSpec,
    TopologyManagerError,
    explain,
)


class PodSpecError(ValueError):
    """A pod spec this cannot read; the message names the field and the fix."""


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    policy: str
    scope: str
    admit: bool
    #: Why (the kubelet's reason, a missing resource, or "aligned on NUMA ...").
    reason: str
    #: The NUMA nodes of the merged hint (empty: none or any).
    numa: tuple[int, ...] = ()
    #: The node did not publish its policy (judged as `none`).
    policy_assumed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "policy": self.policy, "scope": self.scope, "admit": self.admit,
                "reason": self.reason, "numa": list(self.numa), "policy_assumed": self.policy_assumed}


def _limits(c: Mapping[str, Any], where: str) -> dict[str, int]:
    limits = ((c.get("resources") or {}).get("limits") or {})
    if not isinstance(limits, Mapping):
        raise PodSpecError(f"{where}.resources.limits: not a mapping (fix: name: count pairs)")
    out: dict[str, int] = {}
    for name, value in limits.items():
        if "/" not in str(name) or str(name).startswith("hugepages-"):
            continue  # cpu, memory, ephemeral-storage, hugepages: not ours to judge (module doc)
        try:
            out[str(name)] = int(str(value))
        except ValueError:
            raise PodSpecError(f"{where}.resources.limits.{name}: {value!r} is not a whole number of devices "
                               "(fix: e.g. 4)") from None
    return out


def pod_from_spec(obj: Mapping[str, Any]) -> Pod:
    """A Pod (or a bare pod spec, or a workload's template) as the model's `Pod`: each container's
    extended-resource limits; init containers with `restartPolicy: Always` are sidecars."""
    spec: Any = obj
    if "template" in (obj.get("spec") or {}):  # Deployment, Job, ...: the pod template
        spec = obj["spec"]["template"]
    if "spec" in spec:
        spec = spec["spec"]
    if not isinstance(spec, Mapping) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
        raise PodSpecError("spec.containers: missing or empty (fix: give a Pod, a pod spec or a workload with a "
                           "pod template)")
    containers = tuple(Container(str(c.get("name") or f"c{i}"), _limits(c, f"spec.containers[{i}]"))
                       for i, c in enumerate(spec["containers"]))
    inits = tuple(Container(str(c.get("name") or f"init{i}"), _limits(c, f"spec.initContainers[{i}]"),
                            restartable=c.get("restartPolicy") == "Always")
                  for i, c in enumerate(spec.get("initContainers") or ()))
    name = str(((obj.get("metadata") or {}).get("name")) or "pod")
    return Pod(uid=name, name=name, containers=containers, init_containers=inits)


def _attribute(attrs: Sequence[Mapping[str, Any]] | None, name: str) -> str | None:
    for a in attrs or ():
        if a.get("name") == name:
            return str(a.get("value"))
    return None


def node_verdict(nrt: Mapping[str, Any], pod: Pod) -> NodeVerdict:
    """Would this node's kubelet admit `pod` (its device-plugin resources) with the published state?"""
    node = str((nrt.get("metadata") or {}).get("name", "?"))
    policy = _attribute(nrt.get("attributes"), "topologyManagerPolicy")
    scope = _attribute(nrt.get("attributes"), "topologyManagerScope") or "container"
    assumed = policy is None
    policy = policy or "none"
    devices: dict[str, list[DeviceInfo]] = {}
    in_use: dict[str, list[str]] = {}
    numa_nodes: list[int] = []
    for z in nrt.get("zones") or ():
        if z.get("type") != "Node" or not str(z.get("name", "")).startswith("node-"):
            continue
        try:
            n = int(str(z["name"]).removeprefix("node-"))
        except ValueError:
            continue
        numa_nodes.append(n)
        for r in z.get("resources") or ():
            capacity, allocatable, available = (int(str(r.get(k, 0))) for k in ("capacity", "allocatable",
                                                                                  "available"))
            ids = [f"{z['name']}/{i}" for i in range(capacity)]
            devices.setdefault(r["name"], []).extend(
                DeviceInfo(i, (n,), healthy=k < allocatable) for k, i in enumerate(ids))
            in_use.setdefault(r["name"], []).extend(ids[available:allocatable])
    wanted = {res for c in pod.all_containers() for res, v in c.limits.items() if v > 0}
    missing = sorted(wanted - set(devices))
    if missing:
        return NodeVerdict(node, policy, scope, False, f"publishes no {', '.join(missing)}", policy_assumed=assumed)
    specs = [ResourceSpec(name, tuple(devs)) for name, devs in devices.items() if name in wanted]
    try:
        result = explain(numa_nodes=sorted(numa_nodes) or (0,), resources=specs, pod=pod, policy=policy, scope=scope,
                         in_use={k: v for k, v in in_use.items() if k in wanted})
    except TopologyManagerError as e:
        return NodeVerdict(node, policy, scope, False, f"the published policy cannot be modelled: {e}",
                           policy_assumed=assumed)
    if not result.admitted:
        return NodeVerdict(node, policy, scope, False, f"{result.result.reason}: {result.result.message}".rstrip(": "),
                           policy_assumed=assumed)
    spans = sorted({n for a in result.allocations for n in a.numa_span})
    return NodeVerdict(node, policy, scope, True, "admitted" + (f" on NUMA {','.join(map(str, spans))}" if spans
                                                               else ""), tuple(spans), assumed)


def cluster_verdicts(objects: Sequence[Mapping[str, Any]], pod: Pod) -> list[NodeVerdict]:
    return sorted((node_verdict(o, pod) for o in objects), key=lambda v: (not v.admit, v.node))
