"""Oracles and node generators for the replica and MIG policies.

The criteria here are written from the spec's words, independently of the
policies' code: `replica_key` and `mig_key` read only `DeviceGraph` fields.

Two brute forces, both returning the smallest (criteria, sorted positions):

- `by_subsets` scores every k-subset of A that contains M: the spec read
  literally, for small A.
- `by_counts` scores every count vector x (x_g devices from parent g, with
  |M_g| <= x_g <= |A_g| and sum x_g = k) through one set per vector: M plus the
  lowest-position free devices of each parent. It equals `by_subsets`:
  (1) every criterion of both objectives depends on S only through x(S): span
  through the NUMA nodes of the parents with x_g > 0 (all children of a
  parent share its node), |parents| is #{x_g > 0}, the load/free sums are
  sum x_g * c_g with per-parent constants, W(parents) and the sorted free
  counts depend on {g: x_g > 0}; (2) among the sets with one x, the chosen
  one is element-wise smallest once sorted (swapping a free device of g for
  a lower unchosen free device of g keeps x and lowers the sorted tuple), so
  it is the lexicographically smallest. Hence the minimum over x of
  (criteria(x), that set) is the minimum over all S. `test_oracles_agree`
  also checks this on random small cases.
"""

from __future__ import annotations

import itertools
import os
import pathlib
from collections.abc import Callable, Iterator, Sequence

from hypothesis import strategies as st

from allocator.request import Allocation, AllocationRequest, Policy
from allocator.subdevices import child_graph, replica_graph
from allocator.topology import DeviceGraph

from alloc_testlib import WEIGHT_VALUES, graph

Key = tuple
Oracle = Callable[[DeviceGraph, AllocationRequest], tuple[Key, tuple[str, ...]]]

ROOT = pathlib.Path(__file__).resolve().parents[2]


def shared_topology_files() -> list[pathlib.Path]:
    """The shared `nvidia-smi topo -m` fixtures (../shared/topologies, or $TOPO_DP_SHARED_DIR/topologies).

    Fails (never skips) when they are missing: the allocator tests need them.
    """
    base = pathlib.Path(os.environ.get("TOPO_DP_SHARED_DIR") or ROOT.parent / "shared")
    files = sorted((base / "topologies").glob("*.txt"))
    if not files:
        raise AssertionError(f"no topology fixtures under {base / 'topologies'}: the checkout needs ../shared "
                             "beside it, or TOPO_DP_SHARED_DIR pointing at a copy")
    return files


def gpu_graph_of(path: pathlib.Path) -> DeviceGraph:
    """The GPU graph of a shared topology, through the project's simulated-node loader."""
    from plugin.sources.simulated import load_simulated

    top = load_simulated(str(path))
    return DeviceGraph.from_topology(top, top.gpus)


# -- the spec's criteria, written from its words ------------------------------------------
def _parents(g: DeviceGraph) -> tuple[list[int], int]:
    if g.parents:
        return list(g.parents), len(g.parent_ids)
    return list(range(len(g.ids))), len(g.ids)


def replica_key(g: DeviceGraph, available: Sequence[int], chosen: Sequence[int]) -> Key:
    """1 span, 2 most distinct GPUs, 3 least sum of load(parent(s)), 4 most W(parents(S))."""
    return replica_scorer(g, available)(chosen)


def replica_scorer(g: DeviceGraph, available: Sequence[int]) -> Callable[[Sequence[int]], Key]:
    """`replica_key` for one (graph, A), with the per-GPU loads computed once."""
    parent, n = _parents(g)
    advertised = [parent.count(p) for p in range(n)]
    in_a = [0] * n
    for i in available:
        in_a[parent[i]] += 1

    def key(chosen: Sequence[int]) -> Key:
        rep = {parent[i]: i for i in chosen}
        gpus = sorted(rep)
        span = len({g.numa[i] for i in chosen if g.numa[i] is not None})
        load = sum(advertised[parent[i]] - in_a[parent[i]] for i in chosen)
        w = sum(g.weights[rep[a]][rep[b]] for a, b in itertools.combinations(gpus, 2))
        return (span, -len(gpus), load, -w)

    return key


def mig_key(g: DeviceGraph, available: Sequence[int], chosen: Sequence[int]) -> Key:
    """1 span, 2 fewest GPUs, 3a fewest-free GPUs first (sorted free counts), 3b sum of free(parent(s))."""
    return mig_scorer(g, available)(chosen)


def mig_scorer(g: DeviceGraph, available: Sequence[int]) -> Callable[[Sequence[int]], Key]:
    """`mig_key` for one (graph, A), with the per-GPU free counts computed once."""
    parent, n = _parents(g)
    free = [0] * n
    for i in available:
        free[parent[i]] += 1

    def key(chosen: Sequence[int]) -> Key:
        gpus = {parent[i] for i in chosen}
        span = len({g.numa[i] for i in chosen if g.numa[i] is not None})
        return (span, len(gpus), tuple(sorted(free[p] for p in gpus)), sum(free[parent[i]] for i in chosen))

    return key


SCORERS = {replica_key: replica_scorer, mig_key: mig_scorer}


# -- brute forces -------------------------------------------------------------------------------
def _positions(g: DeviceGraph, req: AllocationRequest) -> tuple[list[int], list[int]]:
    pos = g.index_of()
    return sorted(pos[i] for i in req.available), sorted(pos[i] for i in req.must_include)


