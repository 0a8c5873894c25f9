"""Device-plugin mode into the pod's network: NetworkAttachmentDefinitions, Multus, host-device.

The standard SR-IOV-world path on the real local cluster (tests/e2e/cluster): the chart serves
a simulated DGX H100 (GPU i and NIC i share a PCIe switch: `PIX`) with `--nic-id-strategy pci`;
two NetworkAttachmentDefinitions name our NIC resource (`k8s.v1.cni.cncf.io/resourceName`) and
wrap host-device; Multus (thin plugin, the node's first CNI config, delegating the pod network
to the cluster's bridge) reads the container's device IDs from the kubelet's pod-resources API
and hands one to each attachment (as `pciBusID` and `deviceID` in its config); host-device
moves the interface of that PCI function into the pod as net1/net2, and back on deletion.
Multus v4.3.0 with multus-cni PR #1492 applied (./multus/tools.go) and host-device v1.10.0 are
built from their Go modules (./multus, ./host-device).

There are no NICs here, so each one is stood in for at the hardware boundary: a veth pair in
the node's network namespace (`tdpnic<i>`, its peer `tdpnic<i>p` stays behind), and, only in
the node's private mount namespace, a /sys/bus/pci/devices with `<pciBusId>/net/tdpnic<i>` and
a `driver` link, which is all host-device reads of sysfs.

Checked: a pod asking 2 GPUs and 2 NICs through the two attachments gets net1/net2 with the
MACs of exactly the veths behind the NIC IDs the kubelet allocated (pod-resources, the
container's PCIDEVICE_* and Allocate's answer in the kubelet's checkpoint all name them), and
they are its GPUs' PIX NICs; deleting the pod returns both to the node's namespace under their
names. The control: with NIC IDs that are names (`--nic-id-strategy name`, the default),
host-device cannot find the device Multus names: the pod's sandbox is refused (and its DEL
too, so such a pod cannot even be deleted cleanly), and nothing moves.

Then DRA with the same attachments: the NICs moved to DRA (`dra.resources: [topo.dev/nic]`), a
pod's claim for two NICs (a ResourceClaimTemplate of the chart's NIC class) gets net1/net2 through
the same two NADs: Multus's DRA client (PR #1492) reads the pod's claims, looks each allocated
device up in our ResourceSlices and takes its `k8s.cni.cncf.io/resourceName` (our NIC resource
name, matched against the NAD's annotation) and `k8s.cni.cncf.io/deviceID` (its PCI address,
host-device's pciBusID).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import yaml
from cluster import Cluster
from cluster_fixtures import numa_layout, start_cluster
from sandbox import NODE_IP, wait_for
from workloads import (
    GPU,
    NAMESPACE,
    NIC,
    Node,
    chart_values,
    container_devices,
    delete_pod,
    diagnose,
    helm_upgrade,
    promised,
    report,
    wait_allocatable,
    wait_daemon_ready,
    wait_settled,
    workload,
)

pytestmark = pytest.mark.timeout(1800)

SIMULATE = "dgx-h100"
NICS = 8
ENV = "PCIDEVICE_TOPO_DEV_NIC"
NADS = ("nic-a", "nic-b")
RESOURCE_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"
LINKS = ("import json, os; print(json.dumps({n: open(f'/sys/class/net/{n}/address').read().strip() "
         "for n in os.listdir('/sys/class/net')}))")


def bdf(i: int) -> str:
    return f"0000:{0x1a + 0x10 * i:02x}:00.0"


def veth(i: int) -> str:
    return f"tdpnic{i}"


def multus_conf(c: Cluster) -> None:
    """Multus as the node's first CNI config (containerd takes the first), wrapping the cluster's bridge.

    The pod network is given inline (`delegates`), not as `clusterNetwork: <path>.conflist`:
    Multus v4.2.3 rebuilds a conflist loaded from a path through its own struct
    (LoadDelegateNetConfFromConfList), dropping the plugins' fields, so its DEL of the pod
    network failed ("bridge ... no IP ranges specified") and pods stayed Terminating.
    """
    d = c.w / "containerd"
    (d / "cni-conf").mkdir(parents=True)
    (d / "cni-conf" / "00-multus.conf").write_text(json.dumps({
        "cniVersion": "0.4.0", "name": "multus-cni-network", "type": "multus",
        "kubeconfig": str(c.w / "pki" / "admin.kubeconfig"),
        "delegates": [c.sb.pod_network()],
        "binDir": str(d / "cni-bin"), "cniDir": "/var/lib/cni/multus",
        "logFile": str(c.w / "logs" / "multus.log"), "logLevel": "debug",
    }, indent=1))


def links(c: Cluster) -> dict[str, dict[str, Any]]:
    """The node network namespace's interfaces (`ip -j link`)."""
    return {x["ifname"]: x for x in json.loads(c.sb.sh("ip", "-j", "link", "show").stdout)}


