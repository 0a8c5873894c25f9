"""The spec's pairing rules read literally, for checking a daemon (or the real kubelet's calls to it).

Two parts of `shared/spec/allocation.md`, "One container, several resources",
written from the text and sharing no code with the plugin:
- `spec_partners`: from an ordered log of the calls one plugin process got
  (GetPreferredAllocation / Allocate, resource, IDs, time), the partners P of
  every GetPreferredAllocation: the group is the consecutive `Allocate`s for
  different resources; it ends at a call for a resource already in it, or
  when more than the window passed since its last `Allocate`.
- `Oracle`: every set S (M <= S <= A, |S| = k) of a request ranked by the
  policy's criteria with partners (span(S u P), W(S), X(S, P), W(A \\ S),
  ports), computed from the node's link table; X by exhaustive matching.
  `check` says whether an answer ties with the best set on every criterion.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from allocator.topology import Device, DeviceKind, NodeTopology


def spec_order(policy: str, span: int, w: int, x: int, left: int, ports: int) -> tuple[int, ...]:
    """The spec's criteria with partners in each policy's order, smaller is better: span is
    span(S u P), w is W(S), x is X(S, P), left is W(A \\ S). Without partners x = 0 and span is
    span(S), which gives the objectives without partners."""
    if policy == "numa-first":
        return (span, -w, -x, -left)
    if policy == "link-first":
        return (-w, span, -x, -left)
    if policy == "spread":
        return (span, -x, -ports, -w, -left)
    if policy == "packed":
        return (span, -x, ports, -w, -left)
    raise ValueError(policy)


@dataclass(frozen=True)
class LoggedCall:
    method: str  # "GetPreferredAllocation" or "Allocate"
    resource: str
    ids: tuple[str, ...] = ()
    t: float = 0.0


def spec_partners(calls: Sequence[LoggedCall], window_s: float | None = None) -> list[dict[str, tuple[str, ...]]]:
    """P (resource -> device IDs) of each GetPreferredAllocation in `calls`, in order.

    `window_s` None: no expiry (a test whose calls are far closer than the window); 0: pairing off.
    """
    out: list[dict[str, tuple[str, ...]]] = []
    group: dict[str, tuple[str, ...]] = {}
    last = 0.0
    for c in calls:
        if group and window_s is not None and c.t - last > window_s:
            group = {}
        if c.resource in group:
            group = {}
        if c.method == "GetPreferredAllocation":
            out.append({} if window_s == 0 else dict(group))
        else:
            group[c.resource] = tuple(c.ids)
            last = c.t
    return out


def _matching_weight(weights: Sequence[Sequence[int]]) -> int:
    """Largest sum of a one-to-one matching in a small non-negative matrix (rows to columns), exhaustively."""
    cols = len(weights[0]) if weights else 0

    @functools.lru_cache(maxsize=None)
    def best(row: int, used: int) -> int:
        if row == len(weights):
            return 0
        top = best(row + 1, used)  # this row stays unmatched
        for j in range(cols):
            if not used >> j & 1 and weights[row][j]:
                top = max(top, weights[row][j] + best(row + 1, used | 1 << j))
        return top

    return best(0, 0)


@dataclass
class Oracle:
    """One node: plugin ID -> device per resource, the policy per resource."""

    topology: NodeTopology
    #: resource -> {plugin ID: device}
    devices: Mapping[str, Mapping[str, Device]]
    #: resource -> policy name (numa-first, link-first, spread, packed)
    policies: Mapping[str, str]

    def _w(self, a: Device, b: Device) -> int:
        return self.topology.weight(a.name, b.name)

    def _pair_w(self, a: Device, b: Device) -> int:
        """The spec's pairing weight, read literally: GPU–NIC pairs only; a GPU and a NIC of one complex
        count as PIX (50) whatever their PCIe path ("GPU–NIC complexes"); any other pair its link weight."""
        if {a.kind, b.kind} != {DeviceKind.GPU, DeviceKind.NIC}:
            return 0
        if a.complex is not None and a.complex == b.complex:
            return 50
        return self._w(a, b)

    def criteria(self, resource: str, available: Iterable[str], chosen: Iterable[str],
                 partners: Mapping[str, Sequence[str]]) -> tuple[int, ...]:
        """The spec's criteria of `chosen` (smaller is better), the fixed rule left out."""
        chosen = list(chosen)
        rest = [i for i in available if i not in set(chosen)]
        dev = self.devices[resource]
        left = sum(self._w(dev[a], dev[b]) for a, b in itertools.combinations(rest, 2))
        return self._criteria(resource, chosen, left, self._partners(resource, partners))

    def _partners(self, resource: str, partners: Mapping[str, Sequence[str]]) -> list[Device]:
        return [self.devices[r][i] for r, ids in partners.items() if r != resource and r in self.devices
                for i in dict.fromkeys(ids) if i in self.devices[r]]

    def _criteria(self, resource: str, chosen: Sequence[str], left: int, p: Sequence[Device]) -> tuple[int, ...]:
        dev = self.devices[resource]
        s = [dev[i] for i in chosen]
        span = len({d.numa for d in [*s, *p] if d.numa is not None})
        w = sum(self._w(a, b) for a, b in itertools.combinations(s, 2))
        x = _matching_weight([[self._pair_w(a, b) for b in p] for a in s]) if p else 0
        ports = len({d.port or d.name for d in s})
        return spec_order(self.policies[resource], span, w, x, left, ports)

    def best(self, resource: str, available: Sequence[str], must: Sequence[str], size: int,
             partners: Mapping[str, Sequence[str]]) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The best criteria over every S, and one S that has them.

        W(A \\ S) by the identity W(A) - (weights from S to all of A) + W(S), so a node of 16
        devices is enumerated in well under a second; `check` computes it pair by pair."""
        dev = self.devices[resource]
        p = self._partners(resource, partners)
        total = sum(self._w(dev[a], dev[b]) for a, b in itertools.combinations(available, 2))
        deg = {i: sum(self._w(dev[i], dev[j]) for j in available if j != i) for i in available}
        rest = [i for i in available if i not in set(must)]
        top: tuple[tuple[int, ...], tuple[str, ...]] | None = None
        for combo in itertools.combinations(rest, size - len(must)):
            s = (*must, *combo)
            inner = sum(self._w(dev[a], dev[b]) for a, b in itertools.combinations(s, 2))
            key = self._criteria(resource, s, total - sum(deg[i] for i in s) + inner, p)
            if top is None or key < top[0]:
                top = (key, s)
        assert top is not None
        return top

    def check(self, resource: str, available: Sequence[str], must: Sequence[str], size: int,
              partners: Mapping[str, Sequence[str]], answer: Sequence[str]) -> str | None:
        """None when `answer` is a valid optimum; else what is wrong."""
        if len(answer) != size or len(set(answer)) != size or not set(must) <= set(answer) <= set(available):
            return f"invalid answer {list(answer)} for size {size}, must {list(must)}"
        got = self.criteria(resource, available, answer, partners)
        want, example = self.best(resource, available, must, size, partners)
        if got != want:
            return f"{resource}: {list(answer)} has criteria {got}, {list(example)} has {want} (partners {partners})"
        return None

    def close_pairs(self, gpus: Sequence[Device], nics: Sequence[Device]) -> int:
        """GPUs with a close NIC of their own among `nics` (the largest one-to-one matching of such pairs):
        PIX/PXB, or the NIC of the GPU's complex (which the platform defines as its pair)."""
        close = [[1 if (g.complex is not None and g.complex == n.complex)
                  or self.topology.link(g.name, n.name).label in ("PIX", "PXB") else 0 for n in nics]
                 for g in gpus]
        return _matching_weight(close) if gpus and nics else 0


def oracle_for(topology: NodeTopology, resources: Iterable) -> Oracle:
    """An `Oracle` for `plugin.model.resources.build_resources` output (plugin IDs, devices and policies).

    Each device carries the NUMA node its resource advertises (the spec's "for each device its
    NUMA node": a pool that excludes topology advertises none)."""
    rs = list(resources)
    return Oracle(topology, {r.name: {d.id: dataclasses.replace(d.device, numa=d.numa) for d in r.devices}
                             for r in rs},
                  {r.name: r.policy for r in rs})
