"""MIG devices: the `mig` policy against brute-force oracles and the spec's examples.

Nodes: GPU sets from the shared topology fixtures and generated ones (several
NUMA nodes, some GPUs without), each GPU with 0..7 MIG devices of the
resource; some already in use (not in A); random must-include; k = 1..min(8, |A|).
The answer must be the oracle's set: equal on criteria 1-3 (our reading of
"fewest free first", see `allocator.policies.mig`) and on the fixed rule.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.policies import get_policy
from allocator.policies.mig import mig_criteria, smallest_counts
from allocator.request import AllocationRequest
from allocator.subdevices import child_graph
from allocator.topology import DeviceGraph

from alloc_testlib import graph, nvswitch
from sharing_testlib import by_counts, by_subsets, check_against, chosen_key, gpu_sets, mig_key, migs_of, requests

POLICY = get_policy("mig")


@st.composite
def cases(draw: st.DrawFn, max_per_gpu: int = 7, max_total: int | None = None) -> tuple[DeviceGraph, AllocationRequest]:
    gpus = draw(gpu_sets())
    counts = draw(st.lists(st.integers(0, max_per_gpu), min_size=len(gpus.ids), max_size=len(gpus.ids)))
    if max_total is not None:
        left = max_total
        for j, c in enumerate(counts):
            counts[j] = min(c, left)
            left -= counts[j]
    if not any(counts):
        counts[0] = 1
    g = migs_of(gpus, counts)
    return g, draw(requests(g))


def check(g: DeviceGraph, req: AllocationRequest, oracle) -> None:
    assert check_against(POLICY, g, req, oracle, mig_key).score == 0  # MIG devices have no links


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(max_per_gpu=4, max_total=12))
def test_matches_subset_brute_force(case: tuple[DeviceGraph, AllocationRequest]) -> None:
    check(*case, by_subsets)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_matches_count_brute_force_up_to_8x7(case: tuple[DeviceGraph, AllocationRequest]) -> None:
    check(*case, by_counts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(max_per_gpu=4, max_total=12))
def test_oracles_agree(case: tuple[DeviceGraph, AllocationRequest]) -> None:
    g, req = case
    assert by_counts(g, req, mig_key) == by_subsets(g, req, mig_key)


@settings(max_examples=60, deadline=None)
@given(case=cases(max_per_gpu=4, max_total=12), data=st.data())
def test_criteria_function_is_the_spec(case: tuple[DeviceGraph, AllocationRequest], data: st.DataObject) -> None:
    g, req = case
    chosen = data.draw(st.lists(st.sampled_from(req.available), min_size=1, unique=True))
    assert mig_criteria(g, req.available, chosen) == chosen_key(g, req, chosen, mig_key)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(1, 7), min_size=1, max_size=8), data=st.data())
def test_smallest_counts_is_the_lexicographic_minimum(values: list[int], data: st.DataObject) -> None:
    import itertools

    e = data.draw(st.integers(1, len(values)))
    need = data.draw(st.integers(1, sum(sorted(values)[-e:])))
    want = min(tuple(sorted(c)) for c in itertools.combinations(values, e) if sum(c) >= need)
    assert tuple(smallest_counts(values, e, need)) == want


# -- the spec's behaviour, by example ------------------------------------------------------------
G8 = nvswitch(8)  # GPUs 0-3 on NUMA 0, 4-7 on NUMA 1


def a100_mixed() -> DeviceGraph:
    """8 A100s, 7 x 1g.10gb each: the issue's 8 x 7 = 56 devices."""
    return migs_of(G8, [7] * 8)


def test_mig_graph_has_parents_numa_and_no_links() -> None:
    g = a100_mixed()
    assert len(g.ids) == 56 and g.parent_ids == G8.ids
    assert g.numa[g.index_of()["MIG-GPU6-2"]] == 1
    assert all(w == 0 for row in g.weights for w in row)
    with pytest.raises(ValueError, match="GPU9"):
        child_graph(G8, [("MIG-x", "GPU9")])
    with pytest.raises(ValueError, match="twice"):
        child_graph(G8, [("MIG-x", "GPU0"), ("MIG-x", "GPU1")])


