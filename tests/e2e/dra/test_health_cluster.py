"""Device health reaches the running pod's status on a real Kubernetes 1.37 cluster, both ways.

KEP-4680 (ResourceHealthStatus, beta and on by default since 1.36; ResourceHealthStatusMessage
too): the kubelet writes the health of each device a container holds into
`status.containerStatuses[].allocatedResourcesStatus`. For a DRA claim it learns it from our
DRAResourceHealth stream (plugin/dra/kubelet/health_service.py), for an extended resource from the
device plugin's ListAndWatch. One cluster for this module (tests/e2e/cluster, containerd with
CDI as in test_dra_cluster.py); the chart serves the simulated DGX H100 with the GPUs through
DRA and the NICs through the device-plugin API, so one node runs both kinds of pod. The tests
edit the simulated node file the plugin watches: the GPU of the DRA pod and the NICs turn
Unhealthy, then healthy again; then the GPU's simulated driver facts (`driver:`, docs/simulated-nodes.md)
deliver XIDs and the evidence of a reset, decided by the same policy as the NVML monitor's
(plugin/health/policy.py): XID 48 (RESET_GPU) taints the GPU and shows in the pod's status, keeps new
claims off it, outlasts the quiet period, and only the pending remap applied brings it back; XID 13
(RESTART_APP) changes nothing.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from cluster import NODE, Cluster
from cluster_fixtures import down_and_check_nothing_left, numa_layout, start_cluster
from sandbox import NODE_IP, wait_for
from workloads import (
    NAMESPACE,
    NIC,
    Node,
    chart_values,
    daemon_pods,
    diagnose,
    helm_upgrade,
    wait_daemon_ready,
    workload,
)

from plugin.sources.simulated import load_simulated

pytestmark = pytest.mark.timeout(1800)

DRIVER = "topo.dev"
GATES = ("ResourceHealthStatus", "ResourceHealthStatusMessage")
QUIET_S = 15  # gpus.health.recoveryQuietPeriodSeconds for this cluster


@pytest.fixture(scope="module")
def installed(tmp_path_factory, cluster_inputs):
    node = Node.make(tmp_path_factory.mktemp("node"), simulate="dgx-h100")
    numa, distances = node.numa_nodes()
    for c in start_cluster(tmp_path_factory, cluster_inputs, numa_layout(numa), distances, tm_policy="none"):
        values = chart_values(
            cluster_inputs["image"].ref, node,
            dra={"resources": ["nvidia.com/gpu"], "exampleClaimTemplates": True},
            extraEnv=[{"name": "KUBERNETES_SERVICE_HOST", "value": NODE_IP},
                      {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}])
        values["config"]["gpus"] = {"health": {"recoveryQuietPeriodSeconds": QUIET_S}}
        helm_upgrade(c, values)
        wait_daemon_ready(c)
        yield {"c": c, "node": node, "image": cluster_inputs["image"].ref,
               "topology": load_simulated(str(node.node_file))}


# ---- helpers ---------------------------------------------------------------------------------------


def set_health(node: Node, gpus: set[int], nics: bool) -> None:
    """Edit the simulated node the plugin watches: these GPU indexes (and every NIC if `nics`) Unhealthy."""
    import yaml
    data = yaml.safe_load(node.node_file.read_text())
    for key, bad in (("gpus", lambda i: i in gpus), ("nics", lambda i: nics)):
        for i, dev in enumerate(data[key]):
            if bad(i):
                dev["health"] = "Unhealthy"
            else:
                dev.pop("health", None)
    tmp = node.node_file.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    tmp.replace(node.node_file)


def set_driver(node: Node, facts: dict[int, dict[str, Any]]) -> None:
    """Edit the GPUs' simulated driver facts (`driver:`): what NVML would report of them."""
    import yaml
    data = yaml.safe_load(node.node_file.read_text())
    for i, driver in facts.items():
        data["gpus"][i]["driver"] = driver
    tmp = node.node_file.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    tmp.replace(node.node_file)


def daemon_log(c: Cluster) -> str:
    [d] = daemon_pods(c)
    return c.kubectl("logs", "-n", NAMESPACE, d["metadata"]["name"], "-c", d["spec"]["containers"][0]["name"]).stdout


