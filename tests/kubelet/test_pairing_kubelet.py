"""GPU–NIC pairing with the real kubelet device manager (Go harness, 1.37 and 1.34), on a simulated DGX H100
(each GPU's NIC on its PCIe switch) and a simulated GB300 tray with ConnectX-8 Data Direct (each GPU's NIC
named by its GPU–NIC complex only: the PCIe path reads NODE for every NIC of a socket).

The kubelet's code makes the calls: pods one at a time, per container its
resources in Go map order (random), GetPreferredAllocation only when it has a
choice, Allocate, init containers' devices reused. The tap records every call
our daemon gets, with the pod and container. Pods ask for g GPUs and g NICs
(g = 1..4), some with an init container, some with two containers, pods
deleted at random (churn). Checked:
- every preferred answer the tap recorded is the spec's optimum (brute force
  of the objectives with partners, `topo_testkit.pairing_oracle`) with the
  partners the spec defines, computed from the tapped call sequence;
- every answer is what the kubelet then assigned (it was used, not replaced);
- what the kubelet finally assigned is paired: each container's GPUs all have
  their own NIC (PIX on the DGX, the complex's on the GB300; on these nodes the
  free GPUs and NICs always allow it);
- both resource orders happened (the kubelet's order is random).

The daemon runs with a long pairing window so that groups end only by the
spec's other rule (a call for a resource already in the group): the harness
admits pods back to back, and the test must not depend on how fast a loaded
machine runs them.
"""

from __future__ import annotations

import random

import pytest
from kubelet_testlib import (
    GPU,
    LONG_PAIRING_WINDOW,
    NIC,
    TAP_DIR,
    call_partners,
    check_admitted_pod,
    check_no_double_assignment,
    check_preferred_calls,
    container_devices,
    daemon_argv,
    discover,
    machine_for,
    start_kubelet,
    start_plugin,
    wait_all,
)
from topo_testkit.pairing_oracle import oracle_for

from allocator.topology import NodeTopology
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated

pytestmark = pytest.mark.timeout(1500)


def own_nic(topology: NodeTopology) -> dict[str, str]:
    """GPU ID (index) -> its own NIC: the one on its PCIe switch (PIX), or the one of its complex."""
    return {str(g.index): n.name for g in topology.gpus for n in topology.nics
            if topology.link(g.name, n.name).label == "PIX" or (g.complex is not None and g.complex == n.complex)}


def pods(seed: int, n: int, capacity: int = 8) -> tuple[list[dict], list[str]]:
    """Admit steps with churn: (steps, names of the pods deleted along the way)."""
    rng = random.Random(seed)
    steps: list[dict] = []
    running: list[tuple[str, int]] = []
    deleted: list[str] = []
    for i in range(n):
        shape = rng.random()
        if shape < 0.2:
            g1, g2 = rng.randint(1, 2), rng.randint(1, 2)
            containers = [{"name": "a", "limits": {GPU: g1, NIC: g1}}, {"name": "b", "limits": {NIC: g2, GPU: g2}}]
            init: list[dict] = []
            need = g1 + g2
        else:
            g = rng.randint(1, 4)
            containers = [{"name": "main", "limits": {GPU: g, NIC: g}}]
            init = [{"name": "init", "limits": {GPU: 1, NIC: 1}, "restartable": False}] if shape < 0.45 else []
            need = g
        # Pods leave at random, and until the next one fits (`capacity` GPUs and as many NICs).
        while running and (rng.random() < 0.3 or sum(u for _, u in running) + need > capacity):
            name, _ = running.pop(rng.randrange(len(running)))
            steps.append({"op": "delete_pod", "name": name})
            deleted.append(name)
        name = f"p{i}"
        steps.append({"op": "admit", "pod": {"name": name, "init_containers": init, "containers": containers}})
        running.append((name, need))
    return steps, deleted


@pytest.mark.parametrize("node,policy,min_partnered", [("dgx-h100", "none", 30), ("dgx-h100", "best-effort", 30),
                                                       ("gb300-cx8-dd", "none", 10)])
def test_every_answer_is_the_spec_optimum_and_every_gpu_gets_its_own_nic(line_harness, tmp_path, node, policy,
                                                                          min_partnered):
    harness = line_harness  # 1.37 (current) and 1.34 (race line): both device managers walk the same way
    topology = load_simulated(node)
    disc = discover(node)
    admits, deleted = pods(seed=7 if policy == "none" else 8, n=40, capacity=len(topology.gpus))
    argv = daemon_argv(node, *LONG_PAIRING_WINDOW, plugin_dir=TAP_DIR)
    steps = [start_kubelet(policy, "container"), {"op": "start_tap", "dir": TAP_DIR}, start_plugin(argv),
             *wait_all(disc, timeout=20), *admits, {"op": "snapshot"}]
    run = harness.run(steps, machine_for(node), tmp_path)

    oracle = oracle_for(topology, build_resources(topology, ResourceOptions(device_id_strategy="index")))
    partners = iter(call_partners(run.rpcs))
    problems: list[str] = []
    with_partners = 0
    for r in run.rpcs:
        if r["method"] != "GetPreferredAllocation" or r.get("error"):
            continue
        p = next(partners)
        with_partners += bool(p)
        req = r["request"][0]
        problem = oracle.check(r["resource"], req["available"], req["must_include"], req["size"], p,
                               r["response"][0])
        if problem:
            problems.append(f"{r['pod']}/{r['container']}: {problem}")
    assert not problems, "\n".join(problems)
    # The paired path was exercised, not just blind answers (a 4-GPU node has fewer choices to make).
    assert with_partners >= min_partnered, with_partners

    own = own_nic(topology)
    assert len(own) == len(topology.gpus) == len(set(own.values()))
    steps_by_pod = run.admits()
    first_resource: set[str] = set()
    for step in steps_by_pod.values():
        assert step["admit"], step
        problems += check_preferred_calls(step) + check_admitted_pod(step)
        for c in step["containers"]:
            gpus, nics = container_devices(c, GPU), container_devices(c, NIC)
            if gpus and nics:
                # DGX H100: GPU i and mlx5_i share a PCIe switch (PIX); GB300: the complex names the NIC.
                paired = {g for g in gpus if own[g] in nics}
                if len(paired) != len(gpus):
                    problems.append(f"{step['pod']}/{c['name']}: GPUs {sorted(gpus)} with NICs {sorted(nics)}")
            calls = [r["resource"] for r in step["rpcs"] if r["container"] == c["name"]]
            if calls and not c["init"]:
                first_resource.add(calls[0])
    problems += check_no_double_assignment(list(steps_by_pod.values()), deleted=deleted)
    assert not problems, "\n".join(problems)
    assert first_resource == {GPU, NIC}, first_resource  # the kubelet walked both orders
