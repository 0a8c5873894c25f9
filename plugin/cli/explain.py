"""`topo-device-plugin explain`: the kubelet Topology Manager's view of one pod on this node.

Why: whether a GPU pod is admitted depends on the kubelet's policy and scope,
on how the device manager turns *installed* devices into "preferred" hints,
and on how it then picks devices around the plugin's preference. None of that
is visible from the plugin's side. This command runs the model of all of it
(`allocator.topologymanager`) on the node the daemon would serve, with the
daemon's own allocator answering GetPreferredAllocation, and prints each
provider's hints, the merged affinity, admit or reject with the kubelet's
reason, and the devices the kubelet would end up with.

A rejection is a result, not a failure: exit 0 unless --fail-on-reject (then 1).
Bad usage, a bad topology file or a kubelet configuration the kubelet itself
would refuse (an unknown policy option, too many NUMA nodes): exit 2.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click

from allocator.scoring import score
from allocator.topologymanager import (
    POLICIES,
    SCOPES,
    Container,
    DeviceInfo,
    ExplainResult,
    Pod,
    ResourceSpec,
    TopologyHint,
    TopologyManagerError,
    machine_numa,
)
from allocator.topologymanager import explain as run_explain

from allocator.topology import DeviceKind, NodeTopology

from ..allocation.pairing_groups import DEFAULT_PAIRING_WINDOW_S, PairingGroups
from ..model.resources import Resource
from .allocate import (
    check_ids,
    id_hint,
    load_resources,
    pairing_index,
    pairs_data,
    pairs_text,
    parse_ids,
    parse_partners,
    run_policy,
)
from .json_keys import dumps
from .options import Settings, option, with_settings
from .typed import node_settings
from .routing import Command


def _parse_requests(values: Sequence[str], resources: Sequence[Resource], flag: str) -> dict[str, int]:
    names = [r.name for r in resources]
    out: dict[str, int] = {}
    for value in values:
        name, sep, count = value.partition("=")
        name, count = name.strip(), count.strip()
        if not sep or not name:
            raise click.UsageError(f"{flag} {value!r}: expected RESOURCE=N, e.g. nvidia.com/gpu=4")
        if name not in names:
            raise click.UsageError(f"{flag} {value!r}: this node serves no resource {name!r} "
                                   f"(it serves {', '.join(names)})")
        try:
            n = int(count)
        except ValueError:
            raise click.UsageError(f"{flag} {value!r}: N must be a whole number") from None
        if n < 0:
            raise click.UsageError(f"{flag} {value!r}: N must not be negative")
        out[name] = out.get(name, 0) + n
    return out


def _parse_cluster_requests(values: Sequence[str]) -> dict[str, int]:
    """RESOURCE=N for --cluster: any extended resource name (the nodes say which they have)."""
    out: dict[str, int] = {}
    for value in values:
        name, sep, count = value.partition("=")
        if not sep or not count.isdigit() or "/" not in name:
            raise click.UsageError(f"--request {value!r}: expected RESOURCE=N, e.g. nvidia.com/gpu=4")
        out[name] = int(count)
    return out


def _parse_options(values: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key.strip():
            raise click.UsageError(f"--policy-option {value!r}: expected KEY=VALUE, "
                                   "e.g. prefer-closest-numa-nodes=true")
        out[key.strip()] = val.strip()
    return out


def _parse_allocated(values: Sequence[str], resources: Sequence[Resource]) -> dict[str, list[str]]:
    """`--allocated 0,1,4,5` (IDs looked up in every resource) or `--allocated RESOURCE=IDS`."""
    by_name = {r.name: r for r in resources}
    owner: dict[str, list[str]] = {}
    for r in resources:
        for d in r.devices:
            owner.setdefault(d.id, []).append(r.name)
    out: dict[str, list[str]] = {}
    for value in values:
        head, sep, tail = value.partition("=")
        if sep and head.strip() in by_name:
            r = by_name[head.strip()]
            for i in check_ids(r, parse_ids(tail), "--allocated"):
                out.setdefault(r.name, []).append(i)
            continue
        for i in parse_ids(value):
            names = owner.get(i, [])
            if not names:
                raise click.UsageError(f"--allocated: no device has ID {i!r} on this node "
                                       f"({id_hint([i], [d.id for r in resources for d in r.devices])})")
            if len(names) > 1:
                raise click.UsageError(f"--allocated: ID {i!r} exists in {', '.join(names)}; "
                                       f"write RESOURCE=IDS, e.g. {names[0]}={i}")
            out.setdefault(names[0], []).append(i)
    return out


class PairingTrace:
    """The daemon's pairing inside the model: the call-sequence tracker and the cross-resource index,
    and, per GetPreferredAllocation in call order, its partners and the pairs of the answer.

    The model makes the kubelet's calls (GetPreferredAllocation, then Allocate, resource by resource);
    no time passes in it, so the window only turns pairing on or off. `seed` is `--with`: devices of
    other resources the container got just before (as if their Allocates came first).
    """

    def __init__(self, topology: NodeTopology, resources: Sequence[Resource], enabled: bool,
                 seed: Mapping[str, Sequence[str]]):
        self.index = pairing_index(topology, resources)
        self.groups = PairingGroups(DEFAULT_PAIRING_WINDOW_S if enabled else 0.0, clock=lambda: 0.0)
        self.calls: dict[str, list[dict[str, Any]]] = {}
        for res, ids in seed.items():
            self.groups.on_allocate(res, ids)

    def spec(self, r: Resource) -> ResourceSpec:
        devices = tuple(DeviceInfo(d.id, None if d.numa is None else (d.numa,), d.device.healthy) for d in r.devices)

        def preferred(available: list[str], must_include: list[str], size: int) -> list[str]:
            group = self.groups.on_get_preferred_allocation(r.name)
            result = run_policy(r, r.policy, available, must_include, size, self.index.partners(r.name, group))
            self.calls.setdefault(r.name, []).append(
                {"partners": {k: list(v) for k, v in group.items()}, "pairing": result.pairing,
                 "pairs": pairs_data(result.pairs)})
            return list(result.ids)

        return ResourceSpec(r.name, devices, preferred, lambda ids: self.groups.on_allocate(r.name, ids))


def _container_pairs(trace: PairingTrace, resources: Sequence[Resource], allocations: list[dict[str, Any]]
                     ) -> dict[str, list[dict[str, Any]]]:
    """Per container, its GPUs matched one to one with its NICs (what the kubelet finally gave it)."""
    kinds = {r.name: r.kind for r in resources}
    held: dict[str, dict[str, list[str]]] = {}
    for a in allocations:
        if a["devices"]:
            held.setdefault(a["container"], {}).setdefault(a["resource"], []).extend(a["devices"])
    out: dict[str, list[dict[str, Any]]] = {}
    for container, got in held.items():
        nics = {r: ids for r, ids in got.items() if kinds.get(r) is DeviceKind.NIC}
        pairs = [p for r, ids in got.items() if kinds.get(r) is DeviceKind.GPU
                 for p in pairs_data(trace.index.match(r, ids, nics))]
        if pairs:
            out[container] = pairs
    return out


def _hint_text(h: TopologyHint) -> str:
    aff = "any node (nil)" if h.affinity is None else "{" + ",".join(map(str, h.affinity.bits)) + "}"
    return f"{aff} {'preferred' if h.preferred else 'not preferred'}"


def _hint_dict_text(h: dict[str, Any]) -> str:
    aff = h["affinity"]
    text = "any node (nil)" if aff is None else "{" + ",".join(map(str, aff)) + "}"
    return f"{text} {'preferred' if h['preferred'] else 'not preferred'}"


def report_data(result: ExplainResult, resources: Sequence[Resource], source: str,
                trace: PairingTrace | None = None) -> dict[str, Any]:
    """The model's report plus what only the plugin side knows: W(S) of each allocation, and with a
    pairing trace each preferred call's partners and pairs and each container's GPU-NIC pairs."""
    data = result.to_dict()
    data["node"] = source
    graphs = {r.name: r.graph for r in resources}
    calls = {res: iter(c) for res, c in (trace.calls if trace else {}).items()}
    for alloc in data["allocations"]:
        graph = graphs.get(alloc["resource"])
        ids = alloc["devices"]
        alloc["score"] = score(graph, ids) if graph is not None and ids else 0
        if alloc["preferred_call"] is not None and alloc["resource"] in calls:
            alloc["preferred_call"].update(next(calls[alloc["resource"]], {}))
    data["pairs"] = _container_pairs(trace, resources, data["allocations"]) if trace else {}
    return data


def render_explain(data: dict[str, Any]) -> str:
    """The report as text: the kubelet's settings and the pod, each merge, the allocations, the result."""
    lines = _header_lines(data)
    allocs: dict[str, list[dict[str, Any]]] = {}
    for a in data["allocations"]:
        allocs.setdefault(a["container"], []).append(a)
    for m in data["merges"]:
        lines += _merge_lines(data, m, allocs)
    if not data["merges"]:
        lines += ["", "Policy none: no hints are merged; every container is allocated with no NUMA affinity."]
        for c in data["pod"]["init_containers"] + data["pod"]["containers"]:
            lines.append(f"  container {c['name']!r}:")
            lines += _allocation_lines(allocs.get(c["name"], []))
    for container, pairs in data.get("pairs", {}).items():
        lines.append(f"GPU-NIC pairs of container {container!r}: {pairs_text(pairs)}")
    if data["allocations"]:
        lines.append(EXPLAIN_LEGEND)
    lines.append("")
    if data["admit"]:
        lines.append("Result: ADMITTED")
    else:
        where = f" (container {data['failed_container']!r})" if data.get("failed_container") else ""
        lines.append(f"Result: REJECTED{where}: {data['reason']}: {data['message']}")
    return "\n".join(lines)


