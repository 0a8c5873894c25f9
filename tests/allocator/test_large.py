"""Above 16 candidates: always a valid answer, and `optimal` tells the truth.

No test here asserts a timing; budgets are only chosen so that the outcome
(proven or not) does not depend on the machine.
"""

from __future__ import annotations

import random

import pytest

from allocator.policies import get_policy
from allocator.request import Allocation, AllocationRequest
from allocator.topology import DeviceGraph

from alloc_testlib import WEIGHT_VALUES, graph, ids, nvswitch


def assert_valid(a: Allocation, req: AllocationRequest) -> None:
    assert len(a.ids) == req.size == len(set(a.ids))
    assert set(a.ids) <= set(req.available)
    assert set(req.must_include) <= set(a.ids)


def random_big(seed: int, n: int) -> DeviceGraph:
    rng = random.Random(seed)
    numa = [None if rng.random() < 0.1 else rng.randrange(4) for _ in range(n)]
    links = {(a, b): rng.choice(WEIGHT_VALUES) for a in range(n) for b in range(a + 1, n)}
    return graph(n, links, numa)


@pytest.mark.parametrize("policy", ["numa-first", "link-first", "spread", "packed"])
@pytest.mark.parametrize("k", [1, 5, 17, 32, 47, 63])
def test_tiny_budget_on_64_devices_is_valid(policy: str, k: int) -> None:
    """A budget far too small to prove anything: the answer is still exactly k valid IDs."""
    g = random_big(k, 64)
    rng = random.Random(k)
    must = rng.sample(range(64), min(k, 3))
    req = AllocationRequest.of(g.ids, ids(g, must), k)
    a = get_policy(policy, time_budget_s=1e-6).allocate(g, req)
    assert_valid(a, req)
    assert a.policy == policy


def test_tiny_budget_reports_not_optimal() -> None:
    """When the budget runs out before the search ends, the answer says so."""
    g = random_big(7, 64)
    req = AllocationRequest.of(g.ids, [], 24)
    a = get_policy("link-first", time_budget_s=1e-6).allocate(g, req)
    assert_valid(a, req)
    assert a.optimal is False


def test_no_budget_means_exact() -> None:
    """time_budget_s=None disables the budget: the search runs to the end and says optimal."""
    g = random_big(3, 20)
    req = AllocationRequest.of(g.ids, [], 6)
    a = get_policy("numa-first", time_budget_s=None).allocate(g, req)
    assert a.optimal is True


@pytest.mark.parametrize("k", [1, 3, 8, 16, 17, 24, 31])
def test_nvswitch_32_is_proven_optimal(k: int) -> None:
    """All GPUs of a NUMA node are interchangeable on NVSwitch, so the search collapses to a few
    classes and proves optimality well within a generous budget."""
    g = nvswitch(32)
    req = AllocationRequest.of(g.ids, [], k)
    a = get_policy("numa-first", time_budget_s=5.0).allocate(g, req)
    assert a.optimal is True
    assert_valid(a, req)
    # Lowest positions of the fewest NUMA nodes.
    assert a.ids == g.ids[:k]
    assert a.span == (1 if k <= 16 else 2)


def test_nvswitch_64_with_must_include_is_proven_optimal() -> None:
    g = nvswitch(64, numa_nodes=2)
    req = AllocationRequest.of(g.ids, ["GPU40", "GPU63"], 8)
    a = get_policy("numa-first", time_budget_s=5.0).allocate(g, req)
    assert a.optimal is True
    assert a.ids == ("GPU32", "GPU33", "GPU34", "GPU35", "GPU36", "GPU37", "GPU40", "GPU63")


@pytest.mark.parametrize("k", [2, 4, 8])
def test_exact_limit_zero_with_generous_budget_still_exact(k: int) -> None:
    """With the budget applying to every size, a generous budget still proves optimality (and
    gives the same answer as the unbounded search) on a 20-device random node."""
    g = random_big(11, 20)
    req = AllocationRequest.of(g.ids, [], k)
    bounded = get_policy("numa-first", exact_limit=0, time_budget_s=30.0).allocate(g, req)
    exact = get_policy("numa-first", time_budget_s=None).allocate(g, req)
    assert bounded.optimal is True
    assert bounded.ids == exact.ids


def test_sixteen_candidates_ignore_the_budget() -> None:
    """Up to 16 candidates the spec wants the exact optimum whatever the budget."""
    g = random_big(5, 16)
    req = AllocationRequest.of(g.ids, [], 8)
    a = get_policy("link-first", time_budget_s=1e-9).allocate(g, req)
    assert a.optimal is True
    assert a.ids == get_policy("link-first", time_budget_s=None).allocate(g, req).ids
