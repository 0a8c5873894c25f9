"""`topo-device-plugin allocate`: what GetPreferredAllocation would answer, and why.

Why an offline command: operators want to check the allocator's choice for a
node before pods land on it, and to see the numbers behind the choice (NUMA
span, link score W(S), what is left W(A\\S)). It runs the very policy object
the daemon uses on the very DeviceGraph the daemon builds, so the answer is
the one the kubelet would receive.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import click

from allocator.pairing import NO_PARTNERS, PairingIndex, Partners, pair_label
from allocator.policies import get_policy
from allocator.policies.family import SharedAllocation
from allocator.request import Allocation, AllocationError, AllocationRequest
from allocator.scoring import evaluate, rank
from allocator.topology import DeviceGraph, NodeTopology

from ..model.resources import Resource, build_resources
from ..runtime.compose.source import build_source
from .json_keys import dumps
from .options import Settings, option, with_settings
from .routing import Command
from .typed import NodeSettings, node_settings

#: Above this many candidates `allocate` does not enumerate a runner-up.
RUNNER_UP_LIMIT = 16


# -- helpers shared with `explain` ------------------------------------------
def parse_ids(values: Iterable[str] | str | None) -> list[str]:
    """`"0,1, 4"` (or several such values) -> ["0", "1", "4"]; blanks ignored."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def load_resources(node: NodeSettings) -> tuple[NodeTopology, list[Resource]]:
    """Discover the node (simulated or real) and build the resources the daemon would serve."""
    topology = build_source(node.source).load()
    resources = build_resources(topology, node.resources)
    if not resources:
        raise click.UsageError(f"{topology.source}: the node has no GPU or NIC to serve")
    return topology, resources


def find_resource(resources: Sequence[Resource], name: str | None, default: str | None = None) -> Resource:
    names = [r.name for r in resources]
    wanted = name or default
    for r in resources:
        if r.name == wanted:
            return r
    if name is None:
        return resources[0]
    raise click.UsageError(f"unknown resource {name!r}: this node serves {', '.join(names)}")


def id_hint(bad: Sequence[str], known: Sequence[str], limit: int = 8) -> str:
    """How to name devices on this node: index IDs need `--device-id-strategy index`; else a few valid IDs."""
    if any(i.isdigit() for i in bad) and not any(k.isdigit() for k in known):
        return "GPU IDs are UUIDs by default; pass --device-id-strategy index to use 0, 1, 2, ..."
    shown = ", ".join(known[:limit]) + (f", ... ({len(known)} in all)" if len(known) > limit else "")
    return f"valid IDs: {shown}"


def check_ids(resource: Resource, ids: Iterable[str], what: str) -> list[str]:
    known = [d.id for d in resource.devices]
    ids = list(ids)
    bad = [i for i in ids if i not in known]
    if bad:
        raise click.UsageError(f"{what}: unknown device IDs for {resource.name}: {', '.join(bad)} "
                               f"({id_hint(bad, known)})")
    return ids


#: The text output lists at most this many available IDs (a MIG node has dozens); JSON lists them all.
SHOWN_IDS = 8


def ids_text(ids: Sequence[str], limit: int = SHOWN_IDS) -> str:
    """`a, b, c, ... +53 more (all in --format json)` once there are more than `limit`."""
    if len(ids) <= limit:
        return ", ".join(ids)
    return ", ".join(ids[:limit]) + f", ... +{len(ids) - limit} more (all in --format json)"


def check_request(available: Sequence[str], must: Sequence[str], size: int, available_given: bool) -> None:
    """The kubelet's request rules, said in this command's flags with the fix.

    Why here and not only in the allocator: the allocator's messages name the
    kubelet API's fields (`allocation_size`, `must_include_deviceIDs`), which is
    right for a gRPC status the kubelet logs, and wrong for a person at a prompt.
    """
    where = "--available" if available_given else "the healthy devices (--available not given)"
    repeated = sorted({i for i in available if list(available).count(i) > 1})
    if repeated:
        raise click.UsageError(f"--available repeats {', '.join(repeated)}: list each device once")
    repeated = sorted({i for i in must if list(must).count(i) > 1})
    if repeated:
        raise click.UsageError(f"--must-include repeats {', '.join(repeated)}: list each device once")
    missing = [i for i in must if i not in available]
    if missing:
        raise click.UsageError(f"--must-include {', '.join(missing)} not among {where}: a device the container "
                               f"must keep has to be free too; add it to --available or drop it from --must-include")
    if size > len(available):
        pool = (f"the {len(available)} devices in --available" if available_given
                else f"the node's {len(available)} healthy devices")
        raise click.UsageError(f"--size {size} is more than {pool}: ask for at most {len(available)}"
                               + (", or list more devices in --available" if available_given else ""))
    if len(must) > size:
        raise click.UsageError(f"--must-include lists {len(must)} devices but --size is {size}: "
                               f"raise --size to at least {len(must)} or keep fewer in --must-include")


