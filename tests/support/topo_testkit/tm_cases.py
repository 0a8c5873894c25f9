"""JSON-in, JSON-out entry points for differential tests against the real kubelet.

Why: a Go harness around the real Topology Manager / device manager can emit
its cases and results as JSON; these functions take the same JSON-able inputs
and return the model's answer in the same shape, so the two can be compared
field by field without either side knowing the other's types.

Input conventions (all plain JSON):
- a hint is `{"affinity": [node, ...] | null, "preferred": bool}`;
- a provider's hints are `{resource: [hint, ...] | null}` or null / {} for
  "no hints at all"; a resource mapped to [] means "no possible affinity";
- distances are cadvisor rows `{"<node>": [d to node 0, d to node 1, ...]}`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from allocator.topologymanager.bitmask import BitMask
from allocator.topologymanager.device_hints import DeviceInfo
from allocator.topologymanager.device_manager import ResourceSpec
from allocator.topologymanager.devices_to_allocate import PreferredFn
from allocator.topologymanager.explain import explain
from allocator.topologymanager.hint import ProviderHints, TopologyHint, TopologyManagerError
from allocator.topologymanager.options import FeatureGates
from allocator.topologymanager.pod import Container, Pod
from allocator.topologymanager.topology_manager import TopologyManager


def _distances(raw: Mapping[Any, Sequence[int] | None] | None) -> dict[int, list[int] | None] | None:
    if raw is None:
        return None
    return {int(k): (None if v is None else [int(x) for x in v]) for k, v in raw.items()}


def _provider(raw: Mapping[str, Any] | None) -> ProviderHints | None:
    if raw is None:
        return None
    out: dict[str, list[TopologyHint] | None] = {}
    for resource, hints in raw.items():
        out[resource] = None if hints is None else [TopologyHint.from_dict(h) for h in hints]
    return out


def _hint_out(hint: TopologyHint) -> dict[str, Any]:
    aff = hint.affinity
    return {
        "affinity": None if aff is None else list(aff.bits),
        "affinity_mask": None if aff is None else aff.value,
        "preferred": hint.preferred,
    }


def evaluate_merge_case(case: Mapping[str, Any]) -> dict[str, Any]:
    """One Topology Manager decision: build the manager, merge the providers' hints, admit?

    Input keys: `numa_nodes` (list[int]), `policy`, optional `options`
    ({name: value}), optional `distances`, `providers` (list of provider
    hints, see module doc), optional `feature_gates`
    ({"alpha": bool, "beta": bool}).

    Returns `{"admit": bool, "affinity": [bits] | None, "affinity_mask": int | None,
    "preferred": bool, "error": None}`; where the kubelet would refuse to build the
    manager, `{"error": "<kubelet message>"}` with admit false.
    The scope does not matter for one merge (both scopes call the same Merge).
    """
    gates_raw = case.get("feature_gates") or {}
    gates = FeatureGates(
        policy_alpha_options=bool(gates_raw.get("alpha", False)),
        policy_beta_options=bool(gates_raw.get("beta", True)),
    )
    try:
        manager = TopologyManager.new(
            [int(n) for n in case.get("numa_nodes", [])],
            str(case["policy"]),
            str(case.get("scope", "container")),
            {str(k): str(v) for k, v in (case.get("options") or {}).items()},
            _distances(case.get("distances")),
            gates,
        )
    except TopologyManagerError as err:
        return {"admit": False, "affinity": None, "affinity_mask": None, "preferred": False, "error": str(err)}
    providers = [_provider(p) for p in case.get("providers", [])]
    best, admit = manager.policy.merge(providers)
    out = _hint_out(best)
    out["admit"] = admit
    out["error"] = None
    return out


def _preferred_fn(rule: Any) -> PreferredFn | None:
    """A stand-in plugin: null (no GetPreferredAllocation), "lowest" (must-include,
    then the lowest sorted IDs) or a fixed list of IDs returned every time."""
    if rule is None:
        return None
    if rule == "lowest":

        def lowest(available: list[str], must_include: list[str], size: int) -> list[str]:
            rest = [d for d in available if d not in must_include]
            return list(must_include) + rest[: max(0, size - len(must_include))]

        return lowest
    if isinstance(rule, list):
        fixed = [str(x) for x in rule]
        return lambda available, must_include, size: list(fixed)
    raise ValueError(f"unknown preferred rule {rule!r}: use null, 'lowest' or a list of IDs")


def _container(raw: Mapping[str, Any]) -> Container:
    return Container(
        name=str(raw["name"]),
        limits={str(k): int(v) for k, v in (raw.get("limits") or {}).items()},
        restartable=bool(raw.get("restartable", False)),
    )


def evaluate_admission_case(case: Mapping[str, Any]) -> dict[str, Any]:
    """A whole pod admission with the device manager as the only hint provider.

    Input keys: `numa_nodes`, `policy`, optional `scope`, `options`,
    `distances`; `resources`: {name: {"devices": [{"id", "numa_nodes": [..] | null,
    "healthy": bool}], "preferred": null | "lowest" | [ids]}}; optional
    `in_use`: {resource: [ids held by other pods]}; `pod`: {"uid",
    "init_containers": [{"name", "limits", "restartable"}], "containers": [...]}.

    Returns the `ExplainResult.to_dict()` report plus `"error"` (None, or the
    kubelet's start-up error). Fill order where the kubelet is random is the
    model's fixed order; `allocations[*].arbitrary` marks those places.
    """
    resources = []
    for name, spec in (case.get("resources") or {}).items():
        devices = tuple(
            DeviceInfo(
                str(d["id"]),
                None if d.get("numa_nodes") is None else tuple(int(n) for n in d["numa_nodes"]),
                bool(d.get("healthy", True)),
            )
            for d in spec.get("devices", [])
        )
        resources.append(ResourceSpec(str(name), devices, _preferred_fn(spec.get("preferred"))))
    raw_pod = case.get("pod") or {}
    pod = Pod(
        uid=str(raw_pod.get("uid", "pod")),
        name=str(raw_pod.get("name", "")),
        init_containers=tuple(_container(c) for c in raw_pod.get("init_containers", [])),
        containers=tuple(_container(c) for c in raw_pod.get("containers", [])),
    )
    try:
        report = explain(
            numa_nodes=[int(n) for n in case.get("numa_nodes", [])],
            resources=resources,
            pod=pod,
            policy=str(case["policy"]),
            scope=str(case.get("scope", "container")),
            policy_options={str(k): str(v) for k, v in (case.get("options") or {}).items()},
            distances=_distances(case.get("distances")),
            in_use={str(k): [str(x) for x in v] for k, v in (case.get("in_use") or {}).items()},
        )
    except TopologyManagerError as err:
        return {"admit": False, "error": str(err)}
    out = report.to_dict()
    out["error"] = None
    return out


def mask_bits(mask: int) -> list[int]:
    """Helper for harness authors: the node IDs of a uint64 mask value."""
    return list(BitMask(mask).bits)
