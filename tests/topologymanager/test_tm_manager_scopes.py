"""NewManager, scope and Admit cases ported from the kubelet's topology_manager_test.go,
scope_container_test.go and scope_pod_test.go, plus the scopes' allocation order."""

from __future__ import annotations

import pytest

from allocator.topologymanager import (
    BestEffortPolicy,
    BitMask,
    Container,
    NUMAInfo,
    Pod,
    PolicyOptions,
    RestrictedPolicy,
    SingleNumaNodePolicy,
    TopologyHint,
    TopologyManager,
    TopologyManagerError,
)
from allocator.topologymanager.scope_container import ContainerScope
from allocator.topologymanager.scope_none import NoneScope
from allocator.topologymanager.scope_pod import PodScope


def H(bits, preferred):
    return TopologyHint(None if bits is None else BitMask.of(*bits), preferred)


@pytest.mark.parametrize(
    "description, policy, options, nodes, distances, expected_policy, error",
    [
        ("Policy is set to none", "none", None, [0, 1], None, "none", None),
        ("Policy is set to best-effort", "best-effort", None, [0, 1], None, "best-effort", None),
        ("Policy is set to restricted", "restricted", None, [0, 1], None, "restricted", None),
        ("Policy is set to single-numa-node", "single-numa-node", None, [0, 1], None, "single-numa-node", None),
        ("Policy is set to unknown", "unknown", None, [0, 1], None, None, 'unknown policy: "unknown"'),
        ("Unknown option, best-effort", "best-effort", {"unknown-option": "true"}, [0], None, None,
         'unknown Topology Manager Policy option: "unknown-option"'),
        ("Unknown option, restricted", "restricted", {"unknown-option": "true"}, [0], None, None,
         'unknown Topology Manager Policy option: "unknown-option"'),
        ("can't get NUMA distances", "best-effort", {"prefer-closest-numa-nodes": "true"}, [0], None, None,
         "cannot discover NUMA topology: error getting NUMA distances from cadvisor"),
        ("more than 8 NUMA nodes", "best-effort", None, list(range(9)), None, None,
         "unsupported on machines with more than 8 NUMA Nodes"),
        ("more than 8 NUMA nodes allowed by option", "best-effort", {"max-allowable-numa-nodes": "9"},
         list(range(9)), None, "best-effort", None),
        ("more than the option allows", "restricted", {"max-allowable-numa-nodes": "10"},
         list(range(11)), None, None, "unsupported on machines with more than 10 NUMA Nodes"),
        ("policy none skips every check", "none", {"unknown-option": "x"}, list(range(64)), None, "none", None),
        ("closest with distances", "best-effort", {"prefer-closest-numa-nodes": "true"}, [0, 1],
         {0: [10, 11], 1: [11, 10]}, "best-effort", None),
    ],
)
def test_new_manager(description, policy, options, nodes, distances, expected_policy, error):
    if error is not None:
        with pytest.raises(TopologyManagerError) as err:
            TopologyManager.new(nodes, policy, "container", options, distances)
        assert str(err.value) == error
        return
    manager = TopologyManager.new(nodes, policy, "container", options, distances)
    assert manager.policy.name == expected_policy


@pytest.mark.parametrize(
    "scope, expected, error",
    [("container", "container", None), ("pod", "pod", None), ("unknown", None, 'unknown scope: "unknown"')],
)
def test_manager_scope(scope, expected, error):
    if error:
        with pytest.raises(TopologyManagerError, match=error):
            TopologyManager.new([0], "best-effort", scope)
        return
    assert TopologyManager.new([0], "best-effort", scope).scope.name == expected


class MockProvider:
    """Returns fixed hints; records Allocate calls; can fail Allocate."""

    def __init__(self, hints=None, fail_on: str | None = None):
        self.hints = hints
        self.fail_on = fail_on
        self.allocated: list[str] = []
        self.container_calls = 0
        self.pod_calls = 0

    def get_topology_hints(self, pod, container):
        self.container_calls += 1
        return self.hints

    def get_pod_topology_hints(self, pod):
        self.pod_calls += 1
        return self.hints

    def allocate(self, pod, container):
        if container.name == self.fail_on:
            raise RuntimeError("boom")
        self.allocated.append(container.name)


NUMA = NUMAInfo((0, 1), {0: (10, 11), 1: (11, 10)})
BE, RE, SN = BestEffortPolicy(NUMA), RestrictedPolicy(NUMA), SingleNumaNodePolicy(NUMA)
PREF0 = {"resource": [H((0,), True), H((0, 1), False)]}
PREF01 = {"resource": [H((0,), True), H((1,), True), H((0, 1), False)]}
NOPREF = {"resource": [H((0, 1), False)]}

