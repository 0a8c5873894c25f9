"""The table scan (`subsets`) gives exactly the search's answer, ties included, on small resources.

Up to `TABLE_MAX_DEVICES` devices the plain policies answer a request with few candidate sets by
scanning every one in precomputed tables instead of running the branch and bound. The scan is
compared with the search it replaces (the same policy with the scan switched off) on every
resource of every built-in node that it serves (8- and 16-GPU nodes, their NIC pools) and on
random 16-device nodes with ties and ports, over random availability, must-include and sizes:
the same set, span, W(S), W(A\\S), proven optimal. A share of the cases is also checked against
the brute-force reading of the spec.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from allocator.policies import POLICY_NAMES, get_policy
from allocator.policies.base import SearchPolicy
from allocator.policies.subsets import TABLE_MAX_DEVICES, TABLE_MAX_SETS, SubsetTableCache, SubsetTables
from allocator.request import AllocationError, AllocationRequest
from allocator.topology import DeviceGraph
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.simulated import builtin_names, load_simulated

from alloc_testlib import brute_force, random_graph, request


def searching(name: str) -> SearchPolicy:
    """Policy `name` with the table scan switched off: what answered every request before it."""
    cls = type(get_policy(name))
    plain = dataclass(frozen=True)(type(f"Searching{cls.__name__}", (cls,), {"subset_order": None}))
    return plain()


def small_resources() -> list[tuple[str, str, DeviceGraph]]:
    """(node, resource, graph) of every built-in resource the tables serve (whole GPUs and NIC pools)."""
    out = []
    for node in builtin_names():
        for r in build_resources(load_simulated(node), ResourceOptions(device_id_strategy="index")):
            if r.policy in POLICY_NAMES and 2 <= len(r.graph.ids) <= TABLE_MAX_DEVICES:
                out.append((node, r.name, r.graph))
    return out


SMALL = small_resources()


def random_requests(rng: random.Random, g: DeviceGraph, count: int) -> list[AllocationRequest]:
    """Requests the scan answers (at most TABLE_MAX_SETS candidates), all sizes, with and without must-include."""
    n = len(g.ids)
    out: list[AllocationRequest] = []
    while len(out) < count:
        available = sorted(rng.sample(range(n), rng.randint(2, n)))
        size = rng.randint(1, len(available))
        must = sorted(rng.sample(available, rng.randint(0, min(size, 3)) if rng.random() < 0.4 else 0))
        if math.comb(len(available) - len(must), size - len(must)) <= TABLE_MAX_SETS:
            out.append(request(g, available, must, size))
    return out


def same_answer(g: DeviceGraph, name: str, req: AllocationRequest) -> tuple[str, ...]:
    table = get_policy(name).allocate(g, req)
    search = searching(name).allocate(g, req)
    assert (table.ids, table.span, table.score, table.left_score, table.optimal) == \
        (search.ids, search.span, search.score, search.left_score, search.optimal), (name, req)
    return table.ids


def test_the_built_in_nodes_include_8_and_16_gpu_resources():
    sizes = {len(g.ids) for node, name, g in SMALL if name == "nvidia.com/gpu"}
    assert {8, 16} <= sizes, SMALL


@pytest.mark.parametrize(("node", "resource", "g"), SMALL, ids=[f"{n}:{r}" for n, r, _ in SMALL])
def test_on_built_in_nodes_the_scan_is_the_search(node, resource, g):
    rng = random.Random(f"{node}:{resource}")
    names = ("numa-first", "link-first") if resource == "nvidia.com/gpu" else POLICY_NAMES
    for k, req in enumerate(random_requests(rng, g, 60)):
        for name in names:
            got = same_answer(g, name, req)
            if k % 6 == 0:
                assert got == brute_force(g, name, req), (name, req)


@pytest.mark.parametrize("seed", range(12))
def test_on_random_16_device_nodes_with_ties_and_ports_the_scan_is_the_search(seed):
    rng = random.Random(seed)
    g = random_graph(rng, 16, numa_nodes=rng.randint(1, 4), ports=rng.randint(0, 5))
    for k, req in enumerate(random_requests(rng, g, 12)):
        for name in POLICY_NAMES:
            got = same_answer(g, name, req)
            if k % 4 == 0:
                assert got == brute_force(g, name, req), (name, req)


def test_all_free_every_size_on_a_dgx1_matches_the_search():
    g = next(g for node, r, g in SMALL if node == "dgx-1-v100" and r == "nvidia.com/gpu")
    for size in range(1, 9):
        req = request(g, range(8), [], size)
        for name in ("numa-first", "link-first"):
            assert same_answer(g, name, req) == brute_force(g, name, req)


def test_a_request_with_more_candidate_sets_than_the_scan_takes_is_searched_with_the_same_answer():
    g = random_graph(random.Random(7), 16)
    req = request(g, range(16), [], 8)  # C(16, 8) = 12,870 sets
    assert math.comb(16, 8) > TABLE_MAX_SETS
    got = get_policy("numa-first").allocate(g, req)
    assert got.explored != math.comb(16, 8)  # branch and bound nodes, not a scan
    assert got.ids == searching("numa-first").allocate(g, req).ids


def test_bad_requests_are_refused_before_the_scan_with_the_usual_message():
    g = next(g for node, r, g in SMALL if node == "dgx-1-v100" and r == "nvidia.com/gpu")
    with pytest.raises(AllocationError, match="must_include_deviceIDs not in available_deviceIDs: 7"):
        get_policy("numa-first").allocate(g, AllocationRequest.of(["0", "1"], ["7"], 1))
    with pytest.raises(AllocationError, match="available_deviceIDs repeats IDs: 1"):
        get_policy("numa-first").allocate(g, AllocationRequest.of(["0", "1", "1"], [], 1))


def test_tables_are_built_once_per_topology_and_not_above_the_device_limit():
    g = random_graph(random.Random(3), 12)
    same = DeviceGraph(g.ids, g.numa, tuple(tuple(r) for r in g.weights), g.ports)  # a rebuilt resource
    cache = SubsetTableCache()
    assert cache.tables(g) is cache.tables(g) is cache.tables(same)
    assert cache.tables(random_graph(random.Random(3), TABLE_MAX_DEVICES + 1)) is None
    assert SubsetTableCache().tables(g) is not cache.tables(g)  # caches share nothing: no module state


def test_resources_come_with_their_tables_so_no_request_builds_them(monkeypatch):
    built: list[DeviceGraph] = []
    real = SubsetTables.build.__func__
    monkeypatch.setattr(SubsetTables, "build", classmethod(lambda cls, g: built.append(g) or real(cls, g)))
    # The daemon's way: one cache, filled by the resource build, read by the resources' policies.
    tables = SubsetTableCache()
    resources = build_resources(load_simulated("dgx-2-v100"), ResourceOptions(device_id_strategy="uuid"), tables)
    gpu = next(r for r in resources if r.name == "nvidia.com/gpu")
    assert [g.ids for g in built if g.ids == gpu.graph.ids], "the resource build made the tables"
    built.clear()
    got = get_policy(gpu.policy, tables=tables).allocate(gpu.graph, request(gpu.graph, range(16), [], 2))
    assert got.explored == math.comb(16, 2) and got.optimal  # scanned ...
    assert built == [] and gpu.policy in tables.tables(gpu.graph)._keys  # ... with what was built ahead


def test_a_policy_without_a_cache_keeps_its_own_and_answers_the_same():
    g = random_graph(random.Random(5), 12)
    req = request(g, range(12), [], 4)
    shared = SubsetTableCache()
    own = get_policy("numa-first")
    assert own.allocate(g, req) == get_policy("numa-first", tables=shared).allocate(g, req)
    assert own.within(0.5).tables is own.tables  # a budget cut keeps the policy's tables


def test_graphs_made_and_dropped_one_after_another_each_get_their_own_tables():
    # Rebuilt resources come and go; a new graph may reuse a dropped one's memory (its id), and must
    # still get the tables of its own devices, never those of the graph that was there before.
    cache = SubsetTableCache()
    for seed in range(40):
        g = random_graph(random.Random(seed), 6 + seed % 5)
        got = cache.tables(g)
        assert got is not None and got.ids == g.ids
        assert got.score[(1 << got.n) - 1] == sum(g.weights[i][j] for i in range(got.n) for j in range(i + 1, got.n))
        del g, got
