"""A request with partners, in graph positions (spec: "pairing GPUs with NICs").

Partners P are the devices of other resources the same container already got. X(S, P) is the
weight of a maximum-weight one-to-one GPU–NIC matching between S and P (`allocator.pairing`);
`PairedProblem` holds what every objective, shortcut and search with partners reads: each
candidate's pairing weights to the partners that pair with something, the partners' NUMA nodes
(they count in span(S u P)), each candidate's best pairing weight and a cap of X. Without
partners none of this runs: the policies answer exactly as before.

A named port no other available device shares is treated as a port of its own (it counts the
same), so NICs on separate ports can be twins.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..pairing import Matching, Partners
from ..scoring import min_span_idx
from .problem import Problem


@dataclass(frozen=True)
class PairedProblem:
    """A validated request with its partners, in graph positions."""

    problem: Problem
    partners: Partners
    #: rows[i][j]: pairing weight of graph position i with useful partner j (0 for unavailable devices).
    rows: tuple[tuple[int, ...], ...]
    #: Columns of `rows` (partners that pair with some available device).
    cols: int
    #: Labels of those partners, in column order.
    col_ids: tuple[str, ...]
    #: Distinct known NUMA nodes of all partners (they count in span(S u P)).
    partner_numa: tuple[int, ...]
    #: bp[i]: the best pairing weight of position i (0 if none).
    bp: tuple[int, ...]
    #: An upper bound of X(S, P) for every S (it only sizes multipliers).
    x_cap: int

    @classmethod
    def build(cls, p: Problem, partners: Partners) -> PairedProblem:
        # A named port no other available device shares counts exactly like a port of its own;
        # marking it so lets NICs on separate ports (every NIC of a DGX) be twins. GPUs have no
        # ports, so for them nothing changes and the problem is kept as is (no copy per request).
        own_port = p.own_port
        if not all(own_port[i] for i in p.available):
            shared = Counter(p.port[i] for i in p.available)
            marked = tuple(own or shared[port] == 1 for own, port in zip(own_port, p.port))
            if marked != own_port:
                p = replace(p, own_port=marked)
        ids = p.graph.ids
        n_partners = len(partners)
        get = partners.weights.get
        # Only candidates with some non-zero weight are listed in `partners.weights`; the rest
        # pair with nothing, so their rows stay zero without a look-up per partner.
        listed = [(i, r) for i in p.available if (r := get(ids[i])) is not None]
        tops = [0] * n_partners
        for _, r in listed:
            for j, w in enumerate(r):
                if w > tops[j]:
                    tops[j] = w
        useful = [j for j in range(n_partners) if tops[j] > 0]
        zero = (0,) * len(useful)
        rows = [zero] * len(ids)
        bp = [0] * len(ids)
        whole = len(useful) == n_partners
        for i, r in listed:
            row = r if whole else tuple(r[j] for j in useful)
            rows[i] = row
            bp[i] = max(row, default=0)
        return cls(
            problem=p,
            partners=partners,
            rows=tuple(rows),
            cols=len(useful),
            col_ids=partners.ids if whole else tuple(partners.ids[j] for j in useful),
            partner_numa=tuple(sorted({n for n in partners.numa if n is not None})),
            bp=tuple(bp),
            # Each partner is matched once, at its best weight at most.
            x_cap=sum(tops),
        )

    def matching(self, members: Iterable[int]) -> Matching:
        m = Matching(self.cols)
        for i in members:
            m.push(self.rows[i])
        return m

    def pairing(self, members: Iterable[int]) -> int:
        """X(S, P) of the positions `members`."""
        return self.matching(members).total

    def pairs(self, members: Sequence[int]) -> tuple[tuple[str, str, int], ...]:
        """The best matching of `members` as (device ID, partner label, weight), in the order of `members`."""
        m = self.matching(members)
        ids = self.problem.graph.ids
        return tuple((ids[members[i]], self.col_ids[j], self.rows[members[i]][j]) for i, j in m.pairs())

    def joint_span(self, members: Iterable[int]) -> int:
        """span(S u P)."""
        numa = self.problem.numa
        return len({numa[i] for i in members if numa[i] is not None} | set(self.partner_numa))

    def min_joint_span(self) -> int:
        p = self.problem
        return min_span_idx(p.graph, p.available, p.must, p.size, self.partner_numa)

    def numa_nodes(self) -> int:
        """Distinct known NUMA nodes of A u P: the largest span(S u P) can be."""
        p = self.problem
        return len({p.numa[i] for i in p.available if p.numa[i] is not None} | set(self.partner_numa))