def stand_in_nics(c: Cluster) -> dict[str, str]:
    """Veth pairs named as the NICs' netdevs and the sysfs view host-device reads; returns veth -> MAC."""
    sysfs = c.w / "pci-sysfs"
    (sysfs / "drivers" / "mlx5_core").mkdir(parents=True)
    for i in range(NICS):
        c.sb.sh("ip", "link", "add", veth(i), "type", "veth", "peer", "name", veth(i) + "p")
        for name in (veth(i), veth(i) + "p"):
            c.sb.sh("ip", "link", "set", name, "up")
        fn = sysfs / "devices" / bdf(i)
        (fn / "net" / veth(i)).mkdir(parents=True)
        (fn / "driver").symlink_to(sysfs / "drivers" / "mlx5_core")
    c.sb.sh("mount", "--bind", str(sysfs / "devices"), "/sys/bus/pci/devices")
    now = links(c)
    return {veth(i): now[veth(i)]["address"] for i in range(NICS)}


def install_nads(c: Cluster, multus_module: pathlib.Path) -> None:
    """The NetworkAttachmentDefinition CRD from Multus's module, then one host-device attachment per NAD."""
    docs = yaml.safe_load_all((multus_module / "deployments" / "multus-daemonset.yml").read_text())
    crd = next(d for d in docs if d and d.get("kind") == "CustomResourceDefinition")
    c.apply(crd)
    c.kubectl("wait", "--for", "condition=established", "--timeout=120s", f"crd/{crd['metadata']['name']}")
    for name in NADS:
        c.apply({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                 "metadata": {"name": name, "namespace": "default", "annotations": {RESOURCE_ANNOTATION: NIC}},
                 "spec": {"config": json.dumps({"cniVersion": "0.4.0", "name": name, "type": "host-device"})}})


def values(image: str, node: Node, nic_ids: str) -> dict[str, Any]:
    return chart_values(image, node, config={"flags": {
        "deviceIdStrategy": "index", "nicIdStrategy": nic_ids, "logLevel": "debug", "logFormat": "text"}})


def multus_log(c: Cluster, lines: int = 40) -> str:
    path = c.w / "logs" / "multus.log"
    text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else ["(no Multus log)"]
    return "--- multus.log\n" + "\n".join(text)


def remove(c: Cluster, name: str) -> None:
    """Delete a pod and wait until it is gone (Multus and host-device DEL ran); say why when it is not."""
    try:
        delete_pod(c, name)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{diagnose(c)}\n{multus_log(c)}") from None


def attached(name: str, image: str, limits: dict[str, int]) -> dict[str, Any]:
    pod = workload(name, image, limits)
    pod["metadata"]["annotations"] = {NETWORKS_ANNOTATION: ",".join(NADS)}
    return pod


@pytest.fixture(scope="module")
def h100(tmp_path_factory, cluster_inputs):
    node = Node.make(tmp_path_factory.mktemp("node"), simulate=SIMULATE)
    data = yaml.safe_load(node.node_file.read_text())
    for i, nic in enumerate(data["nics"]):
        assert nic["name"] == f"mlx5_{i}"
        nic["pciBusId"] = bdf(i)
    node.node_file.write_text(yaml.safe_dump(data, sort_keys=False))
    numa, distances = node.numa_nodes()
    image = cluster_inputs["image"].ref
    for c in start_cluster(tmp_path_factory, cluster_inputs, numa_layout(numa), distances, tm_policy="none",
                           prepare=multus_conf):
        macs = stand_in_nics(c)
        install_nads(c, cluster_inputs["multus_module"])
        helm_upgrade(c, values(image, node, "pci"))
        wait_daemon_ready(c)
        wait_allocatable(c, {GPU: "8", NIC: "8"})
        yield {"c": c, "image": image, "node": node, "macs": macs}


