"""Objectives with partners, and their exact search (spec: "pairing GPUs with NICs").

With partners P (devices of other resources the same container already got):
- GPU resource (`numa-first`): 1. smallest span(S u P); 2. largest W(S);
  3. largest X(S, P); 4. largest W(A \\ S); 5. the fixed rule. `link-first`
  swaps 1 and 2.
- NIC resource (`spread`/`packed`): 1. smallest span(S u P); 2. largest
  X(S, P); 3. the pool's own criteria (ports, W(S), W(A \\ S), the fixed rule).
X is the weight of a maximum-weight one-to-one GPU–NIC matching between S and
P (`allocator.pairing`). Without partners none of this runs: the policies
answer exactly as before.

How the search stays exact although X is not a sum over devices: it is the
branch and bound of `search` (twin classes, span limit, tie rule, deadline)
with three changes, made by `_PairedBranchAndBound`:
1. the partners' NUMA nodes are counted as used from the start, so the span
   limit and span penalty see span(S u P);
2. the key adds c_X * X(Q) exactly, with the matching kept incrementally
   (`pairing.Matching.push`/`pop`) as devices are taken and given back;
3. the bound gives each device still to pick at most c_X * bp(q), bp(q) the
   largest pairing weight from q to any partner. This is an upper bound:
   X(Q + q) <= X(Q) + bp(q), because removing q's pair from an optimal
   matching of Q + q leaves a matching of Q that lost at most bp(q); by
   induction X(Q u T) <= X(Q) + sum over T of bp. The search's bound already
   sums a per-device linear term (`Objective.lin`), so passing lin + c_X * bp
   there makes its bound dominate the paired key, and `_take` subtracts the
   c_X * bp it added and adds the true growth of X instead. Tighter for
   twins: t devices with equal weight rows can add at most the t largest
   weights of that row (one partner each; X is subadditive), so the i-th
   member of a class is credited its row's i-th largest weight
   (`member_bonus2`), which keeps two GPUs that share one NIC from both
   counting it.
Twin classes are split further by the devices' pairing weights, so only
devices that are interchangeable for X too are merged; and a named port no
other available device shares is treated as a port of its own (it counts the
same), so NICs on separate ports can be twins.

All criteria are folded into one integer with multipliers (proofs at each
`*_objective` below), as in `problem`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..pairing import Matching, Partners
from ..scoring import min_span_idx
from .decompose import Space
from .heuristics import greedy
from .problem import Objective, Problem, nic_objective
from .search import SearchResult, _BranchAndBound, _OutOfTime
from .twins import TwinClass, twin_classes


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
        # marking it so lets NICs on separate ports (every NIC of a DGX) be twins.
        shared = Counter(p.port[i] for i in p.available)
        p = replace(p, own_port=tuple(own or shared[port] == 1 for own, port in zip(p.own_port, p.port)))
        ids = p.graph.ids
        full = [partners.row(ids[i]) for i in p.available]
        columns = list(zip(*full))
        useful = [j for j, col in enumerate(columns) if any(col)]
        zero = (0,) * len(useful)
        rows = [zero] * len(ids)
        whole = len(useful) == len(partners)
        for i, r in zip(p.available, full):
            rows[i] = r if whole else tuple(r[j] for j in useful)
        # Each matched partner adds at most its best weight: X(S, P) <= sum of column maxima.
        x_cap = sum(max(columns[j]) for j in useful)
        return cls(
            problem=p,
            partners=partners,
            rows=tuple(rows),
            cols=len(useful),
            col_ids=tuple(partners.ids[j] for j in useful),
            partner_numa=tuple(sorted({n for n in partners.numa if n is not None})),
            bp=tuple(max(r, default=0) for r in rows),
            x_cap=x_cap,
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


@dataclass(frozen=True)
class PairedObjective:
    """key(S) = base key of S (with span(S u P) for span) + pair_coef * X(S, P), maximised."""

    base: Objective
    pair_coef: int


def gpu_numa_first_objective(pp: PairedProblem) -> PairedObjective:
    """span(S u P) as a hard limit at its minimum; then W(S), then X, then W(A\\S).

    With T = W(A), L = W(A\\S) = T - sum(deg over S) + W(S) in [0, T] and
    X in [0, x_cap]: (T+1) * ((x_cap+1) * W + X) + L orders by W, then X,
    then L. Dropping the constant T: alpha = (x_cap+1)(T+1) + 1, lin = -deg,
    pair_coef = T + 1.
    """
    p = pp.problem
    t = p.total
    base = Objective(alpha=(pp.x_cap + 1) * (t + 1) + 1, lin=[-d for d in p.degree],
                     max_span=pp.min_joint_span())
    return PairedObjective(base, t + 1)


def gpu_link_first_objective(pp: PairedProblem) -> PairedObjective:
    """W(S) first, then span(S u P), then X, then W(A\\S).

    inner = (T+1)*X + L - T lies in [-T, (T+1)*x_cap], narrower than
    B1 = (T+1)(x_cap+1); span(S u P) lies in [0, N] (N = nodes of A u P), so
    -B1*span + inner is narrower than B2 = B1*(N+1), which multiplies W(S).
    key = B2*W - B1*span + (T+1)*X + (W - sum deg): alpha = B2 + 1.
    """
    p = pp.problem
    t = p.total
    b1 = (t + 1) * (pp.x_cap + 1)
    b2 = b1 * (pp.numa_nodes() + 1)
    base = Objective(alpha=b2 + 1, lin=[-d for d in p.degree], span_coef=b1)
    return PairedObjective(base, t + 1)


def nic_paired_objective(pp: PairedProblem, spread: bool) -> PairedObjective:
    """span(S u P) as a hard limit at its minimum; then X; then the pool's criteria.

    The pool's key (`problem.nic_objective`) is port_coef*ports + alpha*W -
    sum deg with |port_coef| = b3 larger than the width of alpha*W - sum deg,
    and ports in [1, size]: its width is below b3*size. pair_coef =
    b3*(size+1) therefore makes X outrank all of it.
    """
    p = pp.problem
    base = replace(nic_objective(p, spread), max_span=pp.min_joint_span())
    return PairedObjective(base, abs(base.port_coef) * (p.size + 1))


def paired_key(pp: PairedProblem, obj: PairedObjective, members: Sequence[int]) -> int:
    """The exact key of a set (what the search maximises), computed from scratch."""
    p = pp.problem
    o = obj.base
    w = p.graph.weights
    weight = sum(w[a][b] for i, a in enumerate(members) for b in members[i + 1:])
    return (o.alpha * weight + sum(o.lin[m] for m in members) - o.span_coef * pp.joint_span(members)
            + o.port_coef * len({p.port[m] for m in members}) + o.offset
            + obj.pair_coef * pp.pairing(members))


def _augmented(pp: PairedProblem, obj: PairedObjective) -> Objective:
    """The base objective with pair_coef * bp(q) added to each device's linear term (the X bound)."""
    c = obj.pair_coef
    return replace(obj.base, lin=[v + c * b for v, b in zip(obj.base.lin, pp.bp)])


