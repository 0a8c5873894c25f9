"""The objectives with partners, each folded into one integer key (spec: "pairing GPUs with NICs").

With partners P:
- GPU resource (`numa-first`): 1. smallest span(S u P); 2. largest W(S);
  3. largest X(S, P); 4. largest W(A \\ S); 5. the fixed rule. `link-first`
  swaps 1 and 2.
- NIC resource (`spread`/`packed`): 1. smallest span(S u P); 2. largest
  X(S, P); 3. the pool's own criteria (ports, W(S), W(A \\ S), the fixed rule).

All criteria are folded into one integer with multipliers (proofs at each
`*_objective` below), as in `problem`; `paired_key` is that key of a set,
computed from scratch (what the search with partners maximises).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .pairing_problem import PairedProblem
from .problem import Objective, nic_objective


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
