"""Topology hints and the errors/results of pod admission.

Why here: every provider, policy and scope speaks in `TopologyHint`s, and the
admission outcome must carry the kubelet's exact reason and message strings
(operators grep for them), so both are defined once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .bitmask import BitMask

#: Reason of a pod rejected by the Topology Manager (the kubelet's `ErrorTopologyAffinity`).
TOPOLOGY_AFFINITY_ERROR = "TopologyAffinityError"
#: Its message (`TopologyAffinityError.Error()`).
TOPOLOGY_AFFINITY_MESSAGE = "Resources cannot be allocated with Topology locality"
#: Reason for any other admission failure (`admission.ErrorReasonUnexpected`).
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"


@dataclass(frozen=True)
class TopologyHint:
    """A NUMA affinity and whether it is a preferred one.

    `affinity is None` is the kubelet's nil mask: "no preference / any node".
    """

    affinity: BitMask | None
    preferred: bool

    @classmethod
    def of(cls, bits: Sequence[int] | None, preferred: bool) -> TopologyHint:
        return cls(None if bits is None else BitMask.of(*bits), preferred)

    def less_than(self, other: TopologyHint) -> bool:
        """Preferred first, then the narrower affinity (the kubelet's `LessThan`)."""
        if self.preferred != other.preferred:
            return self.preferred
        if self.affinity is None or other.affinity is None:
            raise ValueError("LessThan needs two hints with an affinity")
        return self.affinity.is_narrower_than(other.affinity)

    def to_dict(self) -> dict[str, Any]:
        return {
            "affinity": None if self.affinity is None else list(self.affinity.bits),
            "preferred": self.preferred,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TopologyHint:
        bits = data.get("affinity")
        return cls.of(None if bits is None else [int(b) for b in bits], bool(data.get("preferred")))

    def __str__(self) -> str:
        aff = "nil" if self.affinity is None else "{" + ",".join(map(str, self.affinity.bits)) + "}"
        return f"{aff} preferred={'true' if self.preferred else 'false'}"


#: What one hint provider returns: per resource, a list of hints, or None
#: ("no preference"). An empty list means "no possible affinity".
ProviderHints = Mapping[str, Sequence[TopologyHint] | None]


class TopologyManagerError(Exception):
    """A Topology Manager that cannot be built (bad policy, scope, option or machine)."""


class AdmissionError(Exception):
    """An admission failure with the kubelet's reason (`Type()`) and message (`Error()`)."""

    reason: str = UNEXPECTED_ADMISSION_ERROR


class TopologyAffinityError(AdmissionError):
    """The pod's resources cannot be aligned as the policy demands."""

    reason = TOPOLOGY_AFFINITY_ERROR

    def __init__(self) -> None:
        super().__init__(TOPOLOGY_AFFINITY_MESSAGE)


@dataclass(frozen=True)
class PodAdmitResult:
    """The answer of the kubelet's admit handler."""

    admit: bool
    reason: str = ""
    message: str = ""

    @classmethod
    def ok(cls) -> PodAdmitResult:
        return cls(True)

    @classmethod
    def from_error(cls, err: BaseException) -> PodAdmitResult:
        """The kubelet's `admission.GetPodAdmitResult`: typed errors keep their reason,
        anything else becomes an UnexpectedAdmissionError wrapping the message."""
        if isinstance(err, TopologyAffinityError):
            return cls(False, err.reason, str(err))
        return cls(
            False,
            UNEXPECTED_ADMISSION_ERROR,
            f"Allocate failed due to {err}, which is unexpected",
        )

    def to_dict(self) -> dict[str, Any]:
        return {"admit": self.admit, "reason": self.reason, "message": self.message}