def test_net1_net2_are_the_allocated_nics_and_the_gpus_pix_partners(h100):
    c, image, macs = h100["c"], h100["image"], h100["macs"]
    by_id = {bdf(i): veth(i) for i in range(NICS)}
    # A pod with one GPU and one NIC and no attachment first: its NIC stays in the node's namespace,
    # and the next pod's choices are not simply the first devices. (Every pod asks as many NICs as
    # GPUs, so the free GPUs and NICs always allow PIX pairs, whichever resource the kubelet asks first.)
    c.apply(workload("unattached", image, {GPU: 1, NIC: 1}))
    assert wait_settled(c, "unattached")["status"]["phase"] == "Running"
    kept = container_devices(c.podresources(), "unattached")[NIC]
    c.apply(attached("paired", image, {GPU: 2, NIC: 2}))
    pod = wait_settled(c, "paired")
    assert pod["status"]["phase"] == "Running", f"{pod['status']}\n{diagnose(c)}\n{multus_log(c)}"

    got = container_devices(c.podresources(), "paired")
    gpus, nics = sorted(got[GPU]), sorted(got[NIC])
    assert len(gpus) == 2 and len(nics) == 2 and set(nics) <= set(by_id), got
    # What Allocate answered (the kubelet's checkpoint) and what the container got name the same NICs.
    promise = promised(c, pod["metadata"]["uid"])
    assert sorted(promise[NIC]["envs"][ENV].split(",")) == nics, promise[NIC]["envs"]
    assert sorted(report(c, "paired")["env"][ENV].split(",")) == nics
    # Each GPU's PIX NIC (GPU i ~ NIC i on the DGX H100).
    assert sorted(bdf(int(g)) for g in gpus) == nics, f"GPUs {gpus} got NICs {nics}"

    # Inside the container: exactly the pod network and the two attached interfaces, with the
    # MACs of the veths behind the allocated IDs.
    inside = json.loads(c.kubectl("exec", "-n", "default", "paired", "--", "python3", "-c", LINKS).stdout)
    assert sorted(inside) == ["eth0", "lo", "net1", "net2"], inside
    assert sorted([inside["net1"], inside["net2"]]) == sorted(macs[by_id[n]] for n in nics), (inside, nics)
    # Multus reports the attachments (network-status) with those interfaces and MACs.
    status = json.loads(c.get("pod", "paired", "-n", "default")["metadata"]["annotations"][STATUS_ANNOTATION])
    nets = {s["name"]: s for s in status}
    for nad, ifname in zip(NADS, ("net1", "net2")):
        assert nets[f"default/{nad}"]["interface"] == ifname and nets[f"default/{nad}"]["mac"] == inside[ifname]
    node_links = links(c)
    assert {by_id[n] for n in nics}.isdisjoint(node_links), "an attached NIC is still in the node's namespace"
    assert all(v + "p" in node_links for v in by_id.values())
    assert all(by_id[n] in node_links for n in kept), "a NIC of the pod without attachments left the node"

    remove(c, "paired")
    remove(c, "unattached")
    # host-device moved both back, under their names, with their MACs.
    back = links(c)
    assert {v: back[v]["address"] for v in by_id.values() if v in back} == macs


def test_with_name_ids_host_device_cannot_find_the_nic_and_nothing_moves(h100):
    """The control: NIC IDs that are not PCI addresses reach host-device, which refuses them."""
    c, image, node, macs = h100["c"], h100["image"], h100["node"], h100["macs"]
    old = wait_daemon_ready(c)["metadata"]["uid"]
    helm_upgrade(c, values(image, node, "name"))
    wait_daemon_ready(c, not_uid=old)
    wait_for("NIC IDs that are names", lambda: sorted(c.podresources()["allocatable"].get(NIC, {}))
             == [f"mlx5_{i}" for i in range(NICS)], 180)
    c.apply(attached("by-name", image, {GPU: 1, NIC: 1}))

    def refused() -> str | None:
        events = c.get("events", "-n", "default", "--field-selector", "involvedObject.name=by-name")["items"]
        return next((e["message"] for e in events if e["reason"] == "FailedCreatePodSandBox"), None)
    message = wait_for("the sandbox of pod by-name to be refused", refused, 180)
    # Multus put the ID in host-device's config as pciBusID; host-device looked it up in sysfs.
    assert "/sys/bus/pci/devices/mlx5_" in message, message
    # host-device's DEL refuses the same ID, so this sandbox can never be torn down and the pod
    # would stay Terminating: remove it from the API server (the cluster's teardown stops it).
    c.kubectl("delete", "pod", "-n", "default", "by-name", "--grace-period=0", "--force")
    now = links(c)
    assert {v: now[v]["address"] for v in macs if v in now} == macs


# ---- DRA: the same attachments, the NICs allocated through claims (multus-cni PR #1492) -------------

DRIVER = "topo.dev"