def logged(c: Cluster, *words: str, timeout: float = 180) -> str:
    """Wait for a daemon log line holding every word; that line."""
    def check():
        return next((ln for ln in daemon_log(c).splitlines() if all(w in ln for w in words)), None)
    return wait_for(f"daemon log line with {words}", check, timeout)


def taint_values(c: Cluster) -> dict[str, list[str]]:
    return {d["name"]: [t.get("value", "") for t in d.get("taints", [])]
            for s in c.get("resourceslices")["items"]
            if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE
            for d in s["spec"].get("devices", []) if d.get("taints")}


def pod(c: Cluster, ns: str, name: str) -> dict[str, Any]:
    return c.get("pod", name, "-n", ns)


def running(c: Cluster, ns: str, name: str) -> dict[str, Any]:
    def ok():
        p = pod(c, ns, name)
        return p if p.get("status", {}).get("phase") == "Running" else None
    try:
        return wait_for(f"pod {name} Running", ok, 240)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{diagnose(c, ns)}") from None


def resource_health(p: dict[str, Any]) -> dict[str, dict[str, str]]:
    """allocatedResourcesStatus of the pod's one container: {resource name: {resource ID: health}}."""
    [cs] = p["status"]["containerStatuses"]
    return {r["name"]: {h["resourceID"]: h["health"] for h in r.get("resources") or []}
            for r in cs.get("allocatedResourcesStatus") or []}


def wait_health(c: Cluster, ns: str, name: str, resource: str, want: str, timeout: float = 120) -> dict[str, str]:
    """Wait until every device of `resource` in the pod's status says `want`; that {ID: health}."""
    def check():
        got = resource_health(pod(c, ns, name)).get(resource)
        return got if got and set(got.values()) == {want} else None
    try:
        return wait_for(f"pod {name}: {resource} {want} in allocatedResourcesStatus", check, timeout)
    except TimeoutError as e:
        raise TimeoutError(f"{e}; status now: {resource_health(pod(c, ns, name))}") from None


def tainted(c: Cluster) -> dict[str, list[str]]:
    return {d["name"]: [t["key"] for t in d.get("taints", [])]
            for s in c.get("resourceslices")["items"]
            if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE
            for d in s["spec"].get("devices", []) if d.get("taints")}


def kubelet_gates(c: Cluster) -> dict[str, tuple[str, bool]]:
    """{gate: (stage, enabled)} as the running kubelet reports them (kubernetes_feature_enabled)."""
    text = c.kubectl("get", "--raw", f"/api/v1/nodes/{NODE}/proxy/metrics").stdout
    out = {}
    for m in re.finditer(r'^kubernetes_feature_enabled\{name="(\w+)",stage="(\w*)"\} (\d)', text, re.M):
        out[m.group(1)] = (m.group(2), m.group(3) == "1")
    return out


# ---- the story -------------------------------------------------------------------------------------


def test_the_kubelet_has_resource_health_status_on_by_default(installed):
    """Nothing in the test cluster's kubelet config turns these on: 1.37's defaults do."""
    gates = kubelet_gates(installed["c"])
    assert {g: gates.get(g) for g in GATES} == {g: ("BETA", True) for g in GATES}


