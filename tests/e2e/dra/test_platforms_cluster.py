"""Grace-Blackwell with ConnectX-8 Data Direct on a real Kubernetes 1.37 cluster (issue 22).

One cluster for this module (tests/e2e/cluster, as tests/e2e/dra/test_dra_cluster.py), the node
served as the simulated `gb300-cx8-dd` tray: 4 GB300 GPUs in one NVLink fabric clique and 4
ConnectX-8 NICs whose PCIe path says NODE/SYS to every GPU; only the complex (the NIC's Data
Direct DMA function behind the GPU's ConnectX switch) names the pairs. The chart serves GPUs and
NICs through DRA and keeps the clique label on the Node through the API server
(`fabricLabels.node`, as a cluster without Node Feature Discovery needs).

The proofs: a claim for 2 GPUs + 2 NICs with `matchAttribute: topo.dev/complex` per pair is
allocated by kube-scheduler from our slices and run; each GPU got the NIC of its own complex
(the claim's results, the slices' attributes, and the GPU UUIDs and NIC PCI addresses the
container sees through our CDI spec); and the node carries `nvidia.com/gpu.clique` with the
tray's fabric clique.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import pytest
from cluster import NODE
from cluster_fixtures import down_and_check_nothing_left, numa_layout, start_cluster
from sandbox import NODE_IP, wait_for
from workloads import NAMESPACE, REPORT_MARK, Node, chart_values, diagnose, helm_upgrade, wait_daemon_ready, \
    workload

from allocator.topologymanager import machine_numa
from plugin.dra.slices.build import device_name
from plugin.sources.fabric_labels import CLIQUE_LABEL
from plugin.sources.simulated import load_simulated

pytestmark = pytest.mark.timeout(1500)

DRIVER = "topo.dev"
STAGES: dict[str, float] = {}

COMPLEX_PAIRS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
    "metadata": {"name": "two-gpu-nic-complex-pairs", "namespace": NAMESPACE},
    "spec": {"spec": {"devices": {
        "requests": [{"name": n, "exactly": {"deviceClassName": f"{n[:3]}.{DRIVER}"}}
                     for n in ("gpu-a", "nic-a", "gpu-b", "nic-b")],
        "constraints": [{"requests": ["gpu-a", "nic-a"], "matchAttribute": f"{DRIVER}/complex"},
                        {"requests": ["gpu-b", "nic-b"], "matchAttribute": f"{DRIVER}/complex"}],
    }}},
}


@pytest.fixture(scope="module")
def env(tmp_path_factory, cluster_inputs):
    node = Node.make(tmp_path_factory.mktemp("node"), simulate="gb300-cx8-dd")
    topology = load_simulated(str(node.node_file))
    # The cluster's machine: the two Grace sockets the devices name (the GPUs' memory-only NUMA
    # nodes never hold CPUs nor a device's TopologyInfo), with the node's distances between them.
    _, rows = machine_numa(topology)
    sockets = sorted({d.numa for d in topology.devices})
    distances = {n: [rows[n][m] for m in sockets] for n in sockets}
    t0 = time.monotonic()
    for c in start_cluster(tmp_path_factory, cluster_inputs, numa_layout(sockets), distances, tm_policy="none"):
        STAGES["cluster up"] = time.monotonic() - t0
        t0 = time.monotonic()
        helm_upgrade(c, chart_values(
            cluster_inputs["image"].ref, node,
            dra={"resources": ["nvidia.com/gpu", "topo.dev/nic"]},
            fabricLabels={"node": True},
            # No kube-proxy in this cluster: the pod reaches the API server at the node's address.
            extraEnv=[{"name": "KUBERNETES_SERVICE_HOST", "value": NODE_IP},
                      {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]))
        wait_daemon_ready(c)
        STAGES["helm install + driver Ready"] = time.monotonic() - t0
        yield {"c": c, "image": cluster_inputs["image"].ref, "topology": topology}
    print("\nGB300 DRA e2e stage times:", file=sys.stderr)
    for name, dt in STAGES.items():
        print(f"  {name:<40} {dt:7.1f} s", file=sys.stderr)


def our_slice_devices(c) -> dict[str, dict[str, Any]]:
    """Device name -> its attributes, from our published ResourceSlices."""
    out = {}
    for s in c.get("resourceslices")["items"]:
        if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE:
            out.update({d["name"]: d.get("attributes", {}) for d in s["spec"]["devices"]})
    return out


def report(c, name: str) -> dict[str, Any] | None:
    out = c.kubectl("logs", "-n", NAMESPACE, name, check=False).stdout
    for line in out.splitlines():
        if line.startswith(REPORT_MARK):
            return json.loads(line[len(REPORT_MARK):])
    return None


def test_the_node_carries_the_clique_label_of_the_trays_fabric(env):
    c = env["c"]
    (clique,) = {g.fabric.clique for g in env["topology"].gpus}
    t0 = time.monotonic()
    got = wait_for(f"label {CLIQUE_LABEL} on the node",
                   lambda: c.node()["metadata"].get("labels", {}).get(CLIQUE_LABEL), 120)
    STAGES["clique label on the node"] = time.monotonic() - t0
    assert got == clique
    # Only our label was added: the kubelet's own labels are still there.
    labels = c.node()["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] and labels["kubernetes.io/os"] == "linux"


def test_a_claim_matching_on_complex_gets_data_direct_pairs(env):
    c = env["c"]
    topo = env["topology"]
    by_slice_name = {device_name(d): d for d in topo.devices}
    t0 = time.monotonic()
    attrs = wait_for("our ResourceSlices", lambda: our_slice_devices(c) or None, 120)
    # The slices carry the complex (GPU and NIC) and the clique (GPU) the built-in says.
    for name, d in by_slice_name.items():
        assert attrs[name]["complex"] == {"string": d.complex}, name
        if d.fabric is not None:
            assert attrs[name]["clique"] == {"string": d.fabric.clique}, name
    # On this tray PCIe pairs nothing: no GPU shares a PCIe switch or root with a NIC.
    for g in topo.gpus:
        for n in topo.nics:
            assert topo.link(g.name, n.name).label in ("NODE", "SYS"), (g.name, n.name)

    c.apply(COMPLEX_PAIRS)
    pod = workload("complex-pairs", env["image"], {})
    pod["metadata"]["namespace"] = NAMESPACE
    pod["spec"]["resourceClaims"] = [{"name": "pairs", "resourceClaimTemplateName": COMPLEX_PAIRS["metadata"]["name"]}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "pairs"}]}
    c.apply(pod)

    def running():
        p = c.get("pod", "complex-pairs", "-n", NAMESPACE)
        return p if p.get("status", {}).get("phase") == "Running" else None
    try:
        pod = wait_for("pod complex-pairs Running", running, 240)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{diagnose(c, NAMESPACE)}") from None
    STAGES["2 GPU + 2 NIC (complex) pod Running"] = time.monotonic() - t0
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = c.get("resourceclaim", status["resourceClaimName"], "-n", NAMESPACE)
    res = claim["status"]["allocation"]["devices"]["results"]
    assert all(r["driver"] == DRIVER and r["pool"] == NODE for r in res), res
    got = {r["request"]: by_slice_name[r["device"]] for r in res}
    assert set(got) == {"gpu-a", "nic-a", "gpu-b", "nic-b"} and len({d.name for d in got.values()}) == 4
    for g, n in (("gpu-a", "nic-a"), ("gpu-b", "nic-b")):
        gpu, nic = got[g], got[n]
        assert gpu.complex and gpu.complex == nic.complex, (gpu.name, gpu.complex, nic.name, nic.complex)
        assert gpu.complex_kind == nic.complex_kind == "data-direct"

    # The container: the two GPUs' UUIDs and the two NICs' PCI addresses, as the slices name them.
    rep = wait_for("the pod's report", lambda: report(c, "complex-pairs"), 60)
    seen = {v for k, v in rep["env"].items() if k.startswith("TOPO_DEV_") and not k.endswith("_NETDEV")}
    ident = {r["request"]: (attrs[r["device"]]["uuid"] if r["device"].startswith("gpu-")
                            else attrs[r["device"]]["resource.kubernetes.io/pciBusID"])["string"] for r in res}
    assert seen == set(ident.values()), (seen, ident)
    complex_of = {ident[r["request"]]: attrs[r["device"]]["complex"]["string"] for r in res}
    for g, n in (("gpu-a", "nic-a"), ("gpu-b", "nic-b")):
        assert complex_of[ident[g]] == complex_of[ident[n]], (ident[g], ident[n], complex_of)
    assert complex_of[ident["gpu-a"]] != complex_of[ident["gpu-b"]]

    c.kubectl("delete", "pod", "-n", NAMESPACE, "complex-pairs", "--wait=false")
    wait_for("pod complex-pairs gone", lambda: not c.get("pods", "-n", NAMESPACE, "--field-selector",
                                                          "metadata.name=complex-pairs")["items"], 240)


def test_teardown_stops_everything_and_leaves_nothing(env):
    down_and_check_nothing_left(env["c"])
