"""The interface every Topology Manager policy implements.

Why a protocol and one file per policy: the kubelet's policies differ only in
how they filter hints before the merge and in when they admit; keeping each in
its own module makes that difference the whole content of the module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .hint import ProviderHints, TopologyHint
from .merge import POLICY_SINGLE_NUMA_NODE


class Policy(Protocol):
    """Merges the providers' hints into one and says whether the pod can be admitted."""

    @property
    def name(self) -> str: ...

    def merge(self, providers_hints: Sequence[ProviderHints | None]) -> tuple[TopologyHint, bool]: ...

    def can_admit(self, hint: TopologyHint) -> bool: ...


def is_alignment_guaranteed(policy: Policy) -> bool:
    """The kubelet's `IsAlignmentGuaranteed`: only single-numa-node guarantees one NUMA node."""
    return policy.name == POLICY_SINGLE_NUMA_NODE
