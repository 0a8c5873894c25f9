"""GPU–NIC pairing on a live cluster: each GPU gets the NIC on its own PCIe switch.

The chart serves a simulated DGX H100 (GPU i and NIC mlx5_i share a PCIe switch: `PIX`;
every other GPU–NIC pair is `NODE` or `SYS`). A sequence of pods, each asking g GPUs and
g NICs (g = 1..4) with the two resources in either order in the pod spec, is admitted by the
real kubelet (Topology Manager `none`: only our preferred answers decide; the kubelet walks
a container's resources in Go map order, whatever the spec's order) while earlier pods
leave at random (churn). Because every pod asks as many NICs as GPUs, the free GPUs and free
NICs always allow `PIX` pairs, so every running container must hold, for each of its GPUs,
that GPU's own NIC — which only happens if the GPU and NIC allocations were chosen together
(the kubelet asks the two resources one after the other, blind to each other).

Checked for every pod: the devices in the kubelet's pod-resources API are paired; what the
container sees through the real runtime (`NVIDIA_VISIBLE_DEVICES`, the NIC pool's env, device
nodes) is what `Allocate` promised and names exactly those devices.

With pairing off (`pairingWindowMs: 0`) the same sequence gave 24 of 28 GPUs their PIX NIC
and this test failed on four pods; with pairing on, 28 of 28.
"""

from __future__ import annotations

import random

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
    helm_upgrade,
    promised,
    report,
    wait_allocatable,
    wait_daemon_ready,
    wait_settled,
    workload,
)

pytestmark = pytest.mark.timeout(1800)

NODE = "dgx-h100"


def sequence(seed: int, n: int) -> list[tuple[str, dict[str, int], list[str]]]:
    """(pod, limits in spec order, pods to delete before it): g GPUs and g NICs, random order, churn."""
    rng = random.Random(seed)
    out, running = [], []
    for i in range(n):
        g = rng.randint(1, 4)
        limits = {GPU: g, NIC: g} if rng.random() < 0.5 else {NIC: g, GPU: g}
        leave = []
        while running and (rng.random() < 0.3 or sum(u for _, u in running) + g > 8):
            leave.append(running.pop(rng.randrange(len(running)))[0])
        name = f"pair-{i}"
        out.append((name, limits, leave))
        running.append((name, g))
    return out


@pytest.fixture(scope="module")
def h100(tmp_path_factory, cluster_inputs):
    node = Node.make(tmp_path_factory.mktemp("node"), simulate=NODE)
    numa, distances = node.numa_nodes()
    for c in start_cluster(tmp_path_factory, cluster_inputs, numa_layout(numa), distances, tm_policy="none"):
        helm_upgrade(c, chart_values(cluster_inputs["image"].ref, node))
        wait_daemon_ready(c)
        wait_allocatable(c, {GPU: "8", NIC: "8"})
        yield {"c": c, "image": cluster_inputs["image"].ref}


def test_every_gpu_gets_the_nic_on_its_own_pcie_switch(h100):
    c, image = h100["c"], h100["image"]
    problems: list[str] = []
    placed = pix = 0
    for name, limits, leave in sequence(seed=11, n=12):
        for gone in leave:
            delete_pod(c, gone)
        c.apply(workload(name, image, limits))
        pod = wait_settled(c, name)
        st = pod["status"]
        if st["phase"] != "Running":
            problems.append(f"{name} {limits}: {st['phase']} {st.get('reason')} {st.get('message')}")
            continue
        got = container_devices(c.podresources(), name)
        gpus, nics = sorted(got.get(GPU, {})), sorted(got.get(NIC, {}))
        assert len(gpus) == limits[GPU] and len(nics) == limits[NIC], (name, got)
        placed += len(gpus)
        own = {f"mlx5_{g}" for g in gpus} & set(nics)
        pix += len(own)
        if len(own) != len(gpus):
            problems.append(f"{name}: GPUs {gpus} got NICs {nics}; each GPU's own (PIX) NIC expected")
        # What the container sees through the real runtime names exactly these devices.
        promise = promised(c, pod["metadata"]["uid"])
        rep = report(c, name)
        problems += [f"{name}: {v}" for v in check_runtime_delivered(rep, promise)]
        if sorted(rep["env"].get("NVIDIA_VISIBLE_DEVICES", "").split(",")) != gpus:
            problems.append(f"{name}: NVIDIA_VISIBLE_DEVICES={rep['env'].get('NVIDIA_VISIBLE_DEVICES')!r}, "
                            f"the kubelet assigned GPUs {gpus}")
        nic_env = {k: v for k, v in promise[NIC]["envs"].items() if not k.endswith("_INFO")}
        if len(nic_env) != 1 or sorted(rep["env"].get(next(iter(nic_env)), "").split(",")) != nics:
            problems.append(f"{name}: NIC env {nic_env} (container: "
                            f"{ {k: rep['env'].get(k) for k in nic_env} }), the kubelet assigned NICs {nics}")
    print(f"\npairing on a live cluster ({NODE}): {pix}/{placed} placed GPUs with their PIX NIC")
    assert not problems, "\n".join(problems)
    assert placed >= 20, placed  # the sequence really exercised pairing
