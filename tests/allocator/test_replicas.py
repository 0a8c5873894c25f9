"""Time-slicing replicas: the `replicas` policy against brute-force oracles and the spec's examples.

Nodes: the GPUs of every shared `nvidia-smi topo -m` fixture (through the
simulated-node loader) and generated GPU sets with several NUMA nodes, some
GPUs without NUMA, and link weights from a small palette (ties are common).
Each GPU gets a random replica count; some replicas are already handed out
(not in A, so their GPU carries load); must-include is random; k = 1..min(8, |A|).
The answer must be the oracle's set: equal on the spec's criteria 1-4 and
on the fixed rule (smallest sorted positions).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.policies import get_policy
from allocator.policies.replicas import replica_criteria
from allocator.request import AllocationError, AllocationRequest
from allocator.subdevices import InheritedWeights, physical_id, replica_graph, replica_id, split_replica_id
from allocator.topology import DeviceGraph

from alloc_testlib import WEIGHT_VALUES, graph, nvswitch
from sharing_testlib import (
    by_counts,
    by_subsets,
    check_against,
    chosen_key,
    gpu_sets,
    replica_key,
    replicas_of,
    requests,
)

POLICY = get_policy("replicas")


@st.composite
def small_cases(draw: st.DrawFn) -> tuple[DeviceGraph, AllocationRequest]:
    gpus = draw(gpu_sets())
    counts = draw(st.lists(st.integers(0, 3), min_size=len(gpus.ids), max_size=len(gpus.ids)))
    # Keep the subset brute force small: at most 12 replicas in all.
    budget = 12
    capped = []
    for c in counts:
        capped.append(min(c, budget))
        budget -= capped[-1]
    if not any(capped):
        capped[0] = 1
    g = replicas_of(gpus, capped)
    return g, draw(requests(g))


@st.composite
def big_cases(draw: st.DrawFn, max_gpus: int = 8, max_replicas: int = 10) -> tuple[DeviceGraph, AllocationRequest]:
    gpus = draw(gpu_sets(max_gpus))
    counts = draw(st.lists(st.integers(0, max_replicas), min_size=len(gpus.ids), max_size=len(gpus.ids)))
    if not any(counts):
        counts[0] = max_replicas
    g = replicas_of(gpus, counts)
    return g, draw(requests(g))


def check(g: DeviceGraph, req: AllocationRequest, oracle) -> None:
    check_against(POLICY, g, req, oracle, replica_key)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=small_cases())
def test_matches_subset_brute_force(case: tuple[DeviceGraph, AllocationRequest]) -> None:
    check(*case, by_subsets)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=big_cases())
def test_matches_count_brute_force_up_to_8x10(case: tuple[DeviceGraph, AllocationRequest]) -> None:
    check(*case, by_counts)


@st.composite
def sixteen_by_four(draw: st.DrawFn) -> tuple[DeviceGraph, AllocationRequest]:
    """16 GPUs x 4 replicas on two or four NUMA nodes (a few without NUMA), partial loads."""
    nodes = draw(st.sampled_from([2, 4]))
    numa = [None if draw(st.integers(0, 7)) == 0 else i * nodes // 16 for i in range(16)]
    palette = draw(st.lists(st.sampled_from(WEIGHT_VALUES), min_size=1, max_size=3))
    links = {(a, b): draw(st.sampled_from(palette)) for a in range(16) for b in range(a + 1, 16)}
    g = replica_graph(graph(16, links, numa), 4)
    return g, draw(requests(g, max_k=6))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=sixteen_by_four())
def test_matches_count_brute_force_16x4(case: tuple[DeviceGraph, AllocationRequest]) -> None:
    check(*case, by_counts)


@pytest.mark.parametrize("k", [7, 8])
def test_16x4_large_k_matches_count_brute_force(k: int) -> None:
    """k = 7 and 8 on 16 x 4 (more count vectors, so a few fixed seeds rather than hypothesis)."""
    for seed in range(2):
        rng = random.Random(seed * 10 + k)
        numa = [i // 8 for i in range(16)]
        links = {(a, b): rng.choice((20, 40, 600)) for a in range(16) for b in range(a + 1, 16)}
        g = replica_graph(graph(16, links, numa), 4)
        avail = [i for i in g.ids if rng.random() < 0.7]
        must = rng.sample(avail, 2)
        check(g, AllocationRequest.of(avail, must, k), by_counts)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=small_cases())
def test_oracles_agree(case: tuple[DeviceGraph, AllocationRequest]) -> None:
    """The count-vector oracle equals the literal subset oracle (see sharing_testlib's proof)."""
    g, req = case
    assert by_counts(g, req, replica_key) == by_subsets(g, req, replica_key)


@settings(max_examples=60, deadline=None)
@given(case=small_cases(), data=st.data())
def test_criteria_function_is_the_spec(case: tuple[DeviceGraph, AllocationRequest], data: st.DataObject) -> None:
    """`replica_criteria` (reported in answers) computes the same numbers as the oracle's key."""
    g, req = case
    chosen = data.draw(st.lists(st.sampled_from(req.available), min_size=1, unique=True))
    assert replica_criteria(g, req.available, chosen) == chosen_key(g, req, chosen, replica_key)


# -- the spec's behaviour, by example ------------------------------------------------------------
G8 = nvswitch(8)  # NV18 everywhere, GPUs 0-3 on NUMA 0, 4-7 on NUMA 1
R8 = replica_graph(G8, 10)


def test_ids_numa_and_weights_of_a_replica_graph() -> None:
    assert len(R8.ids) == 80 and R8.ids[:2] == ("GPU0::0", "GPU0::1") and R8.ids[-1] == "GPU7::9"
    assert R8.parent_ids == G8.ids
    pos = R8.index_of()
    assert R8.numa[pos["GPU5::3"]] == 1
    assert R8.weights[pos["GPU0::1"]][pos["GPU0::2"]] == 0  # two replicas of one GPU: no link
    assert R8.weights[pos["GPU0::1"]][pos["GPU3::2"]] == 1800
    assert split_replica_id("GPU-1c2e::7") == ("GPU-1c2e", 7) and split_replica_id("GPU-1c2e") is None
    assert replica_id("3", 1) == "3::1" and physical_id("3::1") == "3" and physical_id("GPU0") == "GPU0"


def test_replicas_read_their_gpus_links_exactly_without_a_replica_table() -> None:
    """Every pair weight of a replica graph is its GPUs' link (0 within one GPU), read from the GPUs' table."""
    rng = random.Random(7)
    links = {(a, b): rng.choice(WEIGHT_VALUES) for a in range(6) for b in range(a + 1, 6)}
    gpus = graph(6, links, [0, 0, 1, 1, None, 1])
    r = replica_graph(gpus, {"GPU0": 3, "GPU2": 2, "GPU3": 1, "GPU4": 4, "GPU5": 2})
    at = gpus.index_of()
    table = [[0 if physical_id(a) == physical_id(b) else gpus.weights[at[physical_id(a)]][at[physical_id(b)]]
              for b in r.ids] for a in r.ids]
    assert [list(row) for row in r.weights] == table  # row by row, as scoring reads it
    assert all(r.weights[i][j] == table[i][j] for i in range(len(table)) for j in range(len(table)))
    assert r.weights == table and len(r.weights) == len(r.ids) == 12
    # What the graph holds: one GPU per replica and the 5 x 5 table of the shared GPUs, nothing per pair.
    assert isinstance(r.weights, InheritedWeights) and len(r.weights.parent_weights) == 5
    assert r.weights.parents == r.parents


def test_the_largest_replica_count_builds_linearly_and_answers_exactly() -> None:
    """8 GPUs x 3,125 replicas (the bound): 25,000 replicas over an 8 x 8 table; the spec's rules still hold."""
    big = replica_graph(G8, 3125)
    assert len(big.ids) == 25_000 and len(big.weights.parent_weights) == 8
    taken = {replica_id("GPU1", r) for r in range(3000)} | {replica_id("GPU6", 0)}
    avail = [i for i in big.ids if i not in taken]
    a = POLICY.allocate(big, AllocationRequest.of(avail, [], 4))
    # NUMA 0 carries GPU1's 3,000 handed-out replicas, NUMA 1 only GPU6's one: the four GPUs of node 1
    assert a.parents == ("GPU4", "GPU5", "GPU6", "GPU7") and a.optimal
    assert a.ids == ("GPU4::0", "GPU5::0", "GPU6::1", "GPU7::0")
    assert a.criteria == (1, -4, 1, -6 * 1800)


def test_per_gpu_replica_counts_and_unknown_gpu() -> None:
    g = replica_graph(G8, {"GPU1": 2, "GPU6": 3})
    assert g.ids == ("GPU1::0", "GPU1::1", "GPU6::0", "GPU6::1", "GPU6::2")
    assert g.parent_ids == ("GPU1", "GPU6") and g.numa == (0, 0, 1, 1, 1)
    with pytest.raises(ValueError, match="GPU9"):
        replica_graph(G8, {"GPU9": 2})
    with pytest.raises(ValueError, match="-1"):
        replica_graph(G8, -1)


def test_distinct_gpus_before_replicas_of_one() -> None:
    """Four replicas come from four GPUs of one NUMA node, never two of one GPU."""
    a = POLICY.allocate(R8, AllocationRequest.of(R8.ids, [], 4))
    assert a.parents == ("GPU0", "GPU1", "GPU2", "GPU3") and a.span == 1
    assert a.ids == ("GPU0::0", "GPU1::0", "GPU2::0", "GPU3::0")


def test_least_loaded_gpus_first() -> None:
    """GPU2 and GPU5 have replicas handed out; a 3-replica request avoids the loaded GPU of its node."""
    taken = {"GPU2::0", "GPU2::1", "GPU5::0"}
    avail = [i for i in R8.ids if i not in taken]
    a = POLICY.allocate(R8, AllocationRequest.of(avail, [], 3))
    assert a.parents == ("GPU0", "GPU1", "GPU3")
    a = POLICY.allocate(R8, AllocationRequest.of(avail, [], 4))
    # Four GPUs of one node must include a loaded one: NUMA 1's GPU5 (load 1) beats GPU2 (load 2).
    assert a.parents == ("GPU4", "GPU5", "GPU6", "GPU7")


def test_links_decide_between_equally_loaded_gpus() -> None:
    """DGX-1-like PCIe box on one node: two replicas go to the NVLinked pair, not to a PIX pair."""
    g = graph(4, {(0, 1): "PIX", (2, 3): "NV2", (0, 2): "SYS", (1, 3): "SYS"}, [0, 0, 0, 0], default="NODE")
    r = replica_graph(g, 2)
    a = POLICY.allocate(r, AllocationRequest.of(r.ids, [], 2))
    assert a.parents == ("GPU2", "GPU3") and a.score == 200


def test_more_replicas_than_gpus_spread_then_fill_least_loaded() -> None:
    # GPU0 carries 3 handed-out replicas, every GPU of NUMA 1 carries one: node 0 has the least
    # load (3 + 0 + 0 + 0 against 4 x 1 + 2 extras on loaded GPUs).
    taken = {"GPU0::0", "GPU0::1", "GPU0::2", "GPU4::0", "GPU5::0", "GPU6::0", "GPU7::0"}
    avail = [i for i in R8.ids if i not in taken]
    a = POLICY.allocate(R8, AllocationRequest.of(avail, [], 6))
    assert a.parents == ("GPU0", "GPU1", "GPU2", "GPU3")
    # The two replicas beyond one per GPU go to unloaded GPUs (GPU1, lowest positions), not GPU0.
    assert a.ids == ("GPU0::3", "GPU1::0", "GPU1::1", "GPU1::2", "GPU2::0", "GPU3::0")
    assert a.criteria == (1, -4, 3, -6 * 1800)


def test_must_include_is_honoured_even_across_nodes() -> None:
    must = ["GPU7::4", "GPU7::5"]
    a = POLICY.allocate(R8, AllocationRequest.of(R8.ids, must, 3))
    assert set(must) <= set(a.ids) and a.parents == ("GPU4", "GPU7") and a.span == 1


def test_answer_does_not_depend_on_the_order_of_available() -> None:
    rng = random.Random(5)
    avail = [i for i in R8.ids if rng.random() < 0.6]
    want = POLICY.allocate(R8, AllocationRequest.of(avail, [], 5)).ids
    for _ in range(5):
        rng.shuffle(avail)
        assert POLICY.allocate(R8, AllocationRequest.of(avail, [], 5)).ids == want


def test_a_graph_without_parents_treats_each_device_as_its_own_gpu() -> None:
    """Misconfigured (plain GPU graph): still valid, span first, then W like numa-first."""
    a = POLICY.allocate(G8, AllocationRequest.of(G8.ids, [], 2))
    assert a.ids == ("GPU0", "GPU1") and a.parents == ("GPU0", "GPU1")


BAD = [
    ("size zero", ["GPU0::0", "GPU0::1"], [], 0, ["0"]),
    ("size above available", ["GPU0::0", "GPU0::1"], [], 3, ["3", "2"]),
    ("must above size", ["GPU0::0", "GPU1::0", "GPU2::0"], ["GPU0::0", "GPU1::0"], 1, ["2", "1"]),
    ("must not available", ["GPU0::0", "GPU0::1"], ["GPU2::0"], 1, ["GPU2::0"]),
    ("repeated available", ["GPU0::0", "GPU0::0"], [], 1, ["GPU0::0"]),
    ("unknown replica", ["GPU0::0", "GPU0::10"], [], 1, ["GPU0::10"]),
    ("a GPU ID is not a replica", ["GPU0::0", "GPU0"], [], 1, ["GPU0"]),
]


@pytest.mark.parametrize("policy", ["replicas", "mig"])
@pytest.mark.parametrize("name,available,must,size,words", BAD, ids=[b[0] for b in BAD])
def test_bad_request_is_rejected_like_every_policy(policy: str, name: str, available: list[str], must: list[str],
                                                   size: int, words: list[str]) -> None:
    req = AllocationRequest.of(available, must, size)
    with pytest.raises(AllocationError) as err:
        get_policy(policy).allocate(R8, req)
    for word in words:
        assert word in str(err.value), (name, str(err.value))
    # Same message as the request's own validation, the one every policy uses.
    with pytest.raises(AllocationError) as again:
        req.validate(R8)
    assert str(again.value) == str(err.value)


def test_proven_optimal_at_8x10_and_16x4_under_the_default_budget() -> None:
    """At most `exact_limit` GPUs: no deadline applies, so the answer is always proven."""
    r16 = replica_graph(nvswitch(16), 4)
    for g in (R8, r16):
        for k in range(1, 9):
            assert POLICY.allocate(g, AllocationRequest.of(g.ids, [], k)).optimal


def test_tiny_budget_above_the_exact_range_is_valid_and_says_not_optimal() -> None:
    rng = random.Random(3)
    links = {(a, b): rng.choice((10, 20, 100, 200)) for a in range(20) for b in range(a + 1, 20)}
    g = replica_graph(graph(20, links, [i % 2 for i in range(20)]), 2)
    req = AllocationRequest.of(g.ids, [], 4)
    rushed = get_policy("replicas", time_budget_s=1e-9).allocate(g, req)
    assert len(rushed.ids) == 4 and set(rushed.ids) <= set(g.ids)
    assert rushed.optimal is False
    exact = get_policy("replicas", time_budget_s=None).allocate(g, req)
    assert exact.optimal is True
    assert exact.ids == by_counts(g, req, replica_key)[1]
