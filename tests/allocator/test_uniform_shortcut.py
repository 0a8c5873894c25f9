"""The shortcut that answers a GPU request without a search when every two available GPUs share one link
(`gpu.uniform_lowest`: NVSwitch nodes such as the DGX A100 and H100; up to 16 GPUs the subset tables
answer first, so the shortcut is checked on its own as well as through the policies).

Requests where it applies (NVSwitch nodes, and generated nodes with one weight everywhere, some
NUMA nodes unknown) are compared with the brute-force oracle of the spec for both GPU policies,
with must-include; on nodes where one pair differs it must not apply, and the search answers.
"""

from __future__ import annotations

import random

import pytest

from allocator.policies import get_policy
from allocator.policies.gpu import uniform_lowest
from allocator.policies.problem import Problem
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated

from alloc_testlib import brute_force, graph, ids, random_graph, request

POLICIES = ("numa-first", "link-first")


def uniform_graph(rng: random.Random, n: int):
    """One link weight between every two GPUs; NUMA nodes random, some unknown."""
    weight = rng.choice((100, 1200, 1800))
    numa = [None if rng.random() < 0.2 else rng.randrange(3) for _ in range(n)]
    return graph(n, {(a, b): weight for a in range(n) for b in range(a + 1, n)}, numa, prefix="G")


def random_request(rng: random.Random, g):
    n = len(g.ids)
    available = sorted(rng.sample(range(n), rng.randint(2, n)))
    size = rng.randint(1, len(available))
    must = sorted(rng.sample(available, rng.randint(0, min(size, 2))))
    return request(g, available, must, size)


@pytest.mark.parametrize("node", ["dgx-a100", "dgx-h100"])
def test_on_nvswitch_nodes_the_shortcut_answers_every_request_as_the_oracle(node):
    g = build_resources(load_simulated(node), ResourceOptions(device_id_strategy="index"))[0].graph
    rng = random.Random(node)
    for _ in range(150):
        req = random_request(rng, g)
        forced = uniform_lowest(Problem.build(g, req))
        assert forced is not None
        for name in POLICIES:
            want = brute_force(g, name, req)
            # The shortcut itself (up to 16 GPUs the policy answers from its subset tables first).
            assert ids(g, forced) == want, (name, req)
            got = get_policy(name).allocate(g, req)
            assert got.ids == want and got.optimal, (name, req)


@pytest.mark.parametrize("seed", range(30))
def test_on_uniform_nodes_with_unknown_numa_the_shortcut_is_the_oracle(seed):
    rng = random.Random(seed)
    g = uniform_graph(rng, rng.randint(2, 10))
    for _ in range(10):
        req = random_request(rng, g)
        forced = uniform_lowest(Problem.build(g, req))
        assert forced is not None
        for name in POLICIES:
            want = brute_force(g, name, req)
            assert ids(g, forced) == want, (name, req)
            assert get_policy(name).allocate(g, req).ids == want, (name, req)


@pytest.mark.parametrize("seed", range(10))
def test_one_different_link_sends_the_request_to_the_search(seed):
    rng = random.Random(seed)
    g = random_graph(rng, 8)
    available = list(range(8))
    if len({g.weights[a][b] for a in available for b in available if a < b}) == 1:
        pytest.fail("the generated node has one weight everywhere; pick another seed")
    req = request(g, available, [], 4)
    assert uniform_lowest(Problem.build(g, req)) is None
    for name in POLICIES:
        assert get_policy(name).allocate(g, req).ids == brute_force(g, name, req)
