"""The pairing weight X(S, P) and the partners a request gets.

X is the weight of a maximum-weight one-to-one matching; `Matching` grows it
one device at a time and undoes steps (the search depends on both). Checked
against brute force over every matching, and against a second exact method
(a DP over subsets of the columns) on larger matrices.
"""

from __future__ import annotations

import functools
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.pairing import NO_PARTNERS, Matching, PairingIndex, Partners, pair_label, pair_weight, pairing_weight
from allocator.topology import Device, DeviceKind, Link, NodeTopology

#: 0 = not a GPU–NIC pair; then the spec's PCIe weights (and an NVLink weight, to be general).
PALETTE = (0, 0, 10, 20, 30, 40, 50, 200)


def all_matchings_weight(rows: list[list[int]], cols: int) -> int:
    """Brute force: every injective partial assignment of rows to columns."""
    best = 0
    n = len(rows)
    for r in range(0, min(n, cols) + 1):
        for rs in itertools.combinations(range(n), r):
            for cs in itertools.permutations(range(cols), r):
                best = max(best, sum(rows[i][j] for i, j in zip(rs, cs)))
    return best


def dp_weight(rows: list[list[int]], cols: int) -> int:
    """Exact DP over subsets of used columns (a different method, for larger matrices)."""
    @functools.lru_cache(maxsize=None)
    def f(i: int, used: int) -> int:
        if i == len(rows):
            return 0
        best = f(i + 1, used)
        for j in range(cols):
            if not used >> j & 1 and rows[i][j]:
                best = max(best, rows[i][j] + f(i + 1, used | 1 << j))
        return best
    return f(0, 0)


def matrices(max_rows: int, max_cols: int) -> st.SearchStrategy[tuple[list[list[int]], int]]:
    return st.integers(0, max_cols).flatmap(
        lambda c: st.tuples(st.lists(st.lists(st.sampled_from(PALETTE), min_size=c, max_size=c),
                                     max_size=max_rows), st.just(c)))


def grown(rows: list[list[int]], cols: int) -> Matching:
    m = Matching(cols)
    for r in rows:
        m.push(r)
    return m


def check_pairs(m: Matching, rows: list[list[int]]) -> None:
    """The reported pairs are a matching (one-to-one), of positive pairs, whose weight is the total."""
    pairs = m.pairs()
    assert len({i for i, _ in pairs}) == len(pairs) == len({j for _, j in pairs})
    assert all(rows[i][j] > 0 for i, j in pairs)
    assert sum(rows[i][j] for i, j in pairs) == m.total


@settings(max_examples=300, deadline=None)
@given(case=matrices(6, 6))
def test_matches_brute_force_over_all_matchings(case: tuple[list[list[int]], int]) -> None:
    rows, cols = case
    m = grown(rows, cols)
    assert m.total == all_matchings_weight(rows, cols)
    assert pairing_weight(rows, cols) == m.total
    check_pairs(m, rows)


@settings(max_examples=150, deadline=None)
@given(case=matrices(16, 9))
def test_matches_subset_dp_up_to_sixteen_rows(case: tuple[list[list[int]], int]) -> None:
    rows, cols = case
    m = grown(rows, cols)
    assert m.total == dp_weight(rows, cols)
    check_pairs(m, rows)


@settings(max_examples=150, deadline=None)
@given(case=matrices(10, 7), ops=st.lists(st.booleans(), max_size=40))
def test_push_pop_keeps_the_optimum_of_what_is_left(case: tuple[list[list[int]], int], ops: list[bool]) -> None:
    """Any interleaving of push (True) and pop (False): after each step the total is the optimum
    of the rows present, as the search relies on when it backtracks."""
    rows, cols = case
    if not rows:
        return
    m = Matching(cols)
    present: list[list[int]] = []
    k = 0
    for push in ops:
        if push:
            r = rows[k % len(rows)]
            k += 1
            before = m.total
            gain = m.push(r)
            present.append(r)
            assert gain == m.total - before >= 0
        elif present:
            m.pop()
            present.pop()
        assert m.total == dp_weight(present, cols)
        check_pairs(m, present)


@settings(max_examples=200, deadline=None)
@given(case=matrices(9, 7))
def test_duals_are_optimal_and_row_optimal(case: tuple[list[list[int]], int]) -> None:
    """The dual gives the linear bound the search uses: feasible, optimal, and each row's u is its
    marginal value (so leaving rows out lowers the bound as much as any optimal dual can)."""
    rows, cols = case
    m = grown(rows, cols)
    u, v = m.duals()
    assert min(u, default=0) >= 0 and min(v, default=0) >= 0
    assert all(u[i] + v[j] >= rows[i][j] for i in range(len(rows)) for j in range(cols))
    assert sum(u) + sum(v) == m.total
    for i in range(len(rows)):
        assert u[i] == m.total - dp_weight(rows[:i] + rows[i + 1:], cols)


