"""Exact answers by table look-up on small resources: every subset's numbers, computed once per graph.

Why: on a node of at most `TABLE_MAX_DEVICES` devices there are at most 2^16 subsets, and
what the plain (unpaired) policies rank a set by depends only on the set and on what it
leaves behind: span(S), ports(S), W(S) and W(A\\S). Tables of span, ports and W over every
subset (as a bitmask), folded into one table of keys per policy order, make one candidate
cost two look-ups, so a request that has few candidate sets C(|free|, size - |must|) (an
8-GPU node: at most 70) is answered by scanning them all, with no set-up per request, and
exactly: every candidate is ranked by the policy's whole order (DGX-1, 8 free, size 4: about
30 us against about 400 us for the branch and bound, `benchmarks/subset_tables_bench.py`).

The tie rule (the lexicographically smallest sorted tuple of positions) is folded into the
key: position i is bit `n - 1 - i` of a mask, so among sets of one size the one whose
sorted positions are smallest is the one with the largest mask (the first position where
two sets differ is the highest bit where their masks differ). Each policy's criteria are
packed into one integer above those n bits (each criterion's range is bounded by `w_bound`,
`span_bound` or n + 1, so a later one never outweighs an earlier one), and the best set is
simply the largest key.

Memory, per subset: W and W shifted for the key (8 bytes each), span and ports (1 byte each;
ports only where devices have ports: NICs), and the keys of each policy order used (8 bytes):
about 1.6 MB for 16 devices, 6 KB for 8. Built in about 2^n list operations (16 devices: tens of ms, once per
topology) where the resource is built (`SubsetTableCache.prepare`) or else by the first request; kept
for the graph, and for graphs of the same contents (a resource rebuilt after a health change), up to
`KEEP` topologies.

Where they are kept: in a `SubsetTableCache`, an object of whoever owns the topology (the daemon
owns one for all its resources and hands it to the resource build and to its policies); a policy
given none keeps its own (`SearchPolicy.tables`). No module state: two daemons in one process, or
two tests, share nothing.
"""

from __future__ import annotations

import threading
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from ..topology import DeviceGraph

#: Largest resource (devices) that gets tables: 2^16 subsets, about 1.6 MB.
TABLE_MAX_DEVICES = 16
#: Most candidate sets one request may scan; above it the branch and bound answers (it prunes,
#: the scan does not). A candidate costs about 0.25 us, so 1,024 sets cost about what the search
#: costs for such requests on 16 devices: about where the scan stops being the cheaper one
#: (`benchmarks/subset_tables_bench.py`).
TABLE_MAX_SETS = 1024

#: Orders the tables know: the unpaired objectives of `scoring.objective_key`.
ORDERS = ("numa-first", "link-first", "spread", "packed")