def dra_values(image: str, node: Node) -> dict[str, Any]:
    """NICs through DRA (GPUs stay with the device plugin); our NIC ID strategy no longer matters:
    the device's `k8s.cni.cncf.io/deviceID` attribute is its PCI address."""
    # The publisher talks to the API server at its address: this cluster runs no kube-proxy for the service IP.
    return {**values(image, node, "name"), "dra": {"resources": [NIC]},
            "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": NODE_IP},
                         {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]}


def nic_devices(c: Cluster) -> dict[str, dict[str, Any]]:
    """Our NIC devices in the node's ResourceSlices: device name -> attributes."""
    out = {}
    for s in c.get("resourceslices")["items"]:
        if s["spec"]["driver"] != DRIVER:
            continue
        for d in s["spec"].get("devices", []):
            attrs = d.get("attributes", {})
            if attrs.get("type", {}).get("string") == "nic":
                out[d["name"]] = attrs
    return out


def test_multus_attaches_the_nics_a_dra_claim_was_allocated(h100):
    """One NetworkAttachmentDefinition serves both modes: with the NICs moved to DRA, a pod's claim (from a
    ResourceClaimTemplate) for two NICs gets net1/net2, the interfaces behind the PCI addresses our slices
    published as each allocated device's `k8s.cni.cncf.io/deviceID`, found by Multus through the device's
    `k8s.cni.cncf.io/resourceName` (= the NAD's resourceName annotation, our device-plugin resource name)."""
    c, image, node, macs = h100["c"], h100["image"], h100["node"], h100["macs"]
    by_id = {bdf(i): veth(i) for i in range(NICS)}
    old = wait_daemon_ready(c)["metadata"]["uid"]
    helm_upgrade(c, dra_values(image, node))
    try:
        wait_daemon_ready(c, not_uid=old)
    except TimeoutError as e:
        logs = c.kubectl("logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=topo-device-plugin", "--tail=60",
                         check=False)
        raise TimeoutError(f"{e}\n--- the daemon's log\n{logs.stdout}{logs.stderr}") from None
    published = wait_for("8 NICs in our ResourceSlices", lambda: (d := nic_devices(c)) and len(d) == NICS and d, 180)
    attrs = {name: (a.get("k8s.cni.cncf.io/resourceName", {}).get("string"),
                    a.get("k8s.cni.cncf.io/deviceID", {}).get("string")) for name, a in published.items()}
    assert sorted(attrs.values()) == sorted((NIC, b) for b in by_id), attrs
    # The kubelet no longer offers the NICs as a device-plugin resource (it keeps the name at 0 for a grace period).
    wait_for("no topo.dev/nic allocatable through the device plugin", lambda: c.allocatable().get(NIC, "0") == "0", 180)

    c.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
             "metadata": {"name": "two-nics", "namespace": "default"},
             "spec": {"spec": {"devices": {"requests": [
                 {"name": "nics", "exactly": {"deviceClassName": f"nic.{DRIVER}", "count": 2}}]}}}})
    pod = workload("dra-attached", image, {})
    pod["metadata"]["annotations"] = {NETWORKS_ANNOTATION: ",".join(NADS)}
    pod["spec"]["resourceClaims"] = [{"name": "nics", "resourceClaimTemplateName": "two-nics"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "nics"}]}
    c.apply(pod)
    got = wait_settled(c, "dra-attached")
    assert got["status"]["phase"] == "Running", f"{got['status']}\n{diagnose(c)}\n{multus_log(c)}"

    [status] = got["status"]["resourceClaimStatuses"]
    claim = c.get("resourceclaim", status["resourceClaimName"], "-n", "default")
    allocated = sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])
    assert len(allocated) == 2, claim["status"]
    ids = sorted(attrs[d][1] for d in allocated)
    inside = json.loads(c.kubectl("exec", "-n", "default", "dra-attached", "--", "python3", "-c", LINKS).stdout)
    assert sorted(inside) == ["eth0", "lo", "net1", "net2"], inside
    assert sorted([inside["net1"], inside["net2"]]) == sorted(macs[by_id[i]] for i in ids), (inside, ids)
    nets = {s["name"]: s for s in json.loads(
        c.get("pod", "dra-attached", "-n", "default")["metadata"]["annotations"][STATUS_ANNOTATION])}
    assert {nets[f"default/{n}"]["interface"] for n in NADS} == {"net1", "net2"}, nets
    node_links = links(c)
    assert {by_id[i] for i in ids}.isdisjoint(node_links), "an attached NIC is still in the node's namespace"

    remove(c, "dra-attached")
    back = links(c)
    assert {v: back[v]["address"] for v in by_id.values() if v in back} == macs