def _header_lines(data: dict[str, Any]) -> list[str]:
    opts = data["policy_options"]
    lines = [
        f"Node: {data['node']}   NUMA nodes: {', '.join(map(str, data['numa_nodes']))}",
        f"Kubelet: topologyManagerPolicy={data['policy']}"
        + (f" topologyManagerScope={data['scope']}" if data["policy"] != "none" else "")
        + ("   options: " + ", ".join(f"{k}={v}" for k, v in opts.items()) if opts else ""),
    ]
    for init in data["pod"]["init_containers"]:
        lines.append(f"Init container {init['name']!r} requests "
                     + ", ".join(f"{k}={v}" for k, v in init["limits"].items()))
    for c in data["pod"]["containers"]:
        lines.append(f"Container {c['name']!r} requests " + ", ".join(f"{k}={v}" for k, v in c["limits"].items()))
    if data.get("in_use"):
        lines.append("In use by other pods: "
                     + "; ".join(f"{r}: {', '.join(ids)}" for r, ids in data["in_use"].items()))
    lines += [f"Note: {w}" for w in data.get("warnings", [])]
    return lines


def _merge_lines(data: dict[str, Any], m: dict[str, Any], allocs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One Topology Manager merge: each provider's hints, the merged hint, the decision, the allocations."""
    who = ", ".join(m["containers"])
    title = f"Container {who}" if len(m["containers"]) == 1 and data["scope"] == "container" else f"Pod ({who})"
    lines = ["", f"{title}: Topology Manager merge", "  device manager hints:"]
    if not m["resources"]:
        lines.append("    (no device-plugin resource requested: no preference)")
    for r in m["resources"]:
        lines += _resource_hint_lines(r)
    lines.append(f"  merged affinity: {_hint_dict_text(m['best_hint'])}")
    lines.append(f"  policy decision: {'admit' if m['admit'] else 'reject'}")
    if not m["admit"]:
        lines.append(f"  why: {data['policy']} admits only a preferred merged hint"
                     + (" on a single NUMA node" if data["policy"] == "single-numa-node" else ""))
        return lines
    lines.append("  allocation (devicesToAllocate):")
    for c in m["containers"]:
        if len(m["containers"]) > 1:
            lines.append(f"   container {c!r}:")
        lines += _allocation_lines(allocs.get(c, []))
    return lines


def _resource_hint_lines(r: dict[str, Any]) -> list[str]:
    extra = []
    if r["min_affinity_size"] is not None:
        extra.append(f"narrowest fit for {r['request']} counting installed devices: "
                     f"{r['min_affinity_size']} NUMA node{'s' if r['min_affinity_size'] != 1 else ''}")
    if r["available"]:
        extra.append(f"free: {', '.join(r['available'])}")
    if r["reusable"]:
        extra.append(f"reusable: {', '.join(r['reusable'])}")
    lines = [f"    {r['resource']} (request {r['request']}): {r['note']}" + (f"; {'; '.join(extra)}" if extra else "")]
    if r["hints"] is None:
        lines.append("      no preference (nil)")
    elif not r["hints"]:
        lines.append("      no possible affinity ([])")
    lines += [f"      {_hint_dict_text(h)}" for h in r["hints"] or []]
    return lines


def _allocation_lines(allocs: list[dict[str, Any]]) -> list[str]:
    """What devicesToAllocate did for one container's resources."""
    lines = []
    for a in allocs:
        lines.append(f"    {a['resource']} x{a['required']}: " + _case_text(a))
        lines += [f"      - {step}" for step in a["steps"]]
        call = a["preferred_call"]
        if call is not None:
            lines.append(
                f"      - GetPreferredAllocation(available=[{', '.join(call['available'])}], "
                f"must_include=[{', '.join(call['must_include'])}], size={call['size']}) "
                f"-> [{', '.join(call['answer'])}]; kept [{', '.join(call['accepted'])}]"
            )
            if call.get("partners"):
                lines.append("        partners (this container's earlier Allocates): "
                             + "; ".join(f"{r}={','.join(ids)}" for r, ids in call["partners"].items())
                             + f"; pairing X(S,P) {call['pairing']}: {pairs_text(call['pairs'])}")
        elif a["preferred_skipped"]:
            lines.append(f"      - GetPreferredAllocation not called: {a['preferred_skipped']}")
        if a["devices"]:
            span = a["numa_span"]
            lines.append(
                f"      => devices {', '.join(a['devices'])}   NUMA span {len(span)}"
                + (f" (node{'s' if len(span) != 1 else ''} {', '.join(map(str, span))})" if span else "")
                + f"   W(S)={a['score']}"
            )
        if a["arbitrary"]:
            lines.append("      (the kubelet fills part of this set in random order; another run may "
                         "pick other devices from the same bucket)")
    return lines


#: Where Case A/B, W(S) and X(S,P) are explained (the repository's docs/allocation.md).
EXPLAIN_LEGEND = ("Terms: Case A/B (the kubelet's devicesToAllocate), W(S), X(S,P) are explained in "
                  "docs/allocation.md of topo-device-plugin")


def _case_text(a: dict[str, Any]) -> str:
    return {
        "reuse": "taken from the devices of an earlier init container",
        "already-allocated": "already allocated",
        "nothing": "nothing to allocate",
        "A": "Case A (more aligned devices than needed)",
        "B": "Case B (aligned devices are not more than needed)",
    }.get(a["case"], a["case"] or "-")


@click.command(cls=Command, examples=(
    "topo-device-plugin explain --simulate dgx-a100 --device-id-strategy index --policy restricted "
    "--request nvidia.com/gpu=4 --allocated 0,1,4,5",
))
@with_settings("explain")
@option("--policy", "tm_policy", type=click.Choice(POLICIES),
        help="The kubelet's --topology-manager-policy (required without --cluster).")
@option("--scope", "tm_scope", type=click.Choice(SCOPES), default="container",
        help="The kubelet's --topology-manager-scope.")
@option("--request", "requests", multiple=True, metavar="RESOURCE=N",
        help="Limit of the pod's container, e.g. nvidia.com/gpu=4 (repeat for more resources; or --pod).")
@option("--cluster", "cluster", metavar="KUBECONFIG",
        help="Judge every node of this cluster from its published NodeResourceTopology (serve --nrt) instead "
             "of this node: which would admit the pod aligned under its own policy (docs/scheduling.md).")
@option("--pod", "pod_file", metavar="FILE",
        help="With --cluster: the pod (a Pod, pod spec or workload YAML) whose containers' limits are judged.")
@option("--init-request", "init_requests", multiple=True, metavar="RESOURCE=N",
        help="Give the pod one init container with these limits (its devices are then reused).")
@option("--allocated", "allocated", multiple=True, metavar="IDS",
        help="Device IDs already held by other pods: 0,1,4,5 or RESOURCE=IDS (repeatable).")
@option("--policy-option", "policy_options", multiple=True, metavar="KEY=VALUE",
        help="A --topology-manager-policy-options entry, e.g. prefer-closest-numa-nodes=true.")
@option("--with", "with_opt", multiple=True, metavar="RESOURCE=IDS",
        help="Partners: devices of other resources the first container got just before, e.g. "
             "nvidia.com/gpu=0,1 (repeatable). A container's own resources pair by themselves "
             "(in the order of --request; the kubelet's order is random).")
@option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
        help="text: hints, merge, decision and devices, for people; json: the same data, for scripts.")