def test_a_dra_pod_and_a_device_plugin_pod_see_their_devices_healthy(installed):
    c, image = installed["c"], installed["image"]
    dra = workload("dra-health", image, {})
    dra["metadata"]["namespace"] = NAMESPACE
    dra["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    dra["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    c.apply(dra)
    c.apply(workload("dp-health", image, {NIC: 1}))
    p = running(c, NAMESPACE, "dra-health")
    running(c, "default", "dp-health")
    [st] = p["status"]["resourceClaimStatuses"]
    claim = c.get("resourceclaim", st["resourceClaimName"], "-n", NAMESPACE)
    [res] = claim["status"]["allocation"]["devices"]["results"]
    installed["gpu"], installed["claim_uid"] = res["device"], claim["metadata"]["uid"]
    # The DRA claim's entry is named after the pod's claim; its ID is the CDI ID we returned from prepare.
    got = wait_health(c, NAMESPACE, "dra-health", "claim:gpu", "Healthy")
    assert list(got) == [f"{DRIVER}/claim={claim['metadata']['uid']}-{res['device']}"]
    nic = wait_health(c, "default", "dp-health", NIC, "Healthy")
    assert len(nic) == 1
    installed["nic_id"] = next(iter(nic))
    assert tainted(c) == {}


def test_an_unhealthy_gpu_and_nic_show_in_the_running_pods_and_the_gpu_is_tainted(installed):
    c = installed["c"]
    gpu = installed["gpu"]
    t0 = time.monotonic()
    set_health(installed["node"], {int(gpu.split("-")[1])}, nics=True)
    dra = wait_health(c, NAMESPACE, "dra-health", "claim:gpu", "Unhealthy")
    t_dra = time.monotonic() - t0
    dp = wait_health(c, "default", "dp-health", NIC, "Unhealthy")
    t_dp = time.monotonic() - t0
    assert list(dp) == [installed["nic_id"]] and len(dra) == 1
    wait_for("the taint on the pod's GPU", lambda: tainted(c) == {gpu: [f"{DRIVER}/unhealthy"]}, 120)
    # ResourceHealthStatusMessage: our reason reaches the pod status.
    [cs] = pod(c, NAMESPACE, "dra-health")["status"]["containerStatuses"]
    [entry] = [h for r in cs["allocatedResourcesStatus"] for h in r["resources"]]
    assert "Unhealthy" in entry.get("message", ""), entry
    # The pods keep running: NoSchedule keeps new claims off, it evicts nobody.
    assert pod(c, NAMESPACE, "dra-health")["status"]["phase"] == "Running"
    print(f"\nUnhealthy in pod status after the node edit: DRA {t_dra:.1f} s, device plugin {t_dp:.1f} s")


def test_recovery_brings_the_pods_back_to_healthy_and_removes_the_taint(installed):
    c = installed["c"]
    t0 = time.monotonic()
    set_health(installed["node"], set(), nics=False)
    wait_health(c, NAMESPACE, "dra-health", "claim:gpu", "Healthy")
    t_dra = time.monotonic() - t0
    wait_health(c, "default", "dp-health", NIC, "Healthy")
    t_dp = time.monotonic() - t0
    wait_for("the taint removed", lambda: not tainted(c), 120)
    print(f"\nHealthy in pod status after recovery: DRA {t_dra:.1f} s, device plugin {t_dp:.1f} s")


def test_a_reset_gpu_xid_taints_the_gpu_and_shows_in_the_running_pod(installed):
    c, gpu = installed["c"], installed["gpu"]
    i = int(gpu.split("-")[1])
    t0 = time.monotonic()
    # The driver delivers XID 48 (uncorrectable ECC) and reports a row remap pending a reset.
    set_driver(installed["node"], {i: {"xids": [48], "remapPending": True}})
    wait_health(c, NAMESPACE, "dra-health", "claim:gpu", "Unhealthy")
    t_dra = time.monotonic() - t0
    wait_for("the XID's taint on the pod's GPU", lambda: taint_values(c) == {gpu: ["xid-48.reset-gpu"]}, 120)
    [cs] = pod(c, NAMESPACE, "dra-health")["status"]["containerStatuses"]
    [entry] = [h for r in cs["allocatedResourcesStatus"] for h in r["resources"]]
    assert "xid-48: reset GPU" in entry.get("message", ""), entry
    assert pod(c, NAMESPACE, "dra-health")["status"]["phase"] == "Running"
    print(f"\nXID 48 Unhealthy in pod status after the driver edit: DRA {t_dra:.1f} s")


def test_the_quiet_period_alone_does_not_bring_the_gpu_back(installed):
    c, gpu = installed["c"], installed["gpu"]
    logged(c, "GPU still Unhealthy past its quiet period", f"gpu=GPU{gpu.split('-')[1]}")
    assert set(resource_health(pod(c, NAMESPACE, "dra-health"))["claim:gpu"].values()) == {"Unhealthy"}
    assert taint_values(c) == {gpu: ["xid-48.reset-gpu"]}


def test_no_new_claim_gets_the_gpu_while_it_waits_for_a_reset(installed):
    """The pod is deleted, its GPU free but tainted: a claim for all 8 GPUs cannot be allocated."""
    c = installed["c"]
    c.kubectl("delete", "pod", "-n", NAMESPACE, "dra-health", "--wait=false")
    wait_for("the DRA pod's claim gone", lambda: installed["claim_uid"] not in
             {x["metadata"]["uid"] for x in c.get("resourceclaims", "-n", NAMESPACE)["items"]}, 240)
    c.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
             "metadata": {"name": "all-gpus", "namespace": NAMESPACE},
             "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                 "deviceClassName": f"gpu.{DRIVER}", "allocationMode": "ExactCount", "count": 8}}]}}}})
    allgpus = workload("dra-all", installed["image"], {})
    allgpus["metadata"]["namespace"] = NAMESPACE
    allgpus["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "all-gpus"}]
    allgpus["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
    c.apply(allgpus)
    wait_for("the scheduler refuses the claim", lambda: c.get(
        "events", "-n", NAMESPACE, "--field-selector", "involvedObject.name=dra-all,reason=FailedScheduling")[
        "items"], 180)
    p = pod(c, NAMESPACE, "dra-all")
    assert p["status"].get("phase") == "Pending"
    claims = [x for x in c.get("resourceclaims", "-n", NAMESPACE)["items"]
              if any(o.get("name") == "dra-all" for o in x["metadata"].get("ownerReferences", []))]
    assert claims and all(not x.get("status", {}).get("allocation") for x in claims), claims


def test_only_the_evidenced_reset_brings_the_gpu_back(installed):
    c, gpu = installed["c"], installed["gpu"]
    i = int(gpu.split("-")[1])
    t0 = time.monotonic()
    # The pending remap is applied: the driver's evidence that the GPU was reset.
    set_driver(installed["node"], {i: {"xids": [48], "remapPending": False}})
    running(c, NAMESPACE, "dra-all")
    t_run = time.monotonic() - t0
    assert taint_values(c) == {}
    got = wait_health(c, NAMESPACE, "dra-all", "claim:gpus", "Healthy")
    assert len(got) == 8 and any(k.endswith(f"-{gpu}") for k in got), got
    logged(c, "GPU Healthy again", f"gpu=GPU{i}", "remap")
    print(f"\nthe pod holding every GPU Running after the reset evidence: {t_run:.1f} s")


def test_a_restart_app_xid_changes_nothing(installed):
    """XID 13 on the GPU; in the same edit XID 48 on another GPU, whose taint proves the edit was applied."""
    c, gpu = installed["c"], installed["gpu"]
    i = int(gpu.split("-")[1])
    j = (i + 1) % 8
    set_driver(installed["node"], {i: {"xids": [48, 13], "remapPending": False},
                                   j: {"xids": [48], "remapPending": True}})
    wait_for("the other GPU's taint", lambda: f"gpu-{j}" in taint_values(c), 120)
    assert taint_values(c) == {f"gpu-{j}": ["xid-48.reset-gpu"]}
    logged(c, "GPU health event", f"gpu=GPU{i}", "cause=xid-13")
    health = wait_health_of(c, "dra-all", "claim:gpus", f"-gpu-{j}", "Unhealthy")
    assert {k: v for k, v in health.items() if k.endswith(f"-{gpu}")} == {
        k: "Healthy" for k in health if k.endswith(f"-{gpu}")} and any(k.endswith(f"-{gpu}") for k in health)


def wait_health_of(c: Cluster, name: str, resource: str, suffix: str, want: str) -> dict[str, str]:
    """Wait until the device whose ID ends in `suffix` says `want`; the resource's {ID: health}."""
    def check():
        got = resource_health(pod(c, NAMESPACE, name)).get(resource) or {}
        return got if any(k.endswith(suffix) and v == want for k, v in got.items()) else None
    return wait_for(f"pod {name}: {suffix} {want}", check, 120)


def test_teardown_stops_everything_and_leaves_nothing(installed):
    c = installed["c"]
    for ns, name in ((NAMESPACE, "dra-health"), (NAMESPACE, "dra-all"), ("default", "dp-health")):
        c.kubectl("delete", "pod", "-n", ns, name, "--wait=false", "--ignore-not-found")
    c.kubectl("delete", "resourceclaimtemplate", "-n", NAMESPACE, "all-gpus", "--ignore-not-found")
    wait_for("pods gone", lambda: not [p for p in c.get("pods", "-n", NAMESPACE)["items"]
                                       if p["metadata"]["name"] in ("dra-health", "dra-all")], 240)
    down_and_check_nothing_left(c)
