"""Policy merge cases ported from the kubelet's policy_test.go and the per-policy tests.

The tables keep the kubelet's case names; `DEFAULT` stands for the machine's
full mask (the kubelet's `NewTestBitMask(numaNodes...)`).
"""

from __future__ import annotations

import pytest

from allocator.topologymanager import (
    BestEffortPolicy,
    BitMask,
    NonePolicy,
    NUMAInfo,
    PolicyOptions,
    RestrictedPolicy,
    SingleNumaNodePolicy,
    TopologyHint,
    filter_single_numa_hints,
)

DEFAULT = "default"


def H(bits, preferred):
    return TopologyHint(None if bits is None else BitMask.of(*bits), preferred)


def numa_two() -> NUMAInfo:
    return NUMAInfo((0, 1), {0: (10, 11), 1: (11, 10)})


def numa_four() -> NUMAInfo:
    rows = {0: (10, 11, 12, 12), 1: (11, 10, 12, 12), 2: (12, 12, 10, 11), 3: (12, 12, 11, 10)}
    return NUMAInfo((0, 1, 2, 3), rows)


def numa_eight() -> NUMAInfo:
    rows = {
        0: (10, 11, 12, 12, 30, 30, 30, 30),
        1: (11, 10, 12, 12, 30, 30, 30, 30),
        2: (12, 12, 10, 11, 30, 30, 30, 30),
        3: (12, 12, 11, 10, 30, 30, 30, 30),
        4: (30, 30, 30, 30, 10, 11, 12, 12),
        5: (30, 30, 30, 30, 11, 10, 12, 12),
        6: (30, 30, 30, 30, 12, 12, 10, 11),
        7: (30, 30, 30, 30, 12, 12, 13, 10),
    }
    return NUMAInfo(tuple(range(8)), rows)


# (name, providers, expected bits or DEFAULT or None, expected preferred)
COMMON = [
    ("Two providers, 1 hint each, same mask, both preferred 1/2",
     [{"resource1": [H((0,), True)]}, {"resource2": [H((0,), True)]}], (0,), True),
    ("Two providers, 1 hint each, same mask, both preferred 2/2",
     [{"resource1": [H((1,), True)]}, {"resource2": [H((1,), True)]}], (1,), True),
    ("Two providers, 1 no hints, 1 single hint preferred 1/2",
     [None, {"resource": [H((0,), True)]}], (0,), True),
    ("Two providers, 1 no hints, 1 single hint preferred 2/2",
     [None, {"resource": [H((1,), True)]}], (1,), True),
    ("Two providers, 1 with 2 hints, 1 with single hint matching 1/2",
     [{"resource1": [H((0,), True), H((1,), True)]}, {"resource2": [H((0,), True)]}], (0,), True),
    ("Two providers, 1 with 2 hints, 1 with single hint matching 2/2",
     [{"resource1": [H((0,), True), H((1,), True)]}, {"resource2": [H((1,), True)]}], (1,), True),
    ("Two providers, both with 2 hints, matching narrower preferred hint from both",
     [{"resource1": [H((0,), True), H((1,), True)]}, {"resource2": [H((0,), True), H((0, 1), False)]}],
     (0,), True),
    ("Ensure less narrow preferred hints are chosen over narrower non-preferred hints",
     [{"resource1": [H((1,), True), H((0, 1), False)]},
      {"resource2": [H((0,), True), H((1,), True), H((0, 1), False)]}], (1,), True),
    ("Multiple resources, same provider",
     [{"resource1": [H((1,), True), H((0, 1), False)],
       "resource2": [H((0,), True), H((1,), True), H((0, 1), False)]}], (1,), True),
]

BNP_RESOURCE1 = {"resource1": [H((0, 1, 2, 3), False), H((0, 1), False)]}

