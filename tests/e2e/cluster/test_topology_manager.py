"""The offline model against a live cluster: `explain` predicts what the kubelet does.

The kubelet runs the Topology Manager (`single-numa-node`, then `restricted` after a
restart) and the static CPU manager, and sees the simulated node's NUMA layout: a private
/sys/devices/system/node in its mount namespace with NUMA nodes 0 and 1, this machine's
CPUs split over them, and the node's distance matrix (this VM itself has one NUMA node).
For a sequence of pods, each pod's admission or rejection (TopologyAffinityError) and the
devices its container got are compared with what `topo-device-plugin explain` predicts
for that node, that policy and the devices the earlier pods hold.

Guaranteed pods with whole CPUs bring the CPU manager's hints into the merge. `explain`
models only the device manager's hints, so those pods are checked against the rule instead:
the exclusive CPU and the GPU share one NUMA node; and when that node has no free GPU left,
the pod is rejected although the device hints alone would admit it on the other node.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from cluster_fixtures import numa_layout, start_cluster
from workloads import (
    GPU,
    NIC,
    Node,
    chart_values,
    check_runtime_delivered,
    container_devices,
    delete_pod,
    delete_workloads,
    explain,
    held_devices,
    helm_upgrade,
    promised,
    report,
    wait_allocatable,
    wait_daemon_ready,
    wait_kubelet_synced,
    wait_settled,
    workload,
)

pytestmark = pytest.mark.timeout(1800)

# Each step: pod name, limits, and whether it is deleted once observed. A pod of 5 GPUs (or 5
# NICs) needs both NUMA nodes: single-numa-node rejects it, restricted admits it (both nodes
# are the narrowest fit). The 5-GPU pod goes again at once so that both policies then see
# the same free devices; the later pods fit or do not fit one NUMA node depending on what
# the earlier ones hold. Every pod also fits the node's free count, so the scheduler places it.
SEQUENCE: list[tuple[str, dict[str, int], bool]] = [
    ("w-gpu5", {GPU: 5}, True),
    ("a-gpu2", {GPU: 2}, False),
    ("b-gpu3-nic1", {GPU: 3, NIC: 1}, False),
    ("c-gpu3", {GPU: 3}, False),
    ("d-gpu1-nic2", {GPU: 1, NIC: 2}, False),
    ("v-nic5", {NIC: 5}, False),
    ("f-gpu1", {GPU: 1}, False),
]
POLICIES = ["single-numa-node", "restricted"]


@pytest.fixture(scope="module")
def tm(tmp_path_factory, cluster_inputs):
    node = Node.make(tmp_path_factory.mktemp("node"))
    numa, distances = node.numa_nodes()
    layout = numa_layout(numa)
    for c in start_cluster(tmp_path_factory, cluster_inputs, layout, distances, tm_policy=POLICIES[0],
                           cpu_policy="static"):
        # No CPU request for the plugin: with 2 CPUs and CPU 0 reserved, the Guaranteed pod's
        # one exclusive CPU is all the node can allocate (null removes the chart's default).
        resources = {"requests": {"cpu": None, "memory": "64Mi"}, "limits": {"memory": "128Mi"}}
        helm_upgrade(c, chart_values(cluster_inputs["image"].ref, node, resources=resources))
        wait_daemon_ready(c)
        wait_allocatable(c, {GPU: "8", NIC: "8"})
        yield {"c": c, "node": node, "image": cluster_inputs["image"].ref, "layout": layout, "results": {}}


def test_the_kubelet_sees_the_simulated_numa_layout(tm):
    """cadvisor's view is the private sysfs: two NUMA nodes, as the simulated node has."""
    c = tm["c"]
    pr = c.podresources()
    numa_of_devices = {n for devs in pr["allocatable"].values() for nodes in devs.values() for n in nodes}
    assert numa_of_devices == {0, 1}
    # The static CPU manager took its topology from the same view: CPU 0 reserved, the rest per NUMA node.
    state = c.cpu_manager_state()
    assert state.get("policyName") == "static", state
    # The sysfs the kubelet reads inside its mount namespace is the private one.
    nodes = c.sb.sh("ls", "/sys/devices/system/node").stdout.split()
    assert sorted(n for n in nodes if n.startswith("node")) == [f"node{n}" for n in sorted(tm["layout"])]


def switch_policy(tm: dict[str, Any], policy: str) -> None:
    """Restart the kubelet with `policy` (if needed) and start from a node without workloads.

    Devices of pods deleted before a restart stay in the device manager's checkpoint, and
    the restarted kubelet counts them as allocated until it has handled one pod update
    (wait_kubelet_synced): `explain` cannot know that, so the sequence starts after it.
    """
    c = tm["c"]
    delete_workloads(c)
    if c.tm_policy != policy:
        c.stop_kubelet()
        c.start_kubelet(tm_policy=policy)
        wait_allocatable(c, {GPU: "8", NIC: "8"})
        wait_kubelet_synced(c, tm["image"])


