"""Answers with partners proven without a search, for the common layouts pairing exists for.

`forced_pairing`: every partner has its own best device and that set is the only one with the best
X (nodes with one PIX NIC per GPU). `uniform_links_pairing`: every two available GPUs have the same
link (NVSwitch nodes) and every partner's best devices are its own. Each returns None when its
proof does not apply; the search then decides.
"""

from __future__ import annotations

from .pairing_problem import PairedProblem


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
