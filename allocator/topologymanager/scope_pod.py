"""Pod scope: one merge for the whole pod; the same hint is stored for every container.

Providers give pod-level hints (the device manager uses the pod's effective
request: the larger of the biggest init container and the sum of the app
containers and sidecars). Allocation is still per container, in order.
"""

from __future__ import annotations

from .hint import PodAdmitResult, ProviderHints, TopologyAffinityError, TopologyHint
from .pod import Pod
from .scope import SCOPE_POD, Scope, ScopeAdmission, ScopeStep


class PodScope(Scope):
    name = SCOPE_POD

    def accumulate_providers_hints(self, pod: Pod) -> list[ProviderHints | None]:
        return [p.get_pod_topology_hints(pod) for p in self.hint_providers]

    def calculate_affinity(self, pod: Pod) -> tuple[TopologyHint, bool, list[ProviderHints | None]]:
        hints = self.accumulate_providers_hints(pod)
        best, admit = self.policy.merge(hints)
        return best, admit, hints

    def admit(self, pod: Pod) -> ScopeAdmission:
        out = ScopeAdmission(PodAdmitResult.ok())
        best, admit, hints = self.calculate_affinity(pod)
        names = tuple(c.name for c in pod.all_containers())
        out.steps.append(ScopeStep(names, tuple(hints), best, admit))
        if not admit:
            out.result = PodAdmitResult.from_error(TopologyAffinityError())
            return out
        for container in pod.all_containers():
            self.set_topology_hints(pod.uid, container.name, best)
            if not self._allocate_into(out, pod, container):
                return out
        return out