@option("--fail-on-reject", is_flag=True, help="Exit 1 when the pod would be rejected.")
def explain(settings: Settings, tm_policy: str, tm_scope: str, requests: tuple[str, ...],
            init_requests: tuple[str, ...], allocated: tuple[str, ...], policy_options: tuple[str, ...],
            with_opt: tuple[str, ...], fmt: str, fail_on_reject: bool, cluster: str | None = None,
            pod_file: str | None = None) -> None:
    """The kubelet Topology Manager's view of a pod: each provider's hints, the merged
    hint, admit or reject, then the devices the kubelet would end up with."""
    if cluster:
        from .explain_cluster import explain_cluster, read_pod  # noqa: PLC0415 (lightkube only with --cluster)

        if pod_file and requests:
            raise click.UsageError("give the pod with --pod FILE or --request RESOURCE=N, not both")
        if not pod_file and not requests:
            raise click.UsageError("--cluster needs the pod: --pod FILE or --request RESOURCE=N")
        pod = read_pod(pod_file) if pod_file else Pod.single(_parse_cluster_requests(requests))
        explain_cluster(cluster, pod, fmt, fail_on_reject)
        return
    if pod_file:
        raise click.UsageError("--pod is read with --cluster only (fix: --request RESOURCE=N for this node)")
    if not tm_policy:
        raise click.UsageError("Missing option '--policy' (the kubelet's Topology Manager policy; not needed "
                               "with --cluster)")
    if not requests:
        raise click.UsageError("Missing option '--request'")
    node = node_settings(settings)
    topology, resources = load_resources(node)
    limits = _parse_requests(requests, resources, "--request")
    init_limits = _parse_requests(init_requests, resources, "--init-request")
    in_use = _parse_allocated(allocated, resources)
    options = _parse_options(policy_options)
    trace = PairingTrace(topology, resources, node.resources.pairing_window_s > 0,
                         parse_partners(with_opt, resources))
    pod = Pod(
        uid="explain",
        name="explain",
        containers=(Container("main", limits),),
        init_containers=(Container("init", init_limits),) if init_limits else (),
    )
    nodes, distances = machine_numa(topology)
    try:
        result = run_explain(
            numa_nodes=nodes,
            distances=distances,
            resources=[trace.spec(r) for r in resources],
            pod=pod,
            policy=tm_policy,
            scope=tm_scope,
            policy_options=options,
            in_use=in_use,
        )
    except TopologyManagerError as e:
        raise click.UsageError(f"the kubelet would not start with this Topology Manager configuration: {e}") from None
    data = report_data(result, resources, topology.source, trace)
    data["in_use"] = in_use
    if fmt == "json":
        click.echo(dumps(data))
    else:
        click.echo(render_explain(data))
    if fail_on_reject and not result.admitted:
        raise SystemExit(1)
