"""What all Topology Manager scopes share: hint providers, the affinity store, tracing.

Why a trace: the kubelet only logs the hints it merged; `explain` needs them as
data (each provider's hints, the merged hint, the admit decision) for every
container or for the pod, so each scope records one `ScopeStep` per merge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .hint import PodAdmitResult, ProviderHints, TopologyHint
from .pod import Container, Pod
from .policy import Policy

SCOPE_CONTAINER = "container"
SCOPE_POD = "pod"
SCOPE_NONE = "none"


class HintProvider(Protocol):
    """A resource manager the Topology Manager consults (device, CPU, memory manager)."""

    def get_topology_hints(self, pod: Pod, container: Container) -> ProviderHints | None: ...

    def get_pod_topology_hints(self, pod: Pod) -> ProviderHints | None: ...

    def allocate(self, pod: Pod, container: Container) -> None:
        """Allocate for one container; raise to fail admission."""
        ...


class AffinityStore(Protocol):
    def get_affinity(self, pod_uid: str, container_name: str) -> TopologyHint: ...


def providers_hints_to_dict(hints: Sequence[ProviderHints | None]) -> list[dict[str, Any] | None]:
    """JSON form: per provider, resource -> list of hints, or null for "no preference"."""
    out: list[dict[str, Any] | None] = []
    for p in hints:
        if p is None:
            out.append(None)
            continue
        out.append({r: (None if hs is None else [h.to_dict() for h in hs]) for r, hs in p.items()})
    return out


@dataclass(frozen=True)
class ScopeStep:
    """One merge: for one container (container scope) or the whole pod (pod scope)."""

    containers: tuple[str, ...]
    providers_hints: tuple[ProviderHints | None, ...]
    best_hint: TopologyHint
    admit: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "containers": list(self.containers),
            "providers_hints": providers_hints_to_dict(self.providers_hints),
            "best_hint": self.best_hint.to_dict(),
            "admit": self.admit,
        }


@dataclass
class ScopeAdmission:
    """A scope's admit result plus what it merged on the way."""

    result: PodAdmitResult
    steps: list[ScopeStep] = field(default_factory=list)
    #: Containers whose Allocate ran, in order (init first).
    allocated_containers: list[str] = field(default_factory=list)
    #: The container whose merge or Allocate failed, if any.
    failed_container: str | None = None


class Scope:
    """Base of the scopes: holds the policy, the providers and the stored hints."""

    name: str = ""

    def __init__(self, policy: Policy, providers: Sequence[HintProvider] = ()):
        self.policy = policy
        self.hint_providers: list[HintProvider] = list(providers)
        self._pod_topology_hints: dict[str, dict[str, TopologyHint]] = {}

    def add_hint_provider(self, provider: HintProvider) -> None:
        self.hint_providers.append(provider)

    def get_affinity(self, pod_uid: str, container_name: str) -> TopologyHint:
        """The stored hint, or the zero hint (nil, not preferred) like the kubelet."""
        return self._pod_topology_hints.get(pod_uid, {}).get(container_name, TopologyHint(None, False))

    def set_topology_hints(self, pod_uid: str, container_name: str, hint: TopologyHint) -> None:
        self._pod_topology_hints.setdefault(pod_uid, {})[container_name] = hint

    def allocate_aligned_resources(self, pod: Pod, container: Container) -> None:
        for provider in self.hint_providers:
            provider.allocate(pod, container)

    def _allocate_into(self, out: ScopeAdmission, pod: Pod, container: Container) -> bool:
        """Allocate `container` on every provider; a provider error fails admission (recorded in `out`)."""
        try:
            self.allocate_aligned_resources(pod, container)
        except Exception as err:  # noqa: BLE001 - any provider error fails admission
            out.result = PodAdmitResult.from_error(err)
            out.failed_container = container.name
            return False
        out.allocated_containers.append(container.name)
        return True

    def admit(self, pod: Pod) -> ScopeAdmission:  # pragma: no cover - abstract
        raise NotImplementedError

    def _admit_policy_none(self, pod: Pod) -> ScopeAdmission:
        """Allocate every container with no hint at all (policy `none`)."""
        out = ScopeAdmission(PodAdmitResult.ok())
        for container in pod.all_containers():
            if not self._allocate_into(out, pod, container):
                return out
        return out