BEST_EFFORT = [
    ("Two providers, 2 hints each, same mask (some with different bits), same preferred",
     [{"resource1": [H((0, 1), True), H((0, 2), True)]}, {"resource2": [H((0, 1), True), H((0, 2), True)]}],
     (0, 1), True),
    ("TopologyHint not set", [], DEFAULT, True),
    ("HintProvider returns empty non-nil map[string][]TopologyHint", [{}], DEFAULT, True),
    ("HintProvider returns -nil map[string][]TopologyHint from provider", [{"resource": None}], DEFAULT, True),
    ("HintProvider returns empty non-nil map[string][]TopologyHint from provider",
     [{"resource": []}], DEFAULT, False),
    ("Single TopologyHint with Preferred as true and NUMANodeAffinity as nil",
     [{"resource": [H(None, True)]}], DEFAULT, True),
    ("Single TopologyHint with Preferred as false and NUMANodeAffinity as nil",
     [{"resource": [H(None, False)]}], DEFAULT, False),
    ("Two providers, 1 hint each, no common mask",
     [{"resource1": [H((0,), True)]}, {"resource2": [H((1,), True)]}], DEFAULT, False),
    ("Two providers, 1 hint each, same mask, 1 preferred, 1 not 1/2",
     [{"resource1": [H((0,), True)]}, {"resource2": [H((0,), False)]}], (0,), False),
    ("Two providers, 1 hint each, same mask, 1 preferred, 1 not 2/2",
     [{"resource1": [H((1,), True)]}, {"resource2": [H((1,), False)]}], (1,), False),
    ("Two providers, 1 hint each, 1 wider mask, both preferred 1/2",
     [{"resource1": [H((0,), True)]}, {"resource2": [H((0, 1), True)]}], (0,), False),
    ("Two providers, 1 with 2 hints, 1 with single non-preferred hint matching",
     [{"resource1": [H((0,), True), H((1,), True)]}, {"resource2": [H((0, 1), False)]}], (0,), False),
    ("Two providers, 1 hint each, 1 wider mask, both preferred 2/2",
     [{"resource1": [H((1,), True)]}, {"resource2": [H((0, 1), True)]}], (1,), False),
    ("bestNonPreferredAffinityCount (1)", [BNP_RESOURCE1, {"resource2": [H((0, 1), False)]}], (0, 1), False),
    ("bestNonPreferredAffinityCount (2)", [BNP_RESOURCE1, {"resource2": [H((0, 3), False)]}], (0, 3), False),
    ("bestNonPreferredAffinityCount (3)", [BNP_RESOURCE1, {"resource2": [H((1, 2), False)]}], (1, 2), False),
    ("bestNonPreferredAffinityCount (4)", [BNP_RESOURCE1, {"resource2": [H((2, 3), False)]}], (2, 3), False),
]

BNP5 = [BNP_RESOURCE1, {"resource2": [H((1, 2), False), H((2, 3), False)]}]
BNP6 = [BNP_RESOURCE1, {"resource2": [H((1, 2, 3), False), H((1, 2), False), H((1, 3), False), H((2, 3), False)]}]

NO_POLICY_OPTIONS = [
    ("bestNonPreferredAffinityCount (5)", BNP5, (1, 2), False),
    ("bestNonPreferredAffinityCount (6)", BNP6, (1, 2), False),
]

CLOSEST_NUMA = [
    ("Two providers, 2 hints each, same mask (some with different bits), same preferred",
     [{"resource1": [H((0, 4), True), H((0, 2), True)]}, {"resource2": [H((0, 4), True), H((0, 2), True)]}],
     (0, 2), True),
    ("Two providers, 2 hints each, different mask",
     [{"resource1": [H((4,), True), H((0, 2), True)]}, {"resource2": [H((4,), True), H((0, 2), True)]}],
     (4,), True),
    ("bestNonPreferredAffinityCount (5)", BNP5, (2, 3), False),
    ("bestNonPreferredAffinityCount (6)", BNP6, (2, 3), False),
]

SINGLE_NUMA = [
    ("TopologyHint not set", [], None, True),
    ("HintProvider returns empty non-nil map[string][]TopologyHint", [{}], None, True),
    ("HintProvider returns -nil map[string][]TopologyHint from provider", [{"resource": None}], None, True),
    ("HintProvider returns empty non-nil map[string][]TopologyHint from provider", [{"resource": []}], None, False),
    ("Single TopologyHint with Preferred as true and NUMANodeAffinity as nil",
     [{"resource": [H(None, True)]}], None, True),
    ("Single TopologyHint with Preferred as false and NUMANodeAffinity as nil",
     [{"resource": [H(None, False)]}], None, False),
    ("Two providers, 1 hint each, no common mask",
     [{"resource1": [H((0,), True)]}, {"resource2": [H((1,), True)]}], None, False),
    ("Two providers, 1 hint each, same mask, 1 preferred, 1 not 1/2",
     [{"resource1": [H((0,), True)]}, {"resource2": [H((0,), False)]}], None, False),
    ("Two providers, 1 hint each, same mask, 1 preferred, 1 not 2/2",
     [{"resource1": [H((1,), True)]}, {"resource2": [H((1,), False)]}], None, False),
    ("Two providers, 1 with 2 hints, 1 with single non-preferred hint matching",
     [{"resource1": [H((0,), True), H((1,), True)]}, {"resource2": [H((0, 1), False)]}], None, False),
    ("Single NUMA hint generation",
     [{"resource1": [H((0, 1), True)], "resource2": [H((0,), True), H((1,), True), H((0, 1), False)]}],
     None, False),
    ("One no-preference provider",
     [{"resource1": [H((0,), True), H((1,), True), H((0, 1), False)]}, None], (0,), True),
]


def _expected(numa: NUMAInfo, bits, preferred) -> TopologyHint:
    if bits == DEFAULT:
        return TopologyHint(numa.default_affinity_mask(), preferred)
    return H(bits, preferred)


def _ids(cases):
    return [c[0] for c in cases]


@pytest.mark.parametrize("name, providers, bits, preferred", COMMON + BEST_EFFORT + NO_POLICY_OPTIONS,
                         ids=_ids(COMMON + BEST_EFFORT + NO_POLICY_OPTIONS))
