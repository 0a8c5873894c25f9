"""GPU–NIC pairing across resources: the pairing weight X(S, P) and the partners of a request.

Why a module of its own: the spec ("One container, several resources: pairing
GPUs with NICs", `shared/spec/allocation.md`) ranks the devices S of one
resource by how well they pair with the devices P another resource of the
same container already got. That needs (1) the weight of a maximum-weight
one-to-one matching between S and P, counting only GPU–NIC pairs, and (2) the
cross-resource link weights, which no single `DeviceGraph` holds.

(2) is `PairingIndex`: built from the `NodeTopology` once per topology (next to
the resources, never inside an RPC); per request it only looks weights up to
make a small immutable `Partners` value that travels in the
`AllocationRequest`. Partners it does not know are ignored, never an error:
pairing is a preference.

(1) is `Matching`, an exact max-weight bipartite matching grown one device
at a time (successive longest augmenting paths, i.e. the Hungarian method's
augmentation step). Why not a library: `scipy.optimize.linear_sum_assignment`
is exact and fast but brings ~40 MB of scipy + numpy into the image, and
networkx's `max_weight_matching` is general-graph blossom code in pure Python,
far slower than this for 16 x 16. And neither is incremental: the search adds
and removes one device per step, and `Matching.push`/`pop` keep the optimum
with one augmenting path per step instead of re-solving; nor gives the
dual solution (`Matching.duals`) the search's bound is built from. A bitmask DP over the
smaller side would be ~|S| * 2^|P| * |P| per evaluation (tens of thousands of
Python steps at |P| = 8). It is checked against brute force over all
matchings in `tests/allocator/test_pairing_weight.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from .topology import Device, DeviceKind, LinkLevel, NodeTopology

#: Below every reachable path gain (weights are small non-negative integers).
_UNREACHED = -(1 << 62)


def pair_weight(topology: NodeTopology, a: Device, b: Device) -> int:
    """The pairing weight of two devices: their link weight for a GPU–NIC pair, else 0.

    Only GPU–NIC pairs count (the spec: each GPU wants a NIC of its own). The
    weight is the spec's link weight (`PIX` 50 ... `SYS` 10); `NV<n>` does not
    occur between a GPU and a NIC, but if a topology said so it would weigh
    100 x n like any NVLink pair, which is what the spec's table defines.

    GPU–NIC complexes (Grace, ConnectX-8 Data Direct, NICs on CPU root ports):
    a GPU and a NIC of one complex weigh `PIX` whatever their PCIe path, because
    there the platform, not the path, says which NIC is the GPU's. This is the
    one place the rule lives: `PairingIndex`, `discover` and `explain` all read
    pairing weights from here, so a node without complexes keeps its answers.
    """
    if {a.kind, b.kind} != {DeviceKind.GPU, DeviceKind.NIC}:
        return 0
    if a.complex is not None and a.complex == b.complex:
        return int(LinkLevel.PIX)
    return topology.weight(a.name, b.name)


def pair_label(weight: int) -> str:
    """The `nvidia-smi topo -m` token a pairing weight stands for (`PIX`, `NODE`, `NV2`...)."""
    if weight >= 100 and weight % 100 == 0:
        return f"NV{weight // 100}"
    try:
        return LinkLevel(weight).name
    except ValueError:
        return str(weight)


class Matching:
    """A maximum-weight one-to-one matching between rows (added one by one) and `cols` columns.

    Invariant: after every `push`/`pop`, the matching is a maximum-weight
    matching of the rows present. `push(row)` adds a row with weights
    row[j] >= 0 and returns how much the optimum grew.

    Why one augmenting path is enough: let M be optimal for the old rows and
    M' optimal with the new row t. M xor M' splits into alternating paths and
    cycles; every one of them not touching t could be applied to M alone, so
    by M's optimality none gains anything and M' may be taken as M xor (the
    one component through t). That component is an alternating path starting
    at t (t is unmatched in M): t takes column j1, j1's old row takes j2, ...,
    ending at a free column or by leaving the last displaced row unmatched.
    The best such path is a longest path over columns with no positive cycle
    (a positive alternating cycle would improve M), so label correcting
    (Bellman-Ford) finds it.

    Fast path: no path gains more than t's best weight bp(t) (dropping t's
    pair from M' leaves a matching of the old rows), so when a column of
    weight bp(t) is free, taking it is optimal and no search is needed. In the
    allocator's searches this is the common case (a GPU whose own NIC is
    still free). Zero-weight pairs are never used: they add nothing and only
    occupy a column.
    """

    __slots__ = ("cols", "rows", "mate", "row_mate", "total", "_undo")

    def __init__(self, cols: int):
        self.cols = cols
        self.rows: list[Sequence[int]] = []
        #: mate[j]: the row matched to column j, or -1.
        self.mate: list[int] = [-1] * cols
        #: row_mate[i]: the column matched to row i, or -1.
        self.row_mate: list[int] = []
        self.total = 0
        self._undo: list[tuple[list[int], list[int], int]] = []

    def push(self, row: Sequence[int]) -> int:
        """Add a row; return the growth of the optimum (>= 0)."""
        mate, rows = self.mate, self.rows
        self._undo.append((mate[:], self.row_mate[:], self.total))
        t = len(rows)
        rows.append(row)
        self.row_mate.append(-1)
        cols = self.cols
        top = max(row, default=0)
        if top <= 0:
            return 0
        for j in range(cols):
            if row[j] == top and mate[j] < 0:
                mate[j] = t
                self.row_mate[t] = j
                self.total += top
                return top
        best = [_UNREACHED] * cols
        pred = [-1] * cols  # -1: reached straight from t
        frontier = []
        for j in range(cols):
            if row[j] > 0:
                best[j] = row[j]
                frontier.append(j)
        self._along_paths(best, frontier, pred)
        # Where the path ends: a free column keeps all it gained; a matched one drops its old row.
        gain = 0
        end = -1
        for j in range(cols):
            b = best[j]
            if b == _UNREACHED:
                continue
            q = mate[j]
            g = b if q < 0 else b - rows[q][j]
            if g > gain:
                gain, end = g, j
        if end < 0:
            return 0
        dropped = mate[end]
        if dropped >= 0:
            self.row_mate[dropped] = -1
        j = end
        while True:
            p = pred[j]
            q = t if p < 0 else mate[p]
            mate[j] = q
            self.row_mate[q] = j
            if p < 0:
                break
            j = p
        self.total += gain
        return gain

    def pop(self) -> None:
        """Remove the last row pushed, restoring the matching from before it."""
        self.mate, self.row_mate, self.total = self._undo.pop()
        self.rows.pop()

    def pairs(self) -> list[tuple[int, int]]:
        """(row, column) of every matched pair, by row."""
        return [(i, j) for i, j in enumerate(self.row_mate) if j >= 0]

    def duals(self) -> tuple[list[int], list[int]]:
        """An optimal solution (u per row, v per column) of the matching's dual linear program.

        Dual feasibility: u, v >= 0 and u[i] + v[j] >= w(i, j) for every pair;
        optimality: sum(u) + sum(v) = total. So for any subset S of the rows,
        X(S) <= sum of u over S + sum(v): a bound linear in S (what a search
        can sum device by device). Of all optimal duals this is the one with
        the smallest v (the "row-optimal" one: each u[i] is row i's marginal
        value, total minus the optimum without row i), which makes the bound
        drop the most when rows are left out.

        v is the least solution of its lower bounds: v >= 0; v[j] >= w(i, j)
        for an unmatched row i (else i could take j); and, for the row q
        matched to column j, v[j2] >= v[j] + w(q, j2) - w(q, j) (else q would
        rather have j2). Those propagate along alternating paths, a longest
        path with no positive cycle (the matching is optimal), so label
        correcting converges; then u[q] = w(q, j) - v[j] for a matched row q,
        0 for an unmatched one.
        """
        cols, rows = self.cols, self.rows
        v = [0] * cols
        for i, r in enumerate(rows):
            if self.row_mate[i] < 0:
                for j in range(cols):
                    if r[j] > v[j]:
                        v[j] = r[j]
        self._along_paths(v, list(range(cols)))
        u = [rows[i][j] - v[j] if j >= 0 else 0 for i, j in enumerate(self.row_mate)]
        return u, v

    def _along_paths(self, value: list[int], frontier: list[int], pred: list[int] | None = None) -> None:
        """Raise `value` until value[j2] >= value[j] - w(q, j) + w(q, j2) wherever row q holds column j
        and w(q, j2) > 0: the longest alternating paths over columns (label correcting from
        `frontier`; no positive cycle as the matching is optimal). `pred` records each raise's source.
        Zero weights are skipped: a zero-weight pair adds nothing to a path (`push`), and its dual
        constraint u[q] + v[j2] >= 0 holds anyway (`duals`)."""
        mate, rows, cols = self.mate, self.rows, self.cols
        while frontier:
            nxt: list[int] = []
            for j in frontier:
                q = mate[j]
                if q < 0:
                    continue
                rq = rows[q]
                base = value[j] - rq[j]
                for j2 in range(cols):
                    wv = rq[j2]
                    if wv > 0 and j2 != j and base + wv > value[j2]:
                        value[j2] = base + wv
                        if pred is not None:
                            pred[j2] = j
                        nxt.append(j2)
            frontier = nxt


def pairing_weight(rows: Sequence[Sequence[int]], cols: int | None = None) -> int:
    """X: the weight of a maximum-weight one-to-one matching of a non-negative weight matrix."""
    if cols is None:
        cols = len(rows[0]) if rows else 0
    m = Matching(cols)
    for r in rows:
        m.push(r)
    return m.total


@dataclass(frozen=True)
class Partners:
    """The partner devices P of one request, as the requesting resource's allocator needs them.

    `ids` label the partners (`<resource>=<id>`, for display and metrics),
    `numa` is each partner's advertised NUMA node (None: none), and
    `weights[c]` is the tuple of pairing weights from candidate ID `c` to each
    partner, in `ids` order (a candidate absent from `weights` pairs with
    nothing). Immutable, so it can cross into a worker thread as is.
    """

    ids: tuple[str, ...] = ()
    numa: tuple[int | None, ...] = ()
    weights: Mapping[str, tuple[int, ...]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if len(self.numa) != len(self.ids):
            raise ValueError("Partners: one NUMA entry per partner is needed")
        for c, row in self.weights.items():
            if len(row) != len(self.ids):
                raise ValueError(f"Partners: candidate {c!r} has {len(row)} weights for {len(self.ids)} partners")

    def __len__(self) -> int:
        return len(self.ids)

    def __bool__(self) -> bool:
        return bool(self.ids)

    def row(self, candidate: str) -> tuple[int, ...]:
        """Pairing weights from `candidate` to every partner."""
        r = self.weights.get(candidate)
        return r if r is not None else (0,) * len(self.ids)


NO_PARTNERS = Partners()


class PairingMember(Protocol):
    """One advertised device of a resource (`plugin.model.resources.ResourceDevice` is one)."""

    @property
    def id(self) -> str: ...
    @property
    def device(self) -> Device: ...
    @property
    def numa(self) -> int | None: ...


@dataclass(frozen=True)
class PairingIndex:
    """Pairing weights between the devices of different resources of one node.

    Build it with `PairingIndex.build` whenever the resources are built (once
    per topology); per request, `partners(resource, group)` turns the devices
    of the container's other resources (from the call-sequence tracker) into
    the `Partners` of a request for `resource`.
    """

    #: resource -> {plugin ID: (advertised NUMA, kind)}
    members: Mapping[str, Mapping[str, tuple[int | None, DeviceKind]]]
    #: (resource, ID) -> {(other resource, other ID): weight}, non-zero weights only.
    cross: Mapping[tuple[str, str], Mapping[tuple[str, str], int]]

    @classmethod
    def build(cls, topology: NodeTopology, resources: Mapping[str, Iterable[PairingMember]]) -> PairingIndex:
        members: dict[str, dict[str, tuple[int | None, DeviceKind]]] = {}
        listed: dict[str, list[PairingMember]] = {}
        for name, devs in resources.items():
            ms = list(devs)
            listed[name] = ms
            members[name] = {m.id: (m.numa, m.device.kind) for m in ms}
        cross: dict[tuple[str, str], dict[tuple[str, str], int]] = {}
        names = sorted(listed)
        for a_i, ra in enumerate(names):
            for rb in names[a_i + 1:]:
                for ma in listed[ra]:
                    for mb in listed[rb]:
                        w = pair_weight(topology, ma.device, mb.device)
                        if w:
                            cross.setdefault((ra, ma.id), {})[(rb, mb.id)] = w
                            cross.setdefault((rb, mb.id), {})[(ra, ma.id)] = w
        return cls(members, cross)

    def partners(self, resource: str, group: Mapping[str, Iterable[str]]) -> Partners:
        """The partners of a request for `resource`, given the devices of the other resources of its group.

        Devices of `resource` itself, unknown resources and unknown IDs are
        ignored (a stale or foreign partner costs nothing but a worse guess);
        each partner counts once. Empty when nothing is left.
        """
        own = self.members.get(resource)
        if own is None:
            return NO_PARTNERS
        cols: list[tuple[str, str]] = []
        numa: list[int | None] = []
        seen: set[tuple[str, str]] = set()
        for other in sorted(group):
            known = self.members.get(other)
            if other == resource or known is None:
                continue
            for pid in group[other]:
                key = (other, pid)
                if pid in known and key not in seen:
                    seen.add(key)
                    cols.append(key)
                    numa.append(known[pid][0])
        if not cols:
            return NO_PARTNERS
        weights: dict[str, tuple[int, ...]] = {}
        for cid in own:
            to = self.cross.get((resource, cid))
            if to:
                row = tuple(to.get(k, 0) for k in cols)
                if any(row):
                    weights[cid] = row
        return Partners(tuple(f"{r}={i}" for r, i in cols), tuple(numa), MappingProxyType(weights))

    def match(self, resource: str, ids: Sequence[str], group: Mapping[str, Iterable[str]]
              ) -> tuple[tuple[str, str, int], ...]:
        """The best one-to-one GPU–NIC matching between `ids` (of `resource`) and the devices of
        `group`'s other resources: (ID, `<resource>=<id>` of its partner, weight) per matched pair.

        What a container got, as pairs (metrics, `explain`); unknown IDs pair with nothing.
        """
        partners = self.partners(resource, group)
        if not partners:
            return ()
        m = Matching(len(partners))
        for i in ids:
            m.push(partners.row(i))
        return tuple((ids[r], partners.ids[c], m.rows[r][c]) for r, c in m.pairs())