@dataclass(frozen=True)
class SubsetTables:
    """span, W and ports of every subset of one graph's devices (module doc)."""

    n: int
    #: bit[i]: the bit of graph position i (1 << (n - 1 - i)).
    bit: tuple[int, ...]
    #: W(S) by mask.
    score: Sequence[int]
    #: span(S) by mask (distinct known NUMA nodes).
    span: Sequence[int]
    #: Distinct ports by mask; None when no device has a port (then it is the set's size).
    ports: Sequence[int] | None
    #: W of all devices + 1: bounds every W(S) and W(A\S) (weights are not negative).
    w_bound: int
    #: Distinct known NUMA nodes + 1: bounds every span.
    span_bound: int
    #: left[m] = W(m) << n: the W(A\S) term of a key, with A \ S as the mask.
    left: Sequence[int]
    #: The graph's IDs (the tables are shared by graphs of the same contents, IDs included) and each one's bit.
    ids: tuple[str, ...]
    bit_of: dict[str, int]
    _keys: dict[str, Sequence[int]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, graph: DeviceGraph) -> SubsetTables:
        n = len(graph.ids)
        w = graph.weights
        lo_n = n // 2
        hi_n = n - lo_n
        # Mask bit b is position n - 1 - b; the low half holds positions lo_pos, the high half hi_pos.
        lo_pos = [n - 1 - b for b in range(lo_n)]
        hi_pos = [n - 1 - b for b in range(lo_n, n)]
        w_lo = _half_scores(w, lo_pos)
        w_hi = _half_scores(w, hi_pos)
        # cross[h][l]: the weights between the devices of high half h and low half l, one row per h.
        reach = [_row_sums(w[i], lo_pos) for i in hi_pos]
        cross: list[list[int]] = [[0] * (1 << lo_n)]
        for h in range(1, 1 << hi_n):
            low = (h & -h).bit_length() - 1
            prev, add = cross[h & (h - 1)], reach[low]
            cross.append([a + b for a, b in zip(prev, add)])
        score = array("q")
        for h in range(1 << hi_n):
            base = w_hi[h]
            score.extend([a + c + base for a, c in zip(w_lo, cross[h])])

        nodes = sorted({x for x in graph.numa if x is not None})
        node_bit = {x: 1 << k for k, x in enumerate(nodes)}
        numa_bits = [node_bit[x] if x is not None else 0 for x in graph.numa]
        span = _union_counts(numa_bits, lo_pos, hi_pos, "B")

        ports = None
        if graph.ports and any(p is not None for p in graph.ports):
            # A device without a port is a port of its own (`scoring.port_key`).
            keys = [f"port:{p}" if p is not None else f"id:{graph.ids[i]}" for i, p in enumerate(graph.ports)]
            port_index = {k: b for b, k in enumerate(dict.fromkeys(keys))}
            ports = _union_counts([1 << port_index[k] for k in keys], lo_pos, hi_pos, "B")

        return cls(n=n, bit=tuple(1 << (n - 1 - i) for i in range(n)), score=score, span=span, ports=ports,
                   w_bound=score[-1] + 1 if n else 1, span_bound=len(nodes) + 1,
                   left=_compact([x << n for x in score]), ids=graph.ids,
                   bit_of={d: 1 << (n - 1 - i) for i, d in enumerate(graph.ids)})

    def members(self, mask: int) -> tuple[str, ...]:
        """The IDs of `mask`, in graph order."""
        return tuple(d for d, b in zip(self.ids, self.bit) if mask & b)

    def keys(self, order: str) -> Sequence[int]:
        """keys[m] = (the criteria of `order` that depend on the set alone, packed) << n, plus m.

        Built on first use per order (2^n operations; `prepare` builds it ahead) and kept. W(A\\S),
        which depends on the request, is added per candidate from `left`.
        """
        got = self._keys.get(order)
        if got is not None:
            return got
        n = self.n
        sp, sc = self.span, self.score
        wb, nb, pb = self.w_bound, self.span_bound, n + 1
        full = range(1 << n)
        if order == "numa-first":  # span, then W(S)
            packed = [((wb * (sc[m] - wb * sp[m])) << n) + m for m in full]
        elif order == "link-first":  # W(S), then span
            packed = [((wb * (nb * sc[m] - sp[m])) << n) + m for m in full]
        elif order in ("spread", "packed"):  # span, then most (spread) / fewest ports, then W(S)
            sign = 1 if order == "spread" else -1
            pt = self.ports if self.ports is not None else [m.bit_count() for m in full]
            packed = [((wb * (wb * (sign * pt[m] - pb * sp[m]) + sc[m])) << n) + m for m in full]
        else:
            raise ValueError(f"no subset order {order!r}: expected one of {', '.join(ORDERS)}")
        got = _compact(packed)
        self._keys[order] = got
        return got

    def best(self, order: str, must: int, free: Sequence[int], picks: int) -> int:
        """The mask of the best set: `must` plus `picks` of the single-bit masks `free`, by `order`,
        ties to the lowest positions (the largest mask). Needs 0 < picks <= len(free)."""
        keys, left = self.keys(order), self.left
        # A \ S = (must + free) - (must + x) = all_free - x.
        all_free = sum(free)
        if must:
            key = max([keys[must + x] + left[all_free - x] for x in map(sum, combinations(free, picks))])
        else:
            key = max([keys[x] + left[all_free - x] for x in map(sum, combinations(free, picks))])
        return key & ((1 << self.n) - 1)


def _compact(values: list[int]) -> Sequence[int]:
    """An 8-byte-per-entry array when every value fits, else the list itself."""
    if not values or (-(1 << 63) <= min(values) and max(values) < (1 << 63)):
        return array("q", values)
    return values