@pytest.mark.parametrize("policy_cls", [BestEffortPolicy, RestrictedPolicy])
def test_best_effort_and_restricted_merge(policy_cls, name, providers, bits, preferred):
    numa = numa_four()
    policy = policy_cls(numa, PolicyOptions())
    best, admit = policy.merge(providers)
    assert best == _expected(numa, bits, preferred)
    # best-effort always admits; restricted admits exactly the preferred results.
    assert admit is (True if policy_cls is BestEffortPolicy else preferred)


@pytest.mark.parametrize("name, providers, bits, preferred", COMMON + BEST_EFFORT + CLOSEST_NUMA,
                         ids=_ids(COMMON + BEST_EFFORT + CLOSEST_NUMA))
@pytest.mark.parametrize("policy_cls", [BestEffortPolicy, RestrictedPolicy])
def test_best_effort_and_restricted_merge_closest_numa(policy_cls, name, providers, bits, preferred):
    numa = numa_eight()
    policy = policy_cls(numa, PolicyOptions(prefer_closest_numa=True))
    best, _ = policy.merge(providers)
    assert best == _expected(numa, bits, preferred)


@pytest.mark.parametrize("name, providers, bits, preferred", COMMON + SINGLE_NUMA, ids=_ids(COMMON + SINGLE_NUMA))
@pytest.mark.parametrize("numa_factory", [numa_two, numa_four])
def test_single_numa_node_merge(numa_factory, name, providers, bits, preferred):
    numa = numa_factory()
    best, admit = SingleNumaNodePolicy(numa, PolicyOptions()).merge(providers)
    assert best == _expected(numa, bits, preferred)
    assert admit is preferred


def test_single_numa_node_ignores_prefer_closest():
    # With closest-NUMA, best-effort on 8 nodes picks {2,3} for case (5); the
    # single-numa-node policy only ever sees single-node hints, so the option
    # cannot matter - and it is never consulted.
    numa = numa_eight()
    providers = [{"r1": [H((5,), True), H((4,), True)]}, {"r2": [H((4,), True), H((5,), True)]}]
    with_opt, _ = SingleNumaNodePolicy(numa, PolicyOptions(prefer_closest_numa=True)).merge(providers)
    without, _ = SingleNumaNodePolicy(numa, PolicyOptions()).merge(providers)
    assert with_opt == without == H((4,), True)


def test_single_numa_node_on_one_node_machine_reports_dont_care():
    best, admit = SingleNumaNodePolicy(NUMAInfo((0,)), PolicyOptions()).merge([{"r": [H((0,), True)]}])
    assert best == H(None, True) and admit


@pytest.mark.parametrize(
    "name, resources, expected",
    [
        ("filter empty resources", [], []),
        ("filter hints with nil socket mask 1/2",
         [[H(None, False)], [H(None, True)]],
         [[], [H(None, True)]]),
        ("filter hints with nil socket mask 2/2",
         [[H((0,), True), H(None, False)], [H((1,), True), H(None, True)]],
         [[H((0,), True)], [H((1,), True), H(None, True)]]),
        ("filter hints with empty resource socket mask",
         [[H((1,), True), H((0,), True), H(None, False)], []],
         [[H((1,), True), H((0,), True)], []]),
        ("filter hints with wide sockemask",
         [[H((0,), True), H((1,), True), H((1, 2), False), H((0, 1, 2), False), H(None, False)],
          [H((1, 2), False), H((0, 1, 2), False), H((0, 2), False), H((3,), False)],
          [H((1, 2), False), H((0, 1, 2), False), H((0, 2), False)]],
         [[H((0,), True), H((1,), True)], [], []]),
    ],
)
def test_filter_single_numa_hints(name, resources, expected):
    assert filter_single_numa_hints(resources) == expected


@pytest.mark.parametrize(
    "policy, hint, admit",
    [
        (BestEffortPolicy(numa_two()), H(None, False), True),
        (BestEffortPolicy(numa_two()), H(None, True), True),
        (RestrictedPolicy(numa_two()), H(None, False), False),
        (RestrictedPolicy(numa_two()), H(None, True), True),
        (SingleNumaNodePolicy(numa_two()), H(None, False), False),
        (SingleNumaNodePolicy(numa_two()), H(None, True), True),
        (NonePolicy(), H(None, False), True),
        (NonePolicy(), H(None, True), True),
    ],
)
def test_can_admit(policy, hint, admit):
    assert policy.can_admit(hint) is admit


@pytest.mark.parametrize(
    "providers",
    [[], [{"resource": [H((0, 1), True)]}], [{"resource": [H((0, 1), False)]}]],
)
def test_none_policy_merge_is_zero_hint_and_admits(providers):
    assert NonePolicy().merge(providers) == (H(None, False), True)


@pytest.mark.parametrize(
    "policy, name",
    [
        (NonePolicy(), "none"),
        (BestEffortPolicy(numa_two()), "best-effort"),
        (RestrictedPolicy(numa_two()), "restricted"),
        (SingleNumaNodePolicy(numa_two()), "single-numa-node"),
    ],
)
def test_policy_names(policy, name):
    assert policy.name == name
