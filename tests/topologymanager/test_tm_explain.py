"""Whole-admission scenarios through `explain`, the JSON harness entry points, and
differential properties between the policies."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.topologymanager import (
    BestEffortPolicy,
    BitMask,
    Container,
    DeviceInfo,
    NUMAInfo,
    Pod,
    PolicyOptions,
    ResourceSpec,
    RestrictedPolicy,
    SingleNumaNodePolicy,
    TopologyHint,
    TopologyManagerError,
    explain,
)
from topo_testkit.tm_cases import evaluate_admission_case, evaluate_merge_case


def lowest(available, must_include, size):
    rest = [d for d in available if d not in must_include]
    return list(must_include) + rest[: size - len(must_include)]


GPUS = tuple(DeviceInfo(str(i), (0 if i < 4 else 1,)) for i in range(8))
NICS = (DeviceInfo("mlx5_0", (0,)), DeviceInfo("mlx5_1", (1,)))


def _explain(policy, limits, in_use=None, scope="container", resources=None, pod=None, **kw):
    return explain(
        numa_nodes=(0, 1),
        resources=resources or [ResourceSpec("nvidia.com/gpu", GPUS, lowest)],
        pod=pod or Pod.single(limits),
        policy=policy,
        scope=scope,
        in_use=in_use,
        **kw,
    )


# -- the acceptance scenario: 4 GPUs per NUMA node, 2 used on each, request 4 -----

@pytest.mark.parametrize("scope", ["container", "pod"])
def test_restricted_rejects_when_only_a_cross_numa_fit_is_free(scope):
    r = _explain("restricted", {"nvidia.com/gpu": 4}, {"nvidia.com/gpu": ["0", "1", "4", "5"]}, scope)
    assert not r.admitted
    assert r.result.reason == "TopologyAffinityError"
    assert r.result.message == "Resources cannot be allocated with Topology locality"
    assert r.merges[0].best_hint == TopologyHint(BitMask.of(0, 1), False)
    (gpu,) = r.merges[0].resources
    assert gpu.min_affinity_size == 1 and [h.to_dict() for h in gpu.hints] == [
        {"affinity": [0, 1], "preferred": False}
    ]
    assert r.allocations == []


@pytest.mark.parametrize("scope", ["container", "pod"])
def test_best_effort_admits_across_both_nodes(scope):
    r = _explain("best-effort", {"nvidia.com/gpu": 4}, {"nvidia.com/gpu": ["0", "1", "4", "5"]}, scope)
    assert r.admitted and r.result.reason == ""
    assert r.merges[0].best_hint == TopologyHint(BitMask.of(0, 1), False)
    (alloc,) = r.allocations
    assert sorted(alloc.devices) == ["2", "3", "6", "7"]
    assert alloc.numa_span == (0, 1)
    assert alloc.outcome.case == "B" and alloc.outcome.preferred_call is None
    assert not alloc.outcome.arbitrary


def test_single_numa_node_rejects_the_same_pod():
    r = _explain("single-numa-node", {"nvidia.com/gpu": 4}, {"nvidia.com/gpu": ["0", "1", "4", "5"]})
    assert not r.admitted and r.result.reason == "TopologyAffinityError"


def test_none_policy_admits_and_lets_the_plugin_choose():
    r = _explain("none", {"nvidia.com/gpu": 2})
    assert r.admitted and r.merges == []
    (alloc,) = r.allocations
    assert alloc.outcome.preferred_call is not None  # no affinity: the plugin picks among all 8
    assert alloc.outcome.preferred_call.available == tuple(str(i) for i in range(8))
    assert alloc.devices == ("0", "1")


# -- single-numa-node vs restricted, kubelet-test style ----------------------------

@pytest.mark.parametrize(
    "limits, in_use, restricted, single",
    [
        ({"nvidia.com/gpu": 4}, {}, True, True),  # fits on one node
        ({"nvidia.com/gpu": 5}, {}, True, False),  # needs both nodes; {0,1} is the narrowest possible
        ({"nvidia.com/gpu": 4}, {"nvidia.com/gpu": ["0", "1", "4", "5"]}, False, False),
        ({"nvidia.com/gpu": 2}, {"nvidia.com/gpu": ["0", "1", "4", "5"]}, True, True),
        ({"nvidia.com/gpu": 8}, {}, True, False),
        ({"nvidia.com/gpu": 3}, {"nvidia.com/gpu": ["0", "1"]}, True, True),  # node 1 still has 4
    ],
)
def test_single_numa_node_versus_restricted(limits, in_use, restricted, single):
    assert _explain("restricted", limits, in_use).admitted is restricted
    assert _explain("single-numa-node", limits, in_use).admitted is single


def test_two_resources_must_agree_on_a_node():
    resources = [ResourceSpec("nvidia.com/gpu", GPUS, lowest), ResourceSpec("example.com/nic", NICS, lowest)]
    limits = {"nvidia.com/gpu": 2, "example.com/nic": 1}
    # NIC 0 in use: the only NIC left is on node 1, so the GPUs must come from node 1 too.
    r = _explain("single-numa-node", limits, {"example.com/nic": ["mlx5_0"]}, resources=resources)
    assert r.admitted and r.merges[0].best_hint == TopologyHint(BitMask.of(1), True)
    assert sorted(r.devices_for("main", "nvidia.com/gpu")) == ["4", "5"]
    assert r.devices_for("main", "example.com/nic") == ("mlx5_1",)
    # With GPUs on node 1 busy as well there is no common node.
    r = _explain("single-numa-node", limits, {"example.com/nic": ["mlx5_0"], "nvidia.com/gpu": ["4", "5", "6"]},
                 resources=resources)
    assert not r.admitted


def test_container_scope_init_then_app_with_reuse():
    pod = Pod("p", (Container("app", {"nvidia.com/gpu": 2}),), (Container("init", {"nvidia.com/gpu": 2}),))
    r = _explain("restricted", {}, pod=pod)
    assert r.admitted
    assert [m.containers for m in r.merges] == [("init",), ("app",)]
    # The app container's hints count the init container's devices as reusable.
    assert r.merges[1].resources[0].reusable == ("0", "1")
    assert r.devices_for("init", "nvidia.com/gpu") == r.devices_for("app", "nvidia.com/gpu") == ("0", "1")
    assert r.allocations[1].outcome.case == "reuse"


def test_pod_scope_uses_the_effective_request():
    pod = Pod("p", (Container("a1", {"nvidia.com/gpu": 3}), Container("a2", {"nvidia.com/gpu": 2})))
    r = _explain("restricted", {}, pod=pod, scope="pod")
    assert r.merges[0].resources[0].request == 5
    assert r.admitted and r.merges[0].best_hint.affinity == BitMask.of(0, 1)
    r = _explain("single-numa-node", {}, pod=pod, scope="pod")
    assert not r.admitted
    # Container scope: each container alone fits on one node.
    assert _explain("single-numa-node", {}, pod=pod, scope="container").admitted


def test_second_container_that_no_longer_fits_is_an_unexpected_admission_error():
    pod = Pod("p", (Container("a1", {"nvidia.com/gpu": 4}), Container("a2", {"nvidia.com/gpu": 4})))
    r = _explain("best-effort", {}, pod=pod, in_use={"nvidia.com/gpu": ["0"]})
    # a1 takes node 1 entirely; a2 has only 3 left: hints [] -> best-effort admits, Allocate fails.
    assert not r.admitted and r.failed_container == "a2"
    assert r.result.reason == "UnexpectedAdmissionError"
    assert r.result.message == (
        "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. "
        "Requested: 4, Available: 3, which is unexpected"
    )


def test_manager_errors_propagate():
    with pytest.raises(TopologyManagerError, match="should not be less than 8"):
        _explain("restricted", {"nvidia.com/gpu": 1}, policy_options={"max-allowable-numa-nodes": "7"})


def test_result_is_json_serialisable():
    r = _explain("best-effort", {"nvidia.com/gpu": 4}, {"nvidia.com/gpu": ["0", "1", "4", "5"]})
    data = json.loads(json.dumps(r.to_dict()))
    assert data["admit"] is True and data["allocations"][0]["numa_span"] == [0, 1]
    assert data["merges"][0]["best_hint"] == {"affinity": [0, 1], "preferred": False}
    assert data["affinities"]["main"] == {"affinity": [0, 1], "preferred": False}


# -- JSON harness entry points -------------------------------------------------

def test_evaluate_merge_case():
    out = evaluate_merge_case({
        "numa_nodes": [0, 1, 2, 3],
        "policy": "restricted",
        "providers": [
            {"resource1": [{"affinity": [0, 1, 2, 3], "preferred": False}, {"affinity": [0, 1], "preferred": False}]},
            {"resource2": [{"affinity": [1, 2], "preferred": False}, {"affinity": [2, 3], "preferred": False}]},
        ],
    })
    assert out == {"admit": False, "affinity": [1, 2], "affinity_mask": 6, "preferred": False, "error": None}
    closest = evaluate_merge_case({
        "numa_nodes": list(range(8)),
        "policy": "best-effort",
        "options": {"prefer-closest-numa-nodes": "true"},
        "distances": {str(n): row for n, row in enumerate(
            [[10, 11, 12, 12, 30, 30, 30, 30], [11, 10, 12, 12, 30, 30, 30, 30],
             [12, 12, 10, 11, 30, 30, 30, 30], [12, 12, 11, 10, 30, 30, 30, 30],
             [30, 30, 30, 30, 10, 11, 12, 12], [30, 30, 30, 30, 11, 10, 12, 12],
             [30, 30, 30, 30, 12, 12, 10, 11], [30, 30, 30, 30, 12, 12, 13, 10]])},
        "providers": [
            {"resource1": [{"affinity": [0, 1, 2, 3], "preferred": False}, {"affinity": [0, 1], "preferred": False}]},
            {"resource2": [{"affinity": [1, 2], "preferred": False}, {"affinity": [2, 3], "preferred": False}]},
        ],
    })
    assert closest["affinity"] == [2, 3] and closest["admit"] is True
    assert evaluate_merge_case({"numa_nodes": list(range(9)), "policy": "best-effort", "providers": []})["error"] == (
        "unsupported on machines with more than 8 NUMA Nodes"
    )
    assert evaluate_merge_case({"numa_nodes": [0, 1], "policy": "single-numa-node", "providers": [None]}) == {
        "admit": True, "affinity": None, "affinity_mask": None, "preferred": True, "error": None,
    }


def test_evaluate_admission_case():
    devices = [{"id": str(i), "numa_nodes": [0 if i < 4 else 1]} for i in range(8)]
    case = {
        "numa_nodes": [0, 1],
        "policy": "best-effort",
        "resources": {"nvidia.com/gpu": {"devices": devices, "preferred": "lowest"}},
        "in_use": {"nvidia.com/gpu": ["0", "1", "4", "5"]},
        "pod": {"uid": "p", "containers": [{"name": "main", "limits": {"nvidia.com/gpu": 4}}]},
    }
    out = evaluate_admission_case(case)
    assert out["admit"] is True and out["error"] is None
    assert sorted(out["allocations"][0]["devices"]) == ["2", "3", "6", "7"]
    out = evaluate_admission_case(dict(case, policy="restricted"))
    assert out["admit"] is False and out["reason"] == "TopologyAffinityError"
    json.dumps(out)


# -- differential properties between the policies ---------------------------

masks = st.sets(st.integers(0, 3), min_size=1, max_size=4).map(lambda s: tuple(sorted(s)))
hint = st.builds(lambda m, p: TopologyHint(None if m is None else BitMask.of(*m), p), st.none() | masks, st.booleans())
provider = st.none() | st.dictionaries(
    st.sampled_from(["r1", "r2", "r3"]), st.none() | st.lists(hint, max_size=4), max_size=2
)
NUMA4 = NUMAInfo((0, 1, 2, 3))


@settings(max_examples=150, deadline=None)
@given(st.lists(provider, max_size=3))
def test_policy_relations(providers):
    be, be_admit = BestEffortPolicy(NUMA4).merge(providers)
    re, re_admit = RestrictedPolicy(NUMA4).merge(providers)
    sn, sn_admit = SingleNumaNodePolicy(NUMA4).merge(providers)
    # best-effort always admits; restricted is best-effort's merge, admitted iff preferred.
    assert be_admit and re == be and re_admit is be.preferred
    # Whatever single-numa-node admits, restricted admits too.
    if sn_admit:
        assert re_admit
        assert sn.affinity is None or sn.affinity.count() == 1
    # The merged mask is never empty.
    assert be.affinity is not None and be.affinity.count() > 0


@settings(max_examples=150, deadline=None)
@given(st.lists(provider, max_size=3), st.randoms(use_true_random=False))
def test_merge_does_not_depend_on_the_order_of_resources_or_providers(providers, rnd):
    """The kubelet walks Go maps in random order; the merged hint must not care."""
    shuffled = []
    for p in providers:
        if p is None:
            shuffled.append(None)
            continue
        items = list(p.items())
        rnd.shuffle(items)
        shuffled.append({k: (None if v is None else rnd.sample(v, len(v))) for k, v in items})
    rnd.shuffle(shuffled)
    for policy in (BestEffortPolicy(NUMA4), SingleNumaNodePolicy(NUMA4)):
        assert policy.merge(providers) == policy.merge(shuffled)
    closest = BestEffortPolicy(
        NUMAInfo((0, 1, 2, 3), {0: (10, 11, 12, 12), 1: (11, 10, 12, 12), 2: (12, 12, 10, 11), 3: (12, 12, 11, 10)}),
        PolicyOptions(prefer_closest_numa=True),
    )
    assert closest.merge(providers) == closest.merge(shuffled)