def run_policy(resource: Resource, policy_name: str, available: Sequence[str], must_include: Sequence[str],
               size: int, partners: Partners = NO_PARTNERS) -> Allocation:
    """One GetPreferredAllocation as the daemon answers it (raises AllocationError on a bad request)."""
    options: dict[str, Any] = dict(resource.policy_options)
    policy = get_policy(policy_name, **options)
    return policy.allocate(resource.graph, AllocationRequest.of(available, must_include, size, partners))


def parse_partners(values: Iterable[str], resources: Sequence[Resource], flag: str = "--with"
                   ) -> dict[str, list[str]]:
    """`--with nvidia.com/gpu=0,1` (repeatable): devices of other resources the container already holds."""
    by_name = {r.name: r for r in resources}
    out: dict[str, list[str]] = {}
    for value in values:
        name, sep, ids = value.partition("=")
        name = name.strip()
        if not sep or not name:
            raise click.UsageError(f"{flag} {value!r}: expected RESOURCE=IDS, e.g. nvidia.com/gpu=0,1")
        if name not in by_name:
            raise click.UsageError(f"{flag} {value!r}: this node serves no resource {name!r} "
                                   f"(it serves {', '.join(by_name)})")
        for i in check_ids(by_name[name], parse_ids(ids), flag):
            if i not in out.setdefault(name, []):
                out[name].append(i)
    return out


def pairing_index(topology: NodeTopology, resources: Sequence[Resource]) -> PairingIndex:
    """The daemon's cross-resource weights for these resources."""
    return PairingIndex.build(topology, {r.name: r.devices for r in resources})


def pairs_data(pairs: Iterable[tuple[str, str, int]]) -> list[dict[str, Any]]:
    """(device, partner, weight) triples as `allocate`/`explain` show them, with the link type."""
    return [{"device": d, "partner": p, "link": pair_label(w), "weight": w} for d, p, w in pairs]


def pairs_text(pairs: Iterable[dict[str, Any]]) -> str:
    return ", ".join(f"{p['device']} ~ {p['partner']} {p['link']} ({p['weight']})" for p in pairs) or "none"


def preferred_callable(resource: Resource, policy_name: str) -> Callable[[list[str], list[str], int], list[str]]:
    """The plugin's GetPreferredAllocation as a plain callable for the Topology Manager model."""

    def preferred(available: list[str], must_include: list[str], size: int) -> list[str]:
        return list(run_policy(resource, policy_name, available, must_include, size).ids)

    return preferred


def numa_nodes_of(resource: Resource, ids: Iterable[str]) -> list[int]:
    by_id = resource.by_id()
    return sorted({numa for i in ids if i in by_id and (numa := by_id[i].numa) is not None})


# -- the "why" -----------------------------------------------------------------
_CRITERIA = {
    "numa-first": (("span", "smaller"), ("score", "larger"), ("left_score", "larger")),
    "link-first": (("score", "larger"), ("span", "smaller"), ("left_score", "larger")),
    "spread": (("span", "smaller"), ("ports", "larger"), ("score", "larger"), ("left_score", "larger")),
    "packed": (("span", "smaller"), ("ports", "smaller"), ("score", "larger"), ("left_score", "larger")),
}
#: With partners (spec, "pairing GPUs with NICs"): span is span(S u P), X(S, P) joins the criteria.
_PAIRED_CRITERIA = {
    "numa-first": (("span", "smaller"), ("score", "larger"), ("pairing", "larger"), ("left_score", "larger")),
    "link-first": (("score", "larger"), ("span", "smaller"), ("pairing", "larger"), ("left_score", "larger")),
    "spread": (("span", "smaller"), ("pairing", "larger"), *_CRITERIA["spread"][1:]),
    "packed": (("span", "smaller"), ("pairing", "larger"), *_CRITERIA["packed"][1:]),
}
#: Where the printed terms are explained (the repository's docs/allocation.md).
ALLOCATE_LEGEND = "Terms: NUMA span, W(S), W(A\\S)"
LEGEND_WHERE = " are explained in docs/allocation.md of topo-device-plugin"
_LABELS = {"span": "NUMA span", "score": "W(S)", "left_score": "W(A\\S)", "ports": "ports",
           "pairing": "pairing X(S,P)"}


