"""One preferred-allocation request, its validation, and the policy interface.

Why separate from the policies: every policy (GPU `numa-first`/`link-first`,
NIC `spread`/`packed`) must reject the same bad requests with the same precise
messages (`shared/spec/allocation.md`, "Bad requests"), and the gRPC layer
only needs to know `AllocationError` -> INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .pairing import NO_PARTNERS, Partners
from .topology import DeviceGraph


class AllocationError(ValueError):
    """A request that can never be answered; the message names the offending IDs or numbers."""


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
        """Raise AllocationError for every kind of bad request the spec lists."""
        rep = sorted(i for i, c in Counter(self.available).items() if c > 1)
        if rep:
            raise AllocationError(f"available_deviceIDs repeats IDs: {', '.join(rep)}")
        rep = sorted(i for i, c in Counter(self.must_include).items() if c > 1)
        if rep:
            raise AllocationError(f"must_include_deviceIDs repeats IDs: {', '.join(rep)}")
        known = set(graph.ids)
        unknown = [i for i in self.available if i not in known]
        unknown += [i for i in self.must_include if i not in known and i not in unknown]
        if unknown:
            raise AllocationError(f"unknown device IDs (never advertised by this plugin): {', '.join(unknown)}")
        avail = set(self.available)
        missing = [i for i in self.must_include if i not in avail]
        if missing:
            raise AllocationError(
                f"must_include_deviceIDs not in available_deviceIDs: {', '.join(missing)}"
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
    """A preferred-allocation policy: pure, deterministic, no I/O."""

    name: str

    def allocate(self, graph: DeviceGraph, request: AllocationRequest) -> Allocation: ...