def test_one_gpu_when_it_fits() -> None:
    g = a100_mixed()
    a = POLICY.allocate(g, AllocationRequest.of(g.ids, [], 5))
    assert a.parents == ("GPU0",) and a.ids == tuple(f"MIG-GPU0-{j}" for j in range(5))


def test_best_fit_prefers_the_fullest_gpu_that_fits() -> None:
    """GPU1 has 2 free, GPU2 has 3: a 2-device request takes GPU1 and keeps GPU2 and the rest."""
    g = a100_mixed()
    in_use = {f"MIG-GPU1-{j}" for j in range(5)} | {f"MIG-GPU2-{j}" for j in range(4)}
    avail = [i for i in g.ids if i not in in_use]
    a = POLICY.allocate(g, AllocationRequest.of(avail, [], 2))
    assert a.parents == ("GPU1",)
    a = POLICY.allocate(g, AllocationRequest.of(avail, [], 3))
    assert a.parents == ("GPU2",)


def test_fewest_free_first_is_lexicographic_not_a_sum() -> None:
    """Free counts {1, 4, 4, 6} on one node, k = 7: {1, 6} fills both GPUs; {4, 4} would sum lower."""
    gpus = graph(4, {}, [0, 0, 0, 0])
    g = migs_of(gpus, [1, 4, 4, 6])
    a = POLICY.allocate(g, AllocationRequest.of(g.ids, [], 7))
    assert a.parents == ("GPU0", "GPU3") and a.criteria == (1, 2, (1, 6), 1 + 36)


def test_fill_the_fullest_chosen_gpu_first() -> None:
    """Free {2, 3}, k = 4: both GPUs are needed; the 2-free GPU gives both, the other two."""
    g = migs_of(graph(2, {}, [0, 0]), [2, 3])
    a = POLICY.allocate(g, AllocationRequest.of(g.ids, [], 4))
    assert a.ids == ("MIG-GPU0-0", "MIG-GPU0-1", "MIG-GPU1-0", "MIG-GPU1-1")


def test_span_before_parent_count() -> None:
    """Two GPUs of NUMA 0 beat one GPU on another node when must-include pins NUMA 0."""
    g = migs_of(G8, [2, 2, 0, 0, 7, 0, 0, 0])
    a = POLICY.allocate(g, AllocationRequest.of(g.ids, ["MIG-GPU0-0"], 4))
    assert a.parents == ("GPU0", "GPU1") and a.span == 1


def test_must_include_and_order_independence() -> None:
    g = a100_mixed()
    rng = random.Random(11)
    avail = [i for i in g.ids if rng.random() < 0.5]
    must = rng.sample(avail, 2)
    want = POLICY.allocate(g, AllocationRequest.of(avail, must, 6))
    assert set(must) <= set(want.ids)
    for _ in range(4):
        rng.shuffle(avail)
        assert POLICY.allocate(g, AllocationRequest.of(avail, list(reversed(must)), 6)).ids == want.ids


def test_8x7_is_proven_optimal_under_the_default_budget() -> None:
    g = a100_mixed()
    for k in range(1, 9):
        assert POLICY.allocate(g, AllocationRequest.of(g.ids, [], k)).optimal


def test_tiny_budget_above_the_exact_range_is_valid_and_says_not_optimal() -> None:
    gpus = graph(20, {}, [i % 4 for i in range(20)])
    g = migs_of(gpus, [3] * 20)
    req = AllocationRequest.of(g.ids, [], 4)
    rushed = get_policy("mig", time_budget_s=1e-9).allocate(g, req)
    assert len(rushed.ids) == 4 and rushed.optimal is False
    exact = get_policy("mig", time_budget_s=None).allocate(g, req)
    assert exact.optimal is True and exact.ids == by_counts(g, req, mig_key)[1]