def solve_paired(pp: PairedProblem, obj: PairedObjective, deadline: float | None = None) -> SearchResult:
    """The best set for `obj`, proven optimal unless `deadline` (perf_counter time) passes first.

    The first answer is greedy, so a valid set exists before the search
    starts; the branch and bound only replaces it by sets with a better exact
    key. The greedy counts X by the best weight to a partner still unmatched
    (what the device surely adds), so it takes a GPU whose own NIC is free
    before its twin whose NIC is taken.
    """
    p = pp.problem
    m = pp.matching(p.must)
    rows, coef = pp.rows, obj.pair_coef
    free = [j for j in range(pp.cols) if m.mate[j] < 0]

    def sure_gain(x: int) -> int:
        return coef * max(map(rows[x].__getitem__, free), default=0)

    def picked(x: int) -> None:
        m.push(rows[x])
        free[:] = [j for j in range(pp.cols) if m.mate[j] < 0]

    st = greedy(p, obj.base, pp.partner_numa, sure_gain, picked)
    start = tuple(sorted(st.members))
    bb = _PairedBranchAndBound(pp, obj, _augmented(pp, obj), start, paired_key(pp, obj, start), deadline)
    optimal = True
    try:
        bb.run()
    except _OutOfTime:
        optimal = False
    return SearchResult(bb.best, bb.best_key, optimal, bb.explored)


class _PairedBranchAndBound(_BranchAndBound):
    """`search._BranchAndBound` with X(S, P) in the key and c_X * bp in the bound (see the module doc)."""

    def __init__(self, pp: PairedProblem, obj: PairedObjective, aug: Objective,
                 incumbent: tuple[int, ...], inc_key: int, deadline: float | None):
        self.pp = pp
        p = pp.problem
        super().__init__(p, Space(p.free, p.must, p.picks, aug), incumbent, inc_key, deadline)
        self.pair_coef = obj.pair_coef
        self.rows = pp.rows
        self.cbp = [pp.bp[ms[0]] for ms in self.members]
        self.matching = pp.matching(p.must)
        # The base class summed aug.lin over must-include; make that true lin + c_X * X(M).
        self.lin += self.pair_coef * (self.matching.total - sum(pp.bp[m] for m in p.must))
        for n in pp.partner_numa:
            self.numa_count[n] = self.numa_count.get(n, 0) + 1
        self._grown: list[int] = []
        # t members of one class (equal rows) can add at most the t largest weights of that row
        # (one partner each): the bound's c_X * bp per member becomes c_X * (i-th largest) for the i-th.
        c2 = 2 * self.pair_coef
        bonus: list[tuple[int, ...]] = []
        for ms in self.members:
            row = sorted(pp.rows[ms[0]], reverse=True)
            top = row[0] if row else 0
            b = tuple(c2 * ((row[i] if i < len(row) else 0) - top) for i in range(len(ms)))
            bonus.append(b if any(b) else ())
        self.member_bonus2 = bonus

    def _classes(self, pool: tuple[int, ...]) -> list[TwinClass]:
        """Twin classes split by pairing weights: only devices equal for X stay interchangeable."""
        rows = self.pp.rows
        out: list[TwinClass] = []
        for c in twin_classes(self.p, pool):
            parts: dict[tuple[int, ...], list[int]] = {}
            for m in c.members:
                parts.setdefault(rows[m], []).append(m)
            out.extend(TwinClass(tuple(ms), c.internal if len(ms) > 1 else 0) for ms in parts.values())
        out.sort(key=lambda c: c.rep)
        return out

    def _take(self, c: int, t: int) -> None:
        super()._take(c, t)
        m = self.matching
        rows = self.rows
        grown = 0
        for x in self.members[c][:t]:
            grown += m.push(rows[x])
        self._grown.append(grown)
        self.lin += self.pair_coef * (grown - t * self.cbp[c])

    def _untake(self, c: int, t: int) -> None:
        grown = self._grown.pop()
        for _ in range(t):
            self.matching.pop()
        self.lin -= self.pair_coef * (grown - t * self.cbp[c])
        super()._untake(c, t)