def runner_up(graph: DeviceGraph, policy: str, available: Sequence[str], must_include: Sequence[str],
              chosen: Sequence[str], partners: Partners = NO_PARTNERS) -> dict[str, Any] | None:
    """The best other set and the first criterion that separates it from the choice (small inputs only)."""
    if policy not in _CRITERIA or len(available) > RUNNER_UP_LIMIT:
        return None
    k = len(chosen)
    must = set(must_include)
    free = [a for a in available if a not in must]
    best: tuple | None = None
    best_set: tuple[str, ...] | None = None
    chosen_set = set(chosen)
    for combo in itertools.combinations(free, k - len(must)):
        s = tuple(must_include) + combo
        if set(s) == chosen_set:
            continue
        key = rank(graph, policy, available, s, partners)
        if best is None or key < best:
            best, best_set = key, s
    if best_set is None:
        return None
    a = evaluate(graph, available, chosen, partners)
    b = evaluate(graph, available, best_set, partners)
    reason = ""
    for field, better in (_PAIRED_CRITERIA if partners else _CRITERIA)[policy]:
        va, vb = getattr(a, field), getattr(b, field)
        if va != vb:
            reason = f"{_LABELS[field]} {va} vs {vb} ({better} is better)"
            break
    return {
        "ids": list(best_set),
        "span": b.span,
        "score": b.score,
        "left_score": b.left_score,
        "tie": not reason,
        "reason": reason or "ties on every criterion; the fixed tie rule (lowest device order) decides",
    }


@click.command(cls=Command, examples=(
    "topo-device-plugin allocate --simulate dgx-a100 --device-id-strategy index --size 2 --available 0,1,2,4,5",
))
@with_settings("allocate")
@option("--size", type=click.IntRange(min=1), required=True,
        help="How many devices the container asks for (the kubelet's allocation size).")
@option("--available", "available_opt", multiple=True, metavar="IDS",
        help="The free devices to choose from, comma-separated (default: every healthy device of the resource).")
@option("--must-include", "must_opt", multiple=True, metavar="IDS",
        help="Devices the answer must contain, comma-separated (the kubelet's must-include list).")
@option("--resource", "resource_name", default=None, metavar="NAME",
        help="Which resource (default: the GPU resource, else the first one served).")
@option("--with", "with_opt", multiple=True, metavar="RESOURCE=IDS",
        help="Partners: devices of another resource the container already got, e.g. nvidia.com/gpu=0,1 "
             "(repeatable); the answer pairs with them as the daemon's would.")
@option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
        help="text: the answer and why, for people; json: every number of the answer, for scripts.")
def allocate(settings: Settings, size: int, available_opt: tuple[str, ...], must_opt: tuple[str, ...],
             resource_name: str | None, with_opt: tuple[str, ...], fmt: str) -> None:
    """The set GetPreferredAllocation would return, with its NUMA span and scores, and why."""
    node = node_settings(settings)
    topology, resources = load_resources(node)
    resource = find_resource(resources, resource_name, node.resources.gpu_resource_name)
    available = parse_ids(available_opt) or [d.id for d in resource.devices if d.device.healthy]
    check_ids(resource, available, "--available")
    must = check_ids(resource, parse_ids(must_opt), "--must-include")
    group = parse_partners(with_opt, resources)
    if resource.name in group:
        raise click.UsageError(f"--with {resource.name}=...: partners are devices of another resource "
                               f"than the one asked for ({resource.name})")
    partners = pairing_index(topology, resources).partners(resource.name, group)
    policy_name = resource.policy  # the daemon's policy for it (--allocation-policy for GPUs)
    check_request(available, must, size, bool(parse_ids(available_opt)))
    try:
        result = run_policy(resource, policy_name, available, must, size, partners)
    except AllocationError as e:
        raise click.UsageError(f"bad request: {e}") from None
    ev = evaluate(resource.graph, available, result.ids, partners)
    other = runner_up(resource.graph, policy_name, available, must, result.ids, partners)
    data: dict[str, Any] = {
        "node": topology.source,
        "resource": resource.name,
        "policy": policy_name,
        "request": {"available": list(available), "must_include": list(must), "size": size},
        "ids": list(result.ids),
        "numa_nodes": numa_nodes_of(resource, result.ids),
        "span": result.span,
        "score": result.score,
        "left_score": result.left_score,
        "ports": ev.ports,
        "optimal": result.optimal,
        "explored": result.explored,
        "runner_up": other,
        "partners": group,
        "pairing": result.pairing,
        "pairs": pairs_data(result.pairs),
    }
    if isinstance(result, SharedAllocation):
        data["parents"] = list(result.parents)
        # A list of {name, value}: the names are sentences for people, not field names (json_keys).
        data["criteria"] = [{"name": n, "value": v} for n, v in
                            zip(SHARED_CRITERIA[policy_name], _shared_values(policy_name, result.criteria))]
    if fmt == "json":
        click.echo(dumps(data))
        return
    click.echo(render_allocate(data))


