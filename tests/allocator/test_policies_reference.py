"""Every policy against the brute-force reference on random graphs (hypothesis).

Graphs have up to 12 devices, random NUMA nodes (some unknown), random link
weights from the spec's values (so ties are frequent), random ports for the
NIC policies, random availability and must-include. The answer must tie the
reference on every criterion, and since both apply the same fixed rule
(lowest sorted positions) it must in fact be the very same set.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.policies import POLICY_NAMES, decompose, get_policy
from allocator.request import AllocationRequest
from allocator.topology import DeviceGraph

from alloc_testlib import WEIGHT_VALUES, brute_force, criteria, graph, ids

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def cases(draw: st.DrawFn, max_n: int = 12) -> tuple[DeviceGraph, AllocationRequest]:
    n = draw(st.integers(1, max_n))
    nodes = draw(st.integers(1, 4))
    numa = draw(st.lists(st.one_of(st.none(), st.integers(0, nodes - 1)), min_size=n, max_size=n))
    # A small palette per graph makes ties (and twins) common, as on real nodes.
    palette = draw(st.lists(st.sampled_from(WEIGHT_VALUES), min_size=1, max_size=4))
    links = {(a, b): draw(st.sampled_from(palette)) for a in range(n) for b in range(a + 1, n)}
    n_ports = draw(st.integers(0, 3))
    ports = None
    if n_ports:
        ports = draw(st.lists(st.one_of(st.none(), st.sampled_from([f"pf{i}" for i in range(n_ports)])),
                              min_size=n, max_size=n))
    g = graph(n, links, numa, ports=ports, prefix="D")
    avail = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    k = draw(st.integers(1, len(avail)))
    must = draw(st.lists(st.sampled_from(avail), max_size=min(k, 3), unique=True))
    return g, AllocationRequest.of(ids(g, avail), ids(g, must), k)


def check(g: DeviceGraph, req: AllocationRequest, policy: str) -> None:
    got = get_policy(policy).allocate(g, req)
    ref = brute_force(g, policy, req)
    assert criteria(g, policy, req, got.ids) == criteria(g, policy, req, ref)
    assert got.ids == ref
    assert got.optimal
    assert got.policy == policy


@contextlib.contextmanager
def single_search() -> Iterator[None]:
    """Force the one-constrained-search path (no NUMA decomposition)."""
    old = decompose.MAX_PARTS
    decompose.MAX_PARTS = 0
    try:
        yield
    finally:
        decompose.MAX_PARTS = old


@pytest.mark.parametrize("policy", POLICY_NAMES)
@SETTINGS
@given(case=cases())
def test_matches_brute_force(policy: str, case: tuple[DeviceGraph, AllocationRequest]) -> None:
    check(*case, policy)


@pytest.mark.parametrize("policy", POLICY_NAMES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(max_n=10))
def test_single_constrained_search_matches_brute_force(policy: str, case: tuple[DeviceGraph, AllocationRequest]) -> None:
    """The fallback used when a request has too many NUMA node sets is exact too."""
    with single_search():
        check(*case, policy)


@pytest.mark.parametrize("seed", range(8))
def test_dense_random_graphs_at_twelve(seed: int) -> None:
    """Fixed, harder cases at the top of the brute-force range: 12 devices, mid-size requests."""
    rng = random.Random(seed)
    n = 12
    numa = [None if rng.random() < 0.15 else rng.randrange(2) for _ in range(n)]
    links = {(a, b): rng.choice(WEIGHT_VALUES) for a in range(n) for b in range(a + 1, n)}
    g = graph(n, links, numa)
    k = rng.randint(3, 8)
    must = rng.sample(range(n), rng.randint(0, 2))
    req = AllocationRequest.of(g.ids, ids(g, must), k)
    for policy in ("numa-first", "link-first"):
        check(g, req, policy)


@pytest.mark.parametrize("policy", POLICY_NAMES)
@settings(max_examples=40, deadline=None)
@given(case=cases(max_n=10), seed=st.integers(0, 2**16))
def test_deterministic_and_order_independent(policy: str, case: tuple[DeviceGraph, AllocationRequest],
                                             seed: int) -> None:
    """Same request twice -> same answer; shuffling available/must_include -> same answer."""
    g, req = case
    p = get_policy(policy)
    first = p.allocate(g, req)
    assert p.allocate(g, req) == first
    rng = random.Random(seed)
    shuffled = AllocationRequest.of(rng.sample(req.available, len(req.available)),
                                    rng.sample(req.must_include, len(req.must_include)), req.size)
    again = get_policy(policy).allocate(g, shuffled)
    assert again.ids == first.ids
    assert (again.span, again.score, again.left_score) == (first.span, first.score, first.left_score)


@pytest.mark.parametrize("policy", POLICY_NAMES)
@settings(max_examples=40, deadline=None)
@given(case=cases(max_n=10))
def test_answer_is_well_formed(policy: str, case: tuple[DeviceGraph, AllocationRequest]) -> None:
    """Exactly k distinct IDs, all available, all must-include present, IDs in graph order,
    and the reported numbers are the set's numbers."""
    g, req = case
    a = get_policy(policy).allocate(g, req)
    assert len(a.ids) == req.size == len(set(a.ids))
    assert set(a.ids) <= set(req.available)
    assert set(req.must_include) <= set(a.ids)
    pos = g.index_of()
    assert list(a.ids) == sorted(a.ids, key=pos.__getitem__)
    from allocator.scoring import evaluate

    ev = evaluate(g, req.available, a.ids)
    assert (a.span, a.score, a.left_score) == (ev.span, ev.score, ev.left_score)
