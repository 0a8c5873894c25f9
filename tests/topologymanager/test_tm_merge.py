"""HintMerger cases ported from the kubelet's policy_test.go
(TestMaxOfMinAffinityCounts, TestCompareHintsNarrowest) plus filter/permutation rules."""

from __future__ import annotations

import pytest

from allocator.topologymanager import (
    BitMask,
    HintMerger,
    NUMAInfo,
    TopologyHint,
    filter_providers_hints,
    max_of_min_affinity_counts,
    merge_permutation,
)


def H(bits, preferred):
    return TopologyHint(None if bits is None else BitMask.of(*bits), preferred)


@pytest.mark.parametrize(
    "hints, expected",
    [
        ([], 0),
        ([[H((), True)]], 0),
        ([[H((0,), True)]], 1),
        ([[H((0, 1), True)]], 2),
        ([[H((0, 1), True), H((0, 1, 2), True)]], 2),
        ([[H((0, 1), True), H((0, 1, 2), True)], [H((0, 1, 2), True)]], 3),
        ([[H((0, 1), True), H((0, 1, 2), True)], [H((0, 1, 2), True), H((0, 1, 2, 3), True)]], 3),
        # nil masks are ignored when looking for a provider's narrowest.
        ([[H(None, True)], [H((0, 1), False)]], 2),
    ],
)
def test_max_of_min_affinity_counts(hints, expected):
    assert max_of_min_affinity_counts(hints) == expected


C, D = "current", "candidate"
COMPARE_CASES = [
    ("candidate count == 0 (1)", -1, None, H((), False), C),
    ("candidate count == 0 (2)", -1, H((), True), H((), False), C),
    ("current == nil (1)", -1, None, H((0,), True), D),
    ("current == nil (2)", -1, None, H((0,), False), D),
    ("!current.Preferred && candidate.Preferred", -1, H((0,), False), H((0,), True), D),
    ("current.Preferred && !candidate.Preferred", -1, H((0,), True), H((0,), False), C),
    ("both preferred (1)", -1, H((0,), True), H((0,), True), C),
    ("both preferred (2)", -1, H((0, 1), True), H((0,), True), D),
    ("both preferred (3)", -1, H((0,), True), H((0, 1), True), C),
    ("neither preferred (1.1)", 1, H((0, 1), False), H((0, 1), False), C),
    ("neither preferred (1.2)", 1, H((1, 2), False), H((0, 1), False), D),
    ("neither preferred (1.3)", 1, H((0, 1), False), H((1, 2), False), C),
    ("neither preferred (2.1)", 2, H((0, 1), False), H((0,), False), C),
    ("neither preferred (2.2)", 2, H((0, 1), False), H((0, 1), False), C),
    ("neither preferred (2.3)", 2, H((1, 2), False), H((0, 1), False), D),
    ("neither preferred (2.4)", 2, H((0, 1), False), H((1, 2), False), C),
    ("neither preferred (3a)", 2, H((0,), False), H((0, 1, 2), False), C),
    ("neither preferred (3b)", 2, H((0,), False), H((0, 1), False), D),
    ("neither preferred (3ca.1)", 3, H((0,), False), H((0, 1), False), D),
    ("neither preferred (3ca.2)", 3, H((0,), False), H((1, 2), False), D),
    ("neither preferred (3ca.3)", 4, H((0, 1), False), H((1, 2, 3), False), D),
    ("neither preferred (3cb)", 4, H((1, 2, 3), False), H((0, 1), False), C),
    ("neither preferred (3cc.1)", 4, H((0, 1, 2), False), H((0, 1, 2), False), C),
    ("neither preferred (3cc.2)", 4, H((0, 1, 2), False), H((1, 2, 3), False), C),
    ("neither preferred (3cc.3)", 4, H((1, 2, 3), False), H((0, 1, 2), False), D),
]


@pytest.mark.parametrize("description, target, current, candidate, expected", COMPARE_CASES)
def test_compare_hints_narrowest(description, target, current, candidate, expected):
    merger = HintMerger(NUMAInfo(()), [], "best-effort")
    merger.best_non_preferred_affinity_count = target
    got = merger.compare(current, candidate)
    assert got is (current if expected == C else candidate)


def test_filter_providers_hints_makes_dont_care_explicit():
    providers = [
        None,  # a provider with no hints at all
        {},  # an empty mapping: same
        {"a": None, "b": [], "c": [H((0,), True)]},
    ]
    assert filter_providers_hints(providers) == [
        [H(None, True)],
        [H(None, True)],
        [H(None, True)],
        [H(None, False)],
        [H((0,), True)],
    ]


@pytest.mark.parametrize(
    "permutation, expected",
    [
        ([H((0,), True), H((0,), True)], H((0,), True)),
        # Preferred only if all non-nil masks are the same, even if the AND is narrower.
        ([H((0,), True), H((0, 1), True)], H((0,), False)),
        ([H(None, True), H((1,), True)], H((1,), True)),
        ([H(None, True), H(None, True)], H((0, 1), True)),
        ([H((0,), True), H((1,), True)], H((), False)),
        ([H((0, 1), True), H((0, 1), False)], H((0, 1), False)),
    ],
)
def test_merge_permutation(permutation, expected):
    assert merge_permutation(BitMask.of(0, 1), permutation) == expected


def test_merge_with_nothing_is_default_not_preferred():
    numa = NUMAInfo((0, 1))
    assert HintMerger(numa, [[H((0,), True)], [H((1,), True)]]).merge() == H((0, 1), False)
    assert HintMerger(numa, [[]]).merge() == H((0, 1), False)