#: What the replica and MIG policies' criteria mean, in their order (docs/sharing.md).
SHARED_CRITERIA = {
    "replicas": ("NUMA span", "distinct GPUs", "replicas already handed out on the chosen GPUs (per pick)",
                 "W(GPUs)"),
    "mig": ("NUMA span", "GPUs", "free MIG devices of those GPUs (fullest first)", "fill (free count per pick)"),
}
_SHARED_WHY = {
    "replicas": "the time-slicing objective: smallest NUMA span, most distinct GPUs, least-loaded GPUs, "
                "best links between them, then the lowest device order",
    "mig": "the MIG objective: smallest NUMA span, fewest GPUs, the fullest GPUs first (best fit), "
           "then the lowest device order",
}


def _shared_values(policy: str, criteria: tuple) -> list[Any]:
    if policy == "replicas":
        span, gpus, load, w = criteria
        return [span, -gpus, load, -w]
    span, gpus, free, fill = criteria
    return [span, gpus, list(free), fill]


def render_shared(data: dict[str, Any]) -> list[str]:
    lines = [f"  {c['name']}: {c['value']}" for c in data["criteria"] if c["name"] != "NUMA span"]
    lines.insert(0, f"  on: {', '.join(data['parents'])}")
    lines.append(f"  optimal: {'yes (proven)' if data['optimal'] else 'not proven within the time budget'}")
    lines.append(f"Why: {_SHARED_WHY[data['policy']]}")
    return lines


def render_allocate(data: dict[str, Any]) -> str:
    req = data["request"]
    lines = [
        f"Node: {data['node']}   resource: {data['resource']}   policy: {data['policy']}",
        f"Request: size {req['size']} of {len(req['available'])} available "
        f"({ids_text(req['available'])})"
        + (f", must include {', '.join(req['must_include'])}" if req["must_include"] else ""),
        "",
        f"Preferred allocation: {', '.join(data['ids'])}",
        f"  NUMA span: {data['span']}"
        + (f" (node{'s' if len(data['numa_nodes']) != 1 else ''} "
           f"{', '.join(map(str, data['numa_nodes']))})" if data["numa_nodes"] else " (no NUMA information)"),
    ]
    if "criteria" in data:
        return "\n".join(lines + render_shared(data))
    lines += [
        f"  link score W(S): {data['score']}",
        f"  left for the next pod W(A\\S): {data['left_score']}",
    ]
    if data["policy"] in ("spread", "packed"):
        lines.append(f"  ports: {data['ports']}")
    if data["partners"]:
        lines.insert(2, "Partners (the container's other devices): "
                     + "; ".join(f"{r}={','.join(ids)}" for r, ids in data["partners"].items()))
        lines.append(f"  pairing X(S,P): {data['pairing']}  pairs: {pairs_text(data['pairs'])}")
    lines.append(f"  optimal: {'yes (proven)' if data['optimal'] else 'not proven within the time budget'}")
    other = data.get("runner_up")
    if other and other["tie"]:
        lines.append(f"Why: {', '.join(other['ids'])} is as good on every criterion; "
                     "the fixed tie rule (lowest device order) picks this set")
    elif other:
        lines.append(f"Why: beats the next best set {', '.join(other['ids'])} on {other['reason']}")
    elif other is None and len(req["available"]) > RUNNER_UP_LIMIT:
        lines.append(f"Why: (no runner-up search above {RUNNER_UP_LIMIT} candidates)")
    else:
        lines.append("Why: it is the only possible set")
    lines.append(ALLOCATE_LEGEND + (", X(S,P)" if data["partners"] else "") + LEGEND_WHERE)
    return "\n".join(lines)
