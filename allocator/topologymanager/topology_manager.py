"""Building a Topology Manager as the kubelet does (`NewManager`) and admitting pods.

Why the construction is modelled with its errors: a policy, scope or option the
kubelet would refuse at start-up must make `explain` fail the same way, not
produce a report for a node that could never run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .hint import TopologyHint, TopologyManagerError
from .merge import POLICY_BEST_EFFORT, POLICY_NONE, POLICY_RESTRICTED, POLICY_SINGLE_NUMA_NODE
from .numa_info import NUMAInfo
from .options import FeatureGates, PolicyOptions, parse_policy_options
from .pod import Pod
from .policy import Policy
from .policy_best_effort import BestEffortPolicy
from .policy_restricted import RestrictedPolicy
from .policy_single_numa_node import SingleNumaNodePolicy
from .scope import SCOPE_CONTAINER, SCOPE_POD, HintProvider, Scope, ScopeAdmission
from .scope_container import ContainerScope
from .scope_none import NoneScope
from .scope_pod import PodScope

POLICIES = (POLICY_NONE, POLICY_BEST_EFFORT, POLICY_RESTRICTED, POLICY_SINGLE_NUMA_NODE)
SCOPES = (SCOPE_CONTAINER, SCOPE_POD)


def new_policy(name: str, numa_info: NUMAInfo, opts: PolicyOptions) -> Policy:
    """A policy by its kubelet name (not `none`, which has its own scope)."""
    if name == POLICY_BEST_EFFORT:
        return BestEffortPolicy(numa_info, opts)
    if name == POLICY_RESTRICTED:
        return RestrictedPolicy(numa_info, opts)
    if name == POLICY_SINGLE_NUMA_NODE:
        return SingleNumaNodePolicy(numa_info, opts)
    raise TopologyManagerError(f'unknown policy: "{name}"')


@dataclass
class TopologyManager:
    """The kubelet's topology manager: a scope with its policy, and the affinity store."""

    scope: Scope
    numa_info: NUMAInfo | None = None
    opts: PolicyOptions = PolicyOptions()

    @classmethod
    def new(
        cls,
        numa_nodes: Iterable[int],
        policy_name: str,
        scope_name: str = SCOPE_CONTAINER,
        policy_options: Mapping[str, str] | None = None,
        distances: Mapping[int, Sequence[int] | None] | None = None,
        gates: FeatureGates = FeatureGates(),
    ) -> TopologyManager:
        """The kubelet's `NewManager`, with its checks in its order.

        `distances` are cadvisor-style rows indexed by node ID; they are only
        needed with `prefer-closest-numa-nodes`.
        """
        if policy_name == POLICY_NONE:
            # The kubelet short-circuits: options and scope are not even checked.
            return cls(NoneScope())
        opts = parse_policy_options(policy_options, gates)
        try:
            numa_info = NUMAInfo.build(numa_nodes, distances, opts)
        except TopologyManagerError as err:
            raise TopologyManagerError(f"cannot discover NUMA topology: {err}") from err
        if len(numa_info.nodes) > opts.max_allowable_numa_nodes:
            raise TopologyManagerError(
                f"unsupported on machines with more than {opts.max_allowable_numa_nodes} NUMA Nodes"
            )
        policy = new_policy(policy_name, numa_info, opts)
        scope: Scope
        if scope_name == SCOPE_CONTAINER:
            scope = ContainerScope(policy)
        elif scope_name == SCOPE_POD:
            scope = PodScope(policy)
        else:
            raise TopologyManagerError(f'unknown scope: "{scope_name}"')
        return cls(scope, numa_info, opts)

    @property
    def policy(self) -> Policy:
        return self.scope.policy

    def add_hint_provider(self, provider: HintProvider) -> None:
        self.scope.add_hint_provider(provider)

    def get_affinity(self, pod_uid: str, container_name: str) -> TopologyHint:
        return self.scope.get_affinity(pod_uid, container_name)

    def admit(self, pod: Pod) -> ScopeAdmission:
        return self.scope.admit(pod)
