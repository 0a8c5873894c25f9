"""NIC policies: span first, then most (spread) or fewest (packed) ports, must-include honoured.

The node: two sockets. Socket 0 has one dual-port card (ports pfA, pfB, two
VFs each); socket 1 has port pfC (two VFs) and a single-function NIC pfD; and
one NIC reports neither NUMA nor port (its own port, no span).
"""

from __future__ import annotations

import pytest

from allocator.policies import get_policy
from allocator.request import AllocationRequest
from allocator.scoring import port_count, span

from alloc_testlib import graph

PORTS = ["pfA", "pfA", "pfB", "pfB", "pfC", "pfC", "pfD", None]
NUMA = [0, 0, 0, 0, 1, 1, 1, None]


def _links() -> dict[tuple[int, int], str]:
    links = {}
    for a in range(8):
        for b in range(a + 1, 8):
            if NUMA[a] is None or NUMA[b] is None or NUMA[a] != NUMA[b]:
                links[(a, b)] = "SYS"
            elif PORTS[a] == PORTS[b] or (a < 4 and b < 4):
                links[(a, b)] = "PIX"  # same port, or the two ports of one card
            else:
                links[(a, b)] = "NODE"
    return links


G = graph(8, _links(), NUMA, ports=PORTS, prefix="nic")


def nics(*indices: int) -> list[str]:
    return [f"nic{i}" for i in indices]


CASES = [
    # (name, policy, available, must, size, expected IDs)
    ("spread two ports of a card", "spread", [0, 1, 2, 3], [], 2, (0, 2)),
    ("packed one port", "packed", [0, 1, 2, 3], [], 2, (0, 1)),
    ("spread around must", "spread", [0, 1, 2, 3], [1], 2, (1, 2)),
    ("packed around must", "packed", [0, 1, 2, 3], [2], 2, (2, 3)),
    ("packed fills the must ports first", "packed", [0, 1, 2, 3], [0, 2], 3, (0, 1, 2)),
    # Span first: socket 1 + the NUMA-less NIC gives three ports without a second socket.
    ("spread never widens span for ports", "spread", [0, 4, 5, 6, 7], [], 3, (4, 6, 7)),
    ("packed keeps span too", "packed", [0, 4, 5, 6], [], 2, (4, 5)),
    # Must nic5 pins socket 1; spread adds the other port there (pfD, NODE beats SYS to nic7).
    ("must pins the socket", "spread", list(range(8)), [5], 2, (5, 6)),
]


@pytest.mark.parametrize("name,policy,available,must,size,expected", CASES, ids=[c[0] for c in CASES])
def test_nic_table(name: str, policy: str, available: list[int], must: list[int], size: int,
                   expected: tuple[int, ...]) -> None:
    req = AllocationRequest.of(nics(*available), nics(*must), size)
    a = get_policy(policy).allocate(G, req)
    assert a.ids == tuple(nics(*expected))
    assert a.optimal


@pytest.mark.parametrize("policy", ["spread", "packed"])
@pytest.mark.parametrize("must", [[0], [5], [7], [0, 3], [4, 6]])
def test_must_include_always_honoured(policy: str, must: list[int]) -> None:
    req = AllocationRequest.of(nics(*range(8)), nics(*must), 3)
    a = get_policy(policy).allocate(G, req)
    assert set(nics(*must)) <= set(a.ids)
    assert a.span == span(G, a.ids)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_spread_and_packed_port_counts(size: int) -> None:
    """On socket 0 alone (2 ports x 2 VFs): spread uses min(size, 2) ports, packed ceil(size/2)."""
    req = AllocationRequest.of(nics(0, 1, 2, 3), [], size)
    assert port_count(G, get_policy("spread").allocate(G, req).ids) == min(size, 2)
    assert port_count(G, get_policy("packed").allocate(G, req).ids) == (size + 1) // 2


def test_device_without_port_is_its_own_port() -> None:
    """A NIC with no port never shares one: spread happily adds it, packed avoids it."""
    req = AllocationRequest.of(nics(4, 5, 7), [], 2)
    assert get_policy("spread").allocate(G, req).ids == tuple(nics(4, 7))
    assert get_policy("packed").allocate(G, req).ids == tuple(nics(4, 5))


def test_nic_policies_without_any_ports() -> None:
    """A graph with no port information (all own ports) still gets valid, span-first answers."""
    g = graph(6, {}, [0, 0, 0, 1, 1, 1], prefix="nic")
    for policy in ("spread", "packed"):
        a = get_policy(policy).allocate(g, AllocationRequest.of(g.ids, [], 3))
        assert a.span == 1 and len(a.ids) == 3
