"""Every policy declares its time budget and cuts it to what a request's deadline leaves (allocator.Policy).

What the daemon relies on (plugin/allocation/preferred.py): a search started late gets only the time left,
one started after the deadline gets the greedy answer, and a policy whose own budget is smaller keeps it.
"""

from __future__ import annotations

import pytest

from allocator import AllocationRequest
from allocator.policies import POLICY_NAMES, SHARED_POLICY_NAMES, get_policy
from allocator.policies.base import NO_TIME_S
from allocator.topology import DeviceGraph
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated

ALL = POLICY_NAMES + SHARED_POLICY_NAMES


@pytest.mark.parametrize("name", ALL)
def test_a_policy_declares_its_budget_and_cuts_it(name: str):
    policy = get_policy(name, time_budget_s=0.5)
    assert policy.time_budget_s == 0.5
    assert policy.within(2.0) is policy  # its own budget is smaller: unchanged
    cut = policy.within(0.1)
    assert (cut.time_budget_s, cut.name, type(cut)) == (0.1, policy.name, type(policy))
    assert policy.time_budget_s == 0.5  # a copy: the configured policy is shared by every request
    assert get_policy(name, time_budget_s=None).within(0.1).time_budget_s == 0.1  # no limit: the deadline's


@pytest.mark.parametrize("name", ALL)
def test_no_time_left_means_the_greedy_answer_even_for_a_small_request(name: str):
    late = get_policy(name).within(0.0)
    assert late.time_budget_s == NO_TIME_S
    assert getattr(late, "exact_limit") == 0  # no exact range either


def _gpu_graph() -> DeviceGraph:
    [gpu] = [r for r in build_resources(load_simulated("dgx-h100"), ResourceOptions()) if r.name == "nvidia.com/gpu"]
    return gpu.graph


def test_a_late_search_still_answers_the_request():
    graph = _gpu_graph()
    request = AllocationRequest(available=list(graph.ids), must_include=[], size=4)
    answer = get_policy("numa-first").within(-1.0).allocate(graph, request)
    assert len(answer.ids) == 4 and set(answer.ids) <= set(graph.ids)
