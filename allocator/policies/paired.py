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
3. the bound of the search covers W, span, ports and the linear terms of
   the rest of the key (and c_X * X(Q) through the partial key); to it
   `_refine_bound` adds c_X * G, G an upper bound of X(Q u T) - X(Q) for
   every completion T of r devices from those R still allowed. G is the
   smaller of two bounds, both proven here:
   - Credits. X is subadditive: X(Q u T) <= X(Q) + X(T) (split an optimal
     matching of Q u T by where its devices come from). And X(T) is at most
     the sum of each device's credit: the i-th device taken from a twin
     class (equal weight rows) is credited the i-th largest weight of its
     row, because t such devices can only be matched to t distinct partners
     (so two GPUs sharing one NIC do not both count it). Taking the r
     largest credits of R bounds every T.
   - Duality with a penalty. Lowering every pairing weight by a penalty
     p >= 0 (floored at 0) loses at most p per matched pair, so X(S) <=
     X_p(S) + p * |S|; and for an optimal dual (u, v) of X_p(A)
     (`Matching.duals`: u, v >= 0, u_i + v_j >= the lowered weight),
     X_p(S) <= u(S) + sum(v) for every S within A (weak duality). So
     X(Q u T) <= u(Q) + u(R) + sum(v) + p * k, which is linear in the devices
     still allowed and exact at the root. This bound sees what credits
     miss: partners several devices would share (many NICs whose best GPU
     is the same partner: v carries the partner's value once). The penalty,
     the smallest pairing weight when k is below the number of partners,
     lets it see that k devices pair with k partners at most.
   The classes are still ordered with c_X * bp(q) added to each device's
   value (bp: its largest pairing weight), so devices that pair well are
   tried first.
Twin classes are split further by the devices' pairing weights, so only
devices that are interchangeable for X too are merged; and a named port no
other available device shares is treated as a port of its own (it counts the
same), so NICs on separate ports can be twins.

All criteria are folded into one integer with multipliers (proofs at each
`*_objective` below), as in `problem`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..pairing import Matching, Partners
from ..scoring import min_span_idx
from .decompose import Space
from .heuristics import SetState, greedy
from .problem import Objective, Problem, nic_objective
from .search import SearchResult, _BranchAndBound, _OutOfTime
from .twins import TwinClass, group_twins


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


def forced_pairing(pp: PairedProblem) -> tuple[int, ...] | None:
    """The set that gives every partner its own best device, when it is the only set with the best X
    and nothing beats it on span; else None.

    When each partner's largest pairing weight is reached by exactly one available device, X(S) =
    x_cap (each partner matched at its largest weight) holds for a set S only if S holds all those
    devices; when they are distinct, exactly `size` of them and include must-include, that set C is
    the only one with the largest X. When moreover span(C u P) = span(M u P), which no valid set
    can go below, C is the one optimum of every objective that ranks span(S u P), then X (the NIC
    objectives); the GPU objectives rank W(S) before X, so their policies also check C's W(S)
    against the largest W any set of `size` can have. Why: on nodes with one PIX NIC per GPU (the
    case pairing exists for) this answers most requests with partners without a search.
    """
    p = pp.problem
    if not pp.cols:
        return None
    rows = pp.rows
    chosen: set[int] = set()
    for j in range(pp.cols):
        top, best = 0, -1
        for i in p.available:
            w = rows[i][j]
            if w > top:
                top, best = w, i
            elif w == top and top > 0:
                best = -1  # a tie: the best device of this partner is not unique
        if best < 0 or best in chosen:
            return None
        chosen.add(best)
    if len(chosen) != p.size or not chosen.issuperset(p.must):
        return None
    members = tuple(sorted(chosen))
    return members if pp.joint_span(members) == pp.joint_span(p.must) else None


def uniform_links_pairing(pp: PairedProblem) -> tuple[int, ...] | None:
    """The optimum of both GPU objectives with partners when every two available GPUs have the same
    link (NVSwitch nodes: the DGX-2's 16 GPUs) and every partner's best devices are its own; else None.

    Why it is exact: with one link weight between every two available GPUs, W(S) and W(A\\S) are
    the same for every set of k (as in `gpu.uniform_lowest`), so both GPU objectives are left with
    span(S u P) (smallest first), then X, then the tie rule. No valid set has a smaller span than
    span(M u P); the sets that reach it are those of M and the devices on M's and P's NUMA nodes (or
    on none). X(S) is at most x_cap, the sum of each partner's largest weight T_j, and reaches it
    exactly when every partner j is matched to a device of weight T_j; when no device is the best
    of two partners (the sets B_j of best devices are disjoint), that holds exactly when S meets
    every B_j. So when such a set exists at that span, the answer is the lexicographically smallest
    set of k that meets every B_j: taking the free devices lowest first, each one whenever a valid
    completion with higher devices still exists (each B_j not met yet keeps a device above it, and
    enough devices are left) gives exactly that set. Otherwise None, and the search decides.
    Why: the search's set-up costs several times the whole unpaired answer on such nodes, and
    requests whose partners have free best GPUs (a container's own NICs' GPUs) are the common case.
    """
    p = pp.problem
    cols = pp.cols
    avail = p.available
    if not cols or len(avail) < 2:
        return None
    w = p.graph.weights
    link = w[avail[0]][avail[1]]
    for n, a in enumerate(avail):
        row = w[a]
        for b in avail[n + 1:]:
            if row[b] != link:
                return None
    rows = pp.rows
    tops = [0] * cols
    for i in avail:
        for j, x in enumerate(rows[i]):
            if x > tops[j]:
                tops[j] = x
    owner: dict[int, int] = {}
    for i in avail:
        r = rows[i]
        for j in range(cols):
            if r[j] == tops[j]:
                if i in owner:
                    return None  # the best device of two partners: meeting both sets is not enough
                owner[i] = j
    numa = p.numa
    known = set(pp.partner_numa)
    known.update(must_node for m in p.must if (must_node := numa[m]) is not None)
    free = [x for x in p.free if numa[x] is None or numa[x] in known]
    unmet = set(range(cols))
    for m in p.must:
        unmet.discard(owner.get(m, -1))
    # last[j]: the highest allowed free device among partner j's best (-1: none).
    last = [-1] * cols
    for x in free:
        j = owner.get(x, -1)
        if j >= 0:
            last[j] = x
    chosen = list(p.must)
    slots = p.size - len(chosen)
    if slots < len(unmet) or len(free) < slots or any(last[j] < 0 for j in unmet):
        return None
    for n, x in enumerate(free):
        if not slots:
            break
        j = owner.get(x, -1)
        meets = j in unmet  # -1 (no partner's best) never is
        need = len(unmet) - meets
        if (slots - 1 >= need and len(free) - n - 1 >= slots - 1
                and all(last[u] > x for u in unmet if u != j)):
            chosen.append(x)
            slots -= 1
            if meets:
                unmet.discard(j)
    return tuple(sorted(chosen))


def _augmented(pp: PairedProblem, obj: PairedObjective) -> Objective:
    """The base objective with pair_coef * bp(q) added to each device's linear term: what orders the
    search's classes (devices that pair well first); `_PairedBranchAndBound` takes the bp back out."""
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
    if p.picks == 1:
        return _one_pick(pp, obj)
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


def _one_pick(pp: PairedProblem, obj: PairedObjective) -> SearchResult:
    """One device to add (k = 1, or k = |must| + 1): the exact key change of each candidate,
    X's growth included; ties go to the lowest position (only a strictly better key replaces)."""
    p = pp.problem
    o = obj.base
    st = SetState(p, o, p.must, pp.partner_numa)
    m = pp.matching(p.must)
    best, best_d = -1, 0
    for x in p.free:
        n = p.numa[x]
        if o.max_span is not None and n is not None and n not in st.numa_count and st.span >= o.max_span:
            continue
        d = st.add_delta(x) + obj.pair_coef * m.push(pp.rows[x])
        m.pop()
        if best < 0 or d > best_d:
            best, best_d = x, d
    members = tuple(sorted((*p.must, best)))
    return SearchResult(members, paired_key(pp, obj, members), True, len(p.free))


class _PairedBranchAndBound(_BranchAndBound):
    """`search._BranchAndBound` with X(S, P) in the key and a bound of its growth (see the module doc)."""

    def __init__(self, pp: PairedProblem, obj: PairedObjective, aug: Objective,
                 incumbent: tuple[int, ...], inc_key: int, deadline: float | None):
        self.pp = pp
        p = pp.problem
        # `aug` (lin + c_X * bp) orders the classes (pairing devices first); the bound uses the true lin.
        super().__init__(p, Space(p.free, p.must, p.picks, aug), incumbent, inc_key, deadline)
        coef = self.pair_coef = obj.pair_coef
        true_lin = obj.base.lin
        self.lin2 = [2 * true_lin[ms[0]] for ms in self.members]
        self.rows = pp.rows
        self.cbp = [pp.bp[ms[0]] for ms in self.members]
        self.matching = pp.matching(p.must)
        # The base class summed aug.lin over must-include; make that true lin + c_X * X(M).
        self.lin += coef * (self.matching.total - sum(pp.bp[m] for m in p.must))
        for n in pp.partner_numa:
            self.numa_count[n] = self.numa_count.get(n, 0) + 1
        self._grown: list[int] = []
        self._dual_u: dict[int, int] | None = None  # the duals (below), computed when first needed
        self._dual_class: list[int] = []
        self._dual_rest = 0
        self._dual_chosen = 0
        #: (class index, used NUMA nodes when the span limit is reached) -> [prefix sums of the
        #: credits of the devices still allowed, largest first; those classes; their summed dual u
        #: once the duals exist].
        self._rest_cache: dict[tuple[int, frozenset[Any] | None], list[Any]] = {}
        # What the i-th device taken from a class can add to X at most: the i-th largest weight of
        # its row (equal rows, one partner each).
        rows = pp.rows
        self.xvals = [tuple(sorted(rows[ms[0]], reverse=True)[:len(ms)]) for ms in self.members]

    def _duals(self) -> None:
        """X(S) <= X'(S) + penalty * |S|, X' the pairing weight with every weight lowered by the
        penalty (a matching of S loses at most that per pair); and X'(S) <= u(S) + sum(v) for an
        optimal dual (u, v) of X'(A). So X(Q u T) <= u(Q) + u(T) + sum(v) + penalty * k: linear in
        the devices still allowed, exact for A itself. The penalty (the smallest weight, when k is
        below the number of partners) makes the bound see that k devices pair with k partners at most.

        Computed at the first node the credits alone do not prune (`_refine_bound`), since a search
        the credits settle never needs it; devices with an all-zero row are left out of the
        matching (they are never matched, so u = 0 for them and v is unchanged).
        """
        pp = self.pp
        p = pp.problem
        rows = pp.rows
        pen = 0
        if p.size < pp.cols:
            pen = min((w for x in p.available for w in rows[x] if w > 0), default=0)
        m = Matching(pp.cols)
        pushed = [x for x in p.available if pp.bp[x] > 0]
        for x in pushed:
            m.push(tuple(w - pen if w > pen else 0 for w in rows[x]) if pen else rows[x])
        u_of, v = m.duals()
        u = dict.fromkeys(p.available, 0)
        u.update(zip(pushed, u_of))
        self._dual_u = u
        self._dual_class = [sum(u[x] for x in ms) for ms in self.members]
        self._dual_rest = sum(v) + pen * p.size
        # Must-include and the devices taken so far.
        self._dual_chosen = sum(u[x] for x in self.chosen)

    def _classes(self, pool: tuple[int, ...]) -> list[TwinClass]:
        """Twin classes (`twins.twin_classes`) split by pairing weights: only devices equal for X stay
        interchangeable. One pass: the signature holds the pairing row, and twins (equal weights to
        every other available device) have equal degrees, so (NUMA, port kind, row, degree) only
        groups candidates; the exact test on the link weights decides, as in `twin_classes`."""
        p = self.p
        numa, own, port, degree = p.numa, p.own_port, p.port, p.degree
        rows = self.pp.rows
        # `pool` is ascending, so the classes come out by first member already.
        return group_twins(p, pool, lambda x: (numa[x], -1 if own[x] else port[x], rows[x], degree[x]))

    def _refine_bound(self, ub: int, c: int, r: int, closed: bool) -> int:
        """Add c_X * G, G a bound of how much X can still grow (see the module doc, point 3)."""
        key = (c, frozenset(self.numa_count) if closed else None)
        rest = self._rest_cache.get(key)
        if rest is None:
            numa_count = self.numa_count
            cnuma = self.cnuma
            credits: list[int] = []
            allowed: list[int] = []
            for d in range(c, self.nc):
                n = cnuma[d]
                if closed and n is not None and n not in numa_count:
                    continue
                credits.extend(self.xvals[d])
                allowed.append(d)
            credits.sort(reverse=True)
            rest = self._rest_cache[key] = [[0, *itertools.accumulate(credits)], allowed, None]
        tops = rest[0]
        by_credits: int = tops[min(r, len(tops) - 1)]
        if ub + self.pair_coef * by_credits < self.best_key:
            return ub + self.pair_coef * by_credits  # pruned: the smaller bound below prunes as well
        if self._dual_u is None:
            self._duals()
        dual: int | None = rest[2]
        if dual is None:
            dual = rest[2] = sum(self._dual_class[d] for d in rest[1])
        grow = min(by_credits, self._dual_chosen + dual + self._dual_rest - self.matching.total)
        return ub + self.pair_coef * max(grow, 0)

    def _take(self, c: int, t: int) -> None:
        super()._take(c, t)
        m = self.matching
        rows = self.rows
        grown = 0
        for x in self.members[c][:t]:
            grown += m.push(rows[x])
        self._grown.append(grown)
        self.lin += self.pair_coef * (grown - t * self.cbp[c])
        u = self._dual_u
        if u is not None:
            self._dual_chosen += sum(u[x] for x in self.members[c][:t])

    def _untake(self, c: int, t: int) -> None:
        grown = self._grown.pop()
        for _ in range(t):
            self.matching.pop()
        self.lin -= self.pair_coef * (grown - t * self.cbp[c])
        u = self._dual_u
        if u is not None:
            self._dual_chosen -= sum(u[x] for x in self.members[c][:t])
        super()._untake(c, t)