def _run_sequence(tm: dict[str, Any], policy: str) -> list[dict[str, Any]]:
    c, node = tm["c"], tm["node"]
    switch_policy(tm, policy)
    out = []
    for name, limits, delete_after in SEQUENCE:
        held = held_devices(c.podresources())
        # The kubelet walks a container's resources in Go map order (random), and with GPU–NIC
        # pairing the second resource's answer depends on the first's devices: one prediction
        # per order; the live result must be one of them.
        orders = [dict(p) for p in itertools.permutations(limits.items())]
        wants = [explain(node, policy, o, held) for o in orders]
        want = wants[0]
        c.apply(workload(name, tm["image"], limits))
        pod = wait_settled(c, name)
        st = pod["status"]
        got = container_devices(c.podresources(), name)
        devices = {r: sorted(d) for r, d in got.items()}
        for w in wants:  # the prediction for the order the kubelet took, when one matches
            if {a["resource"]: sorted(a["devices"]) for a in w["allocations"] if a["devices"]} == devices:
                want = w
        out.append({"name": name, "limits": limits, "held": held, "explain": want, "phase": st["phase"],
                    "orders_agree_on_admission": len({w["admit"] for w in wants}) == 1,
                    "reason": st.get("reason"), "message": st.get("message"),
                    "devices": devices,
                    "uid": pod["metadata"]["uid"],
                    "delivered": check_runtime_delivered(report(c, name), promised(c, pod["metadata"]["uid"]))
                    if st["phase"] == "Running" else []})
        if delete_after:
            delete_pod(c, name)
    return out


@pytest.mark.parametrize("policy", POLICIES)
def test_admissions_and_devices_are_what_explain_predicts(tm, policy):
    seq = _run_sequence(tm, policy)
    tm["results"][policy] = seq
    table = "\n".join(f"  {s['name']}: {s['phase']} {s['reason'] or ''} {s['devices']} "
                      f"(explain: {'admit' if s['explain']['admit'] else 'reject'} "
                      f"{ {a['resource']: a['devices'] for a in s['explain']['allocations']} })" for s in seq)
    print(f"\n{policy}:\n{table}")
    for s in seq:
        want = s["explain"]
        assert s["orders_agree_on_admission"], s  # the resource order never changes the admission
        # The comparison is exact only where the kubelet's choice is not random.
        assert not any(a["arbitrary"] for a in want["allocations"]), f"{s['name']}: explain says arbitrary"
        if want["admit"]:
            assert s["phase"] == "Running", f"{s['name']}: explain admits, the kubelet: {s}\n{table}"
            assert s["devices"] == {a["resource"]: sorted(a["devices"]) for a in want["allocations"]
                                    if a["devices"]}, f"{s['name']}\n{table}"
            assert s["delivered"] == [], s["name"]
        else:
            assert s["phase"] == "Failed", f"{s['name']}: explain rejects, the kubelet: {s}\n{table}"
            assert s["reason"] == want["reason"] == "TopologyAffinityError", s
            assert s["devices"] == {}
    # The sequence exercises both outcomes under each policy.
    assert {s["phase"] for s in seq} == {"Running", "Failed"}


def test_policies_differ_where_the_model_says(tm):
    res = tm["results"]
    if set(res) != set(POLICIES):
        pytest.fail("the per-policy sequences did not both run")
    phases = {p: {s["name"]: s["phase"] for s in res[p]} for p in POLICIES}
    differ = {n for n in phases[POLICIES[0]] if phases["single-numa-node"][n] != phases["restricted"][n]}
    assert differ == {"w-gpu5", "v-nic5"}, phases
    assert all(phases["restricted"][n] == "Running" for n in differ)


@pytest.mark.parametrize("policy", POLICIES)
def test_guaranteed_pod_gets_cpus_and_gpu_on_one_numa_node(tm, policy):
    """Static CPU manager: exclusive CPUs come from non-reserved CPUs (CPU 0 is reserved)."""
    c = tm["c"]
    switch_policy(tm, policy)
    exclusive_numa = [n for n, cpus in tm["layout"].items() if any(cpu != 0 for cpu in cpus)]
    if not exclusive_numa:
        pytest.fail(f"no CPU besides the reserved CPU 0 on this machine ({tm['layout']})")
    name = f"g-{policy}"
    c.apply(workload(name, tm["image"], {"cpu": 1, "memory": "64Mi", GPU: 1}, guaranteed=True))
    pod = wait_settled(c, name)
    assert pod["status"]["phase"] == "Running", pod["status"]
    rep = report(c, name)
    cpus = rep["cpus"]
    assert len(cpus) == 1 and cpus[0] != 0, f"expected one exclusive CPU, got {cpus}"
    state = c.cpu_manager_state()
    assert state["entries"][pod["metadata"]["uid"]]["main"] == str(cpus[0])
    cpu_numa = next(n for n, cs in tm["layout"].items() if cpus[0] in cs)
    gpus = container_devices(c.podresources(), name)[GPU]
    assert [numa for numa in gpus.values()] == [[cpu_numa]], f"CPU {cpus[0]} on NUMA {cpu_numa}, GPU {gpus}"
    delete_workloads(c)

    # Now every GPU of the exclusive CPU's NUMA node is taken and the other node's are free:
    # the device hints alone would admit the pod (on the other node), the CPU hints forbid it.
    filler = [f"fill-{n}" for n in range(2)]
    for f in filler:
        c.apply(workload(f, tm["image"], {GPU: 4}))
        assert wait_settled(c, f)["status"]["phase"] == "Running"
    keep = next(f for f in filler if set(sum(container_devices(c.podresources(), f)[GPU].values(), [])) == {cpu_numa})
    for f in filler:
        if f != keep:
            delete_pod(c, f)
    name = f"g2-{policy}"
    c.apply(workload(name, tm["image"], {"cpu": 1, "memory": "64Mi", GPU: 1}, guaranteed=True))
    st = wait_settled(c, name)["status"]
    assert st["phase"] == "Failed" and st.get("reason") == "TopologyAffinityError", st
    delete_workloads(c)
