"""Container scope: one merge and one admit decision per container, in order.

Init containers go first. A container's devices are allocated right after its
own merge, so later containers see them as in use (or, for a non-restartable
init container, as reusable).
"""

from __future__ import annotations

from .hint import PodAdmitResult, ProviderHints, TopologyAffinityError, TopologyHint
from .pod import Container, Pod
from .scope import SCOPE_CONTAINER, Scope, ScopeAdmission, ScopeStep


class ContainerScope(Scope):
    name = SCOPE_CONTAINER

    def accumulate_providers_hints(self, pod: Pod, container: Container) -> list[ProviderHints | None]:
        return [p.get_topology_hints(pod, container) for p in self.hint_providers]

    def calculate_affinity(self, pod: Pod, container: Container) -> tuple[TopologyHint, bool, list[ProviderHints | None]]:
        hints = self.accumulate_providers_hints(pod, container)
        best, admit = self.policy.merge(hints)
        return best, admit, hints

    def admit(self, pod: Pod) -> ScopeAdmission:
        out = ScopeAdmission(PodAdmitResult.ok())
        for container in pod.all_containers():
            best, admit, hints = self.calculate_affinity(pod, container)
            out.steps.append(ScopeStep((container.name,), tuple(hints), best, admit))
            if not admit:
                out.result = PodAdmitResult.from_error(TopologyAffinityError())
                out.failed_container = container.name
                return out
            self.set_topology_hints(pod.uid, container.name, best)
            if not self._allocate_into(out, pod, container):
                return out
        return out
