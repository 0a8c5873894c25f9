"""One preferred-allocation request, its validation, and the policy interface.

Why separate from the policies: every policy (GPU `numa-first`/`link-first`,
NIC `spread`/`packed`) must reject the same bad requests with the same precise
messages (`shared/spec/allocation.md`, "Bad requests"), and the gRPC layer
only needs to know `AllocationError` -> INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .pairing import NO_PARTNERS, Partners
from .topology import DeviceGraph

#: How many offending IDs a message names, and how many characters of each (the rest is "+N more").
#: Why: a message echoing every ID of a 4 MB request exceeds the 16 KiB a default gRPC C-core
#: client accepts in status details (it then reports RESOURCE_EXHAUSTED, hiding the real error),
#: and fills the log.
BRIEF_IDS = 5
BRIEF_ID_CHARS = 48


def brief_ids(ids: Iterable[str], limit: int = BRIEF_IDS, width: int = BRIEF_ID_CHARS) -> str:
    """`a, b, c +7 more`: a few IDs, each cut to `width` characters and escaped to printable ASCII."""
    shown: list[str] = []
    more = 0
    for i in ids:
        if len(shown) < limit:
            text = ascii(i[: width + 1])[1:-1]
            shown.append(text if len(i) <= width and len(text) <= width
                         else f"{text[:width]}...({len(i)} chars)")
        else:
            more += 1
    return ", ".join(shown) + (f" +{more} more" if more else "")


class AllocationError(ValueError):
    """A request that can never be answered; the message names the offending IDs or numbers."""


def check_list_sizes(devices: int, available: int, must_include: int) -> None:
    """Refuse ID lists longer than the resource's device count (they must repeat or invent IDs).

    Takes only the lengths, so a caller can check a request before converting it.
    """
    for field, n in (("available_deviceIDs", available), ("must_include_deviceIDs", must_include)):
        if n > devices:
            raise AllocationError(f"{field} lists {n} IDs but the resource has only {devices} devices")


@dataclass(frozen=True)
class AllocationRequest:
    """What the kubelet asks: pick `size` of `available`, keeping all of `must_include`.

    `partners`: devices of other resources the same container already got
    (`pairing.PairingIndex.partners`); they change the objective of the
    policies that pair (spec, "pairing GPUs with NICs") and are never validated
    against this resource: pairing is only a preference.
    """

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int
    partners: Partners = NO_PARTNERS

    @classmethod
    def of(cls, available: Sequence[str], must_include: Sequence[str], size: int,
           partners: Partners | None = None) -> AllocationRequest:
        return cls(tuple(available), tuple(must_include), int(size), partners or NO_PARTNERS)

    def validate(self, graph: DeviceGraph) -> None:
        """Raise AllocationError for every kind of bad request the spec lists.

        The size checks come first and look at lengths only, so an absurd request
        (more IDs than the resource has devices, an ID longer than any advertised
        one) is refused before any work proportional to its size.
        """
        check_list_sizes(len(graph.ids), len(self.available), len(self.must_include))
        longest = max((len(i) for i in graph.ids), default=0)
        too_long = [i for i in (*self.available, *self.must_include) if len(i) > longest]
        if too_long:
            raise AllocationError(
                f"unknown device IDs (longer than any ID this plugin advertised, which have at most {longest} "
                f"characters): {brief_ids(too_long)}"
            )
        # Sets first: a request without repeats (every well-formed one) never builds a Counter.
        avail = set(self.available)
        must = set(self.must_include)
        if len(avail) != len(self.available):
            rep = sorted(i for i, c in Counter(self.available).items() if c > 1)
            raise AllocationError(f"available_deviceIDs repeats IDs: {brief_ids(rep)}")
        if len(must) != len(self.must_include):
            rep = sorted(i for i, c in Counter(self.must_include).items() if c > 1)
            raise AllocationError(f"must_include_deviceIDs repeats IDs: {brief_ids(rep)}")
        known = set(graph.ids)
        if not (avail <= known and must <= known):
            unknown = [i for i in self.available if i not in known]
            unknown += [i for i in self.must_include if i not in known and i not in unknown]
            raise AllocationError(f"unknown device IDs (never advertised by this plugin): {brief_ids(unknown)}")
        if not must <= avail:
            missing = [i for i in self.must_include if i not in avail]
            raise AllocationError(
                f"must_include_deviceIDs not in available_deviceIDs: {brief_ids(missing)}"
            )
        if self.size <= 0:
            raise AllocationError(f"allocation_size must be positive, got {self.size}")
        if self.size > len(self.available):
            raise AllocationError(
                f"allocation_size {self.size} exceeds the {len(self.available)} available devices"
            )
        if len(self.must_include) > self.size:
            raise AllocationError(
                f"{len(self.must_include)} must_include_deviceIDs exceed allocation_size {self.size}"
            )


@dataclass(frozen=True)
class Allocation:
    """A policy's answer with the numbers that justify it (shown by `allocate`/`explain`, logged, metered)."""

    ids: tuple[str, ...]
    span: int
    score: int
    left_score: int
    #: False when a time budget ran out before optimality was proven.
    optimal: bool = True
    #: Search nodes visited (for benchmarks and logs).
    explored: int = 0
    policy: str = ""
    #: X(S, P): weight of the best one-to-one GPU–NIC matching with the request's partners (0 without).
    pairing: int = 0
    #: That matching: (chosen ID, partner label, pairing weight), in the order of `ids`.
    pairs: tuple[tuple[str, str, int], ...] = ()


class Policy(Protocol):
    """A preferred-allocation policy: pure, deterministic, no I/O.

    It declares its time budget, and makes a copy of itself with a smaller one: the daemon answers
    each GetPreferredAllocation under a whole-request deadline (plugin/allocation/preferred.py) and
    gives the search only what is left of it.
    """

    name: str

    @property
    def time_budget_s(self) -> float | None:
        """Wall-clock budget of one request's search (None: no limit, always the proven optimum)."""
        ...

    def within(self, remaining_s: float) -> Policy:
        """This policy with its budget cut to `remaining_s` (at most); none left: the greedy answer only."""
        ...

    def allocate(self, graph: DeviceGraph, request: AllocationRequest) -> Allocation: ...