def _row_sums(row: Sequence[int], positions: list[int]) -> list[int]:
    """out[mask] = sum of row[positions[b]] over the bits b of mask."""
    out = [0]
    for i in positions:
        v = row[i]
        out.extend([x + v for x in out])  # the masks with this bit: those without it, plus v
    return out


def _half_scores(w: Sequence[Sequence[int]], positions: list[int]) -> list[int]:
    """W of every subset of `positions` (bit b = positions[b])."""
    out = [0]
    for b, i in enumerate(positions):
        gain = _row_sums(w[i], positions[:b])
        out.extend([x + g for x, g in zip(out, gain)])
    return out


def _union_counts(bits: list[int], lo_pos: list[int], hi_pos: list[int], code: str) -> array[int]:
    """Distinct bits among the `bits` of a mask's positions, for every mask (split in two halves)."""
    def unions(positions: list[int]) -> list[int]:
        out = [0]
        for i in positions:
            v = bits[i]
            out.extend([x | v for x in out])
        return out

    lo, hi = unions(lo_pos), unions(hi_pos)
    table = array(code)
    for h in hi:
        table.extend([(a | h).bit_count() for a in lo])
    return table


#: Distinct topologies whose tables a cache keeps (a node has a GPU resource and a NIC pool or two).
KEEP = 8
#: Largest pair weight the tables take: W of 16 devices (120 pairs) then fits 8 bytes with room.
_MAX_WEIGHT = 1 << 40


class SubsetTableCache:
    """The subset tables of one owner's graphs (module doc), safe to share between threads.

    Kept by graph object (the look-up a request makes) and by graph contents (a rebuilt resource,
    e.g. after a health change, gets a new graph with the same devices and links: its tables are
    reused), for the last `keep` distinct topologies.

    The by-object index is a tuple of (weak reference, tables) pairs matched by identity: no `id()`
    keys (an id is reused once its graph is gone), no weakref callbacks (one could run during a
    garbage collection inside the locked section and deadlock on the lock); entries whose graph is
    gone are dropped whenever an entry is added. Readers scan the tuple without the lock: it is
    replaced whole, never changed in place, and a node has a few graphs at a time.
    """

    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self._by_graph: tuple[tuple[weakref.ref[DeviceGraph], SubsetTables | None], ...] = ()
        self._by_contents: OrderedDict[tuple[Any, ...], SubsetTables | None] = OrderedDict()
        self._lock = threading.Lock()

    def tables(self, graph: DeviceGraph) -> SubsetTables | None:
        """The tables of `graph` (built on first call, then kept); None above `TABLE_MAX_DEVICES`
        devices or with a weight outside 0.._MAX_WEIGHT (then the search answers)."""
        if len(graph.ids) > TABLE_MAX_DEVICES:
            return None
        for ref, kept in self._by_graph:
            if ref() is graph:
                return kept
        contents = (graph.ids, graph.numa, graph.ports, tuple(tuple(row) for row in graph.weights))
        with self._lock:
            known = contents in self._by_contents
            tables = self._by_contents.get(contents)
        if not known:
            # Negative weights would break the bounds the keys are packed with, and W is kept in 8 bytes:
            # the spec's links (10..100 x NVLinks) are far inside both limits.
            odd = any(v < 0 or v >= _MAX_WEIGHT for row in graph.weights for v in row)
            tables = None if odd else SubsetTables.build(graph)
        with self._lock:
            self._by_contents[contents] = tables
            self._by_contents.move_to_end(contents)
            while len(self._by_contents) > self.keep:
                self._by_contents.popitem(last=False)
            live = tuple(entry for entry in self._by_graph if (g := entry[0]()) is not None and g is not graph)
            self._by_graph = (*live, (weakref.ref(graph), tables))
        return tables

    def prepare(self, graph: DeviceGraph, order: str | None) -> None:
        """Build `graph`'s tables and `order`'s keys now (where the resource is built, off the RPC path),
        so that no request pays for them; nothing for a large graph or no order."""
        if order is None:
            return
        tables = self.tables(graph)
        if tables is not None:
            tables.keys(order)