ADMIT_CASES = [
    ("None policy, no hints", None, [], True),
    ("single-numa-node policy, no hints", SN, [MockProvider()], True),
    ("restricted policy, no hints", RE, [MockProvider()], True),
    ("best-effort, preferred affinity", BE, [MockProvider(PREF0)], True),
    ("best-effort, more than one preferred affinity", BE, [MockProvider(PREF01)], True),
    ("best-effort, no preferred affinity", BE, [MockProvider(NOPREF)], True),
    ("restricted, preferred affinity", RE, [MockProvider(PREF0)], True),
    ("restricted, more than one preferred affinity", RE, [MockProvider(PREF01)], True),
    ("restricted, no preferred affinity", RE, [MockProvider(NOPREF)], False),
    ("single-numa-node, no preferred affinity", SN, [MockProvider(NOPREF)], False),
    ("single-numa-node, preferred single node", SN, [MockProvider(PREF01)], True),
]


@pytest.mark.parametrize("name, policy, providers, admit", ADMIT_CASES, ids=[c[0] for c in ADMIT_CASES])
@pytest.mark.parametrize("scope_kind", ["container", "pod"])
def test_admit(scope_kind, name, policy, providers, admit):
    pod = Pod("uid", (Container("c"),))
    if policy is None:
        scope = NoneScope(providers)
    elif scope_kind == "container":
        scope = ContainerScope(policy, providers)
    else:
        scope = PodScope(policy, providers)
    result = scope.admit(pod).result
    assert result.admit is admit
    if not admit:
        assert result.reason == "TopologyAffinityError"
        assert result.message == "Resources cannot be allocated with Topology locality"


def _pod() -> Pod:
    return Pod(
        "uid",
        containers=(Container("app1"), Container("app2")),
        init_containers=(Container("init1"),),
    )


def test_container_scope_merges_per_container_in_order_and_stores_each_hint():
    provider = MockProvider(PREF0)
    scope = ContainerScope(BE, [provider])
    out = scope.admit(_pod())
    assert out.result.admit
    assert [s.containers for s in out.steps] == [("init1",), ("app1",), ("app2",)]
    assert provider.container_calls == 3 and provider.pod_calls == 0
    assert provider.allocated == ["init1", "app1", "app2"]
    assert scope.get_affinity("uid", "app2") == H((0,), True)
    assert scope.get_affinity("uid", "unknown") == H(None, False)


def test_container_scope_stops_at_first_rejected_container():
    class PerContainer(MockProvider):
        def get_topology_hints(self, pod, container):
            return NOPREF if container.name == "app1" else PREF0

    provider = PerContainer()
    out = ContainerScope(RE, [provider]).admit(_pod())
    assert not out.result.admit and out.failed_container == "app1"
    assert provider.allocated == ["init1"]


def test_pod_scope_merges_once_and_stores_the_hint_for_every_container():
    provider = MockProvider(PREF0)
    scope = PodScope(BE, [provider])
    out = scope.admit(_pod())
    assert out.result.admit and len(out.steps) == 1
    assert out.steps[0].containers == ("init1", "app1", "app2")
    assert provider.pod_calls == 1 and provider.container_calls == 0
    assert all(scope.get_affinity("uid", c) == H((0,), True) for c in ("init1", "app1", "app2"))


def test_pod_scope_rejection_allocates_nothing():
    provider = MockProvider(NOPREF)
    out = PodScope(RE, [provider]).admit(_pod())
    assert not out.result.admit and provider.allocated == []


@pytest.mark.parametrize("scope_cls", [ContainerScope, PodScope])
def test_allocate_error_is_an_unexpected_admission_error(scope_cls):
    provider = MockProvider(PREF0, fail_on="app1")
    out = scope_cls(BE, [provider]).admit(_pod())
    assert out.result.admit is False
    assert out.result.reason == "UnexpectedAdmissionError"
    assert out.result.message == "Allocate failed due to boom, which is unexpected"
    assert out.failed_container == "app1"


def test_none_scope_still_allocates_every_container():
    provider = MockProvider(PREF0)
    scope = NoneScope([provider])
    out = scope.admit(_pod())
    assert out.result.admit and out.steps == []
    assert provider.allocated == ["init1", "app1", "app2"]
    assert provider.container_calls == 0
    assert scope.get_affinity("uid", "app1") == H(None, False)


def test_providers_hints_reach_the_policy_in_provider_order():
    seen = []

    class Spy:
        name = "best-effort"

        def merge(self, providers_hints):
            seen.append(list(providers_hints))
            return H(None, True), True

        def can_admit(self, hint):
            return True

    a, b = MockProvider({"ra": [H((0,), True)]}), MockProvider({"rb": None})
    ContainerScope(Spy(), [a, b]).admit(Pod("uid", (Container("c"),)))
    PodScope(Spy(), [a, b]).admit(Pod("uid", (Container("c"),)))
    assert seen == [[a.hints, b.hints], [a.hints, b.hints]]


def test_manager_options_are_kept():
    m = TopologyManager.new([0, 1], "restricted", "pod", {"prefer-closest-numa-nodes": "true"},
                            {0: [10, 21], 1: [21, 10]})
    assert m.opts == PolicyOptions(prefer_closest_numa=True)
    assert m.numa_info is not None and m.numa_info.distance(0, 1) == 21