def test_one_to_one_not_greedy() -> None:
    """Two GPUs want the same PIX NIC: the matching gives it to one and the other NIC to the other."""
    # rows: GPUs; columns: NIC a (PIX to both), NIC b (PXB to GPU0 only)
    assert pairing_weight([[50, 40], [50, 0]]) == 90
    # Greedy on the largest weight first would give GPU0 -> a (50) and leave GPU1 alone.
    assert pairing_weight([[50, 10], [50, 0], [50, 0]]) == 60


def test_empty_sides() -> None:
    assert pairing_weight([]) == 0
    assert pairing_weight([[], []], 0) == 0
    assert pairing_weight([[0, 0]]) == 0


# -- pair weights between devices ---------------------------------------------
def _node() -> NodeTopology:
    devs = [
        Device("GPU0", DeviceKind.GPU, 0, 0), Device("GPU1", DeviceKind.GPU, 1, 0),
        Device("GPU2", DeviceKind.GPU, 2, 1),
        Device("nic0", DeviceKind.NIC, 0, 0, port="pf0"), Device("nic1", DeviceKind.NIC, 1, 1, port="pf1"),
        Device("nic2", DeviceKind.NIC, 2, None, port="pf2"),
    ]
    links = [("GPU0", "GPU1", Link.parse("NV4")), ("GPU0", "nic0", Link.parse("PIX")),
             ("GPU1", "nic0", Link.parse("PXB")), ("GPU2", "nic1", Link.parse("PIX")),
             ("nic0", "nic1", Link.parse("PIX"))]
    return NodeTopology.build(devs, links, source="test")


def test_pair_weight_counts_only_gpu_nic_pairs() -> None:
    t = _node()
    d = {x.name: x for x in t.devices}
    assert pair_weight(t, d["GPU0"], d["nic0"]) == 50
    assert pair_weight(t, d["nic0"], d["GPU1"]) == 40
    assert pair_weight(t, d["GPU0"], d["nic1"]) == 10  # SYS: unlisted pair
    assert pair_weight(t, d["GPU0"], d["GPU1"]) == 0  # NV4, but two GPUs
    assert pair_weight(t, d["nic0"], d["nic1"]) == 0  # PIX, but two NICs


@pytest.mark.parametrize("weight,label", [(50, "PIX"), (40, "PXB"), (30, "PHB"), (20, "NODE"), (10, "SYS"),
                                          (200, "NV2"), (0, "0")])
def test_pair_label(weight: int, label: str) -> None:
    assert pair_label(weight) == label


class _M:
    def __init__(self, id: str, device: Device, numa: int | None):
        self.id, self.device, self.numa = id, device, numa


def _index() -> PairingIndex:
    t = _node()
    gpus = [_M(str(d.index), d, d.numa) for d in t.gpus]
    nics = [_M(d.name, d, d.numa) for d in t.nics]
    return PairingIndex.build(t, {"nvidia.com/gpu": gpus, "example.com/nic": nics})


def test_partners_of_a_nic_request() -> None:
    idx = _index()
    p = idx.partners("example.com/nic", {"nvidia.com/gpu": ["0", "2"]})
    assert p.ids == ("nvidia.com/gpu=0", "nvidia.com/gpu=2")
    assert p.numa == (0, 1)
    assert p.row("nic0") == (50, 10)
    assert p.row("nic1") == (10, 50)
    assert p.row("nic2") == (10, 10)


def test_unknown_partners_are_ignored() -> None:
    """Stale IDs, unknown resources, the requesting resource itself and repeats never fail a request."""
    idx = _index()
    p = idx.partners("nvidia.com/gpu", {
        "example.com/nic": ["nic1", "gone", "nic1"],
        "nvidia.com/gpu": ["0"],
        "other.com/fpga": ["x"],
    })
    assert p.ids == ("example.com/nic=nic1",)
    assert p.row("2") == (50,)
    assert idx.partners("nvidia.com/gpu", {"example.com/nic": ["gone"]}) is NO_PARTNERS
    assert idx.partners("unknown/resource", {"example.com/nic": ["nic0"]}) is NO_PARTNERS
    assert not idx.partners("nvidia.com/gpu", {})


def test_partners_shape_is_checked() -> None:
    with pytest.raises(ValueError, match="NUMA"):
        Partners(("a",), ())
    with pytest.raises(ValueError, match="weights"):
        Partners(("a",), (0,), {"x": (1, 2)})
