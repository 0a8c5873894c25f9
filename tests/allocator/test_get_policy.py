"""`get_policy`: the four names, defaults, options, and clear errors."""

from __future__ import annotations

import pytest

import allocator
from allocator.policies import (
    DEFAULT_GPU_POLICY,
    DEFAULT_NIC_POLICY,
    POLICY_NAMES,
    get_policy,
)
from allocator.request import AllocationRequest

from alloc_testlib import nvswitch


def test_names_and_defaults() -> None:
    assert POLICY_NAMES == ("numa-first", "link-first", "spread", "packed")
    assert DEFAULT_GPU_POLICY == "numa-first" and DEFAULT_NIC_POLICY == "spread"
    for name in POLICY_NAMES:
        assert get_policy(name).name == name


def test_exported_from_allocator_package() -> None:
    assert allocator.get_policy is get_policy
    assert allocator.POLICY_NAMES == POLICY_NAMES


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError) as err:
        get_policy("best-effort")
    msg = str(err.value)
    assert "best-effort" in msg
    for name in POLICY_NAMES:
        assert name in msg


def test_options() -> None:
    p = get_policy("numa-first", time_budget_s=0.5, exact_limit=8)
    assert p.time_budget_s == 0.5 and p.exact_limit == 8
    assert get_policy("spread", time_budget_s=None).time_budget_s is None
    assert get_policy("link-first").time_budget_s == 0.020


@pytest.mark.parametrize("options", [{"budget": 1}, {"time_budget_s": 0}, {"time_budget_s": -1.0},
                                     {"exact_limit": -1}])
def test_bad_options(options: dict) -> None:
    with pytest.raises(ValueError):
        get_policy("numa-first", **options)


def test_policies_are_reusable_and_stateless() -> None:
    """One policy object serves many requests on different graphs (servers keep one per resource)."""
    p = get_policy("numa-first")
    g8, g4 = nvswitch(8), nvswitch(4)
    a = p.allocate(g8, AllocationRequest.of(g8.ids, [], 3))
    p.allocate(g4, AllocationRequest.of(g4.ids, [], 2))
    assert p.allocate(g8, AllocationRequest.of(g8.ids, [], 3)) == a