def by_subsets(g: DeviceGraph, req: AllocationRequest, key: Callable) -> tuple[Key, tuple[str, ...]]:
    avail, must = _positions(g, req)
    rest = [i for i in avail if i not in set(must)]
    score = SCORERS[key](g, avail)
    best = None
    for combo in itertools.combinations(rest, req.size - len(must)):
        s = tuple(sorted([*must, *combo]))
        cand = (score(s), s)
        if best is None or cand < best:
            best = cand
    assert best is not None
    return best[0], tuple(g.ids[i] for i in best[1])


def count_vectors(lo: Sequence[int], hi: Sequence[int], total: int) -> Iterator[list[int]]:
    """Every x with lo <= x <= hi element-wise and sum(x) == total."""
    n = len(lo)
    room_after = [0] * (n + 1)
    for j in range(n - 1, -1, -1):
        room_after[j] = room_after[j + 1] + hi[j]
    x = [0] * n

    def rec(j: int, left: int) -> Iterator[list[int]]:
        if j == n:
            if left == 0:
                yield x
            return
        for v in range(max(lo[j], left - room_after[j + 1]), min(hi[j], left) + 1):
            x[j] = v
            yield from rec(j + 1, left - v)

    return rec(0, total)


def by_counts(g: DeviceGraph, req: AllocationRequest, key: Callable) -> tuple[Key, tuple[str, ...]]:
    avail, must = _positions(g, req)
    parent, n = _parents(g)
    must_set = set(must)
    must_of = [[i for i in must if parent[i] == p] for p in range(n)]
    free_of = [[i for i in avail if parent[i] == p and i not in must_set] for p in range(n)]
    lo = [len(m) for m in must_of]
    hi = [len(m) + len(f) for m, f in zip(must_of, free_of)]
    score = SCORERS[key](g, avail)
    best = None
    for x in count_vectors(lo, hi, req.size):
        s = tuple(sorted(i for p in range(n) for i in (*must_of[p], *free_of[p][:x[p] - lo[p]])))
        cand = (score(s), s)
        if best is None or cand < best:
            best = cand
    assert best is not None
    return best[0], tuple(g.ids[i] for i in best[1])


def check_against(policy: Policy, g: DeviceGraph, req: AllocationRequest, oracle: Callable, key: Callable) -> Allocation:
    """The policy's answer is the oracle's set, proven optimal, well-formed, with the oracle's criteria."""
    got = policy.allocate(g, req)
    best, ref = oracle(g, req, key)
    assert chosen_key(g, req, got.ids, key) == best
    assert got.ids == ref
    assert got.optimal
    assert got.criteria == best
    assert set(req.must_include) <= set(got.ids) <= set(req.available) and len(got.ids) == req.size
    return got


def chosen_key(g: DeviceGraph, req: AllocationRequest, ids: Sequence[str], key: Callable) -> Key:
    avail, _ = _positions(g, req)
    pos = g.index_of()
    return key(g, avail, sorted(pos[i] for i in ids))


# -- resources ----------------------------------------------------------------------------------
def replicas_of(gpus: DeviceGraph, counts: Sequence[int]) -> DeviceGraph:
    """A replica graph with `counts[i]` replicas of GPU i (0: not shared)."""
    return replica_graph(gpus, {gid: c for gid, c in zip(gpus.ids, counts)})


def migs_of(gpus: DeviceGraph, counts: Sequence[int]) -> DeviceGraph:
    """A MIG graph with `counts[i]` devices on GPU i, named `MIG-<gpu>-<j>`."""
    return child_graph(gpus, [(f"MIG-{gid}-{j}", gid) for gid, c in zip(gpus.ids, counts) for j in range(c)])


# -- hypothesis strategies ------------------------------------------------------------------------
_SHARED: list[DeviceGraph] = []


def shared_gpu_graphs() -> list[DeviceGraph]:
    """The GPU graphs of all shared topology fixtures (loaded once)."""
    if not _SHARED:
        _SHARED.extend(gpu_graph_of(p) for p in shared_topology_files())
    return _SHARED


@st.composite
def gpu_sets(draw: st.DrawFn, max_gpus: int = 8) -> DeviceGraph:
    """A shared topology's GPUs, or generated ones (several NUMA nodes, some without)."""
    if draw(st.booleans()):
        return draw(st.sampled_from(shared_gpu_graphs()))
    n = draw(st.integers(1, max_gpus))
    nodes = draw(st.integers(1, 4))
    numa = draw(st.lists(st.one_of(st.none(), st.integers(0, nodes - 1)), min_size=n, max_size=n))
    palette = draw(st.lists(st.sampled_from(WEIGHT_VALUES), min_size=1, max_size=3))
    links = {(a, b): draw(st.sampled_from(palette)) for a in range(n) for b in range(a + 1, n)}
    return graph(n, links, numa)


@st.composite
def requests(draw: st.DrawFn, g: DeviceGraph, max_k: int = 8) -> AllocationRequest:
    """Some replicas handed out (not in A), random must-include, k = 1..min(max_k, |A|)."""
    ids = list(g.ids)
    avail = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=len(ids), unique=True))
    k = draw(st.integers(1, min(max_k, len(avail))))
    must = draw(st.lists(st.sampled_from(avail), max_size=min(k, 3), unique=True))
    return AllocationRequest.of(avail, must, k)
