"""MIG through our DRA driver on a real Kubernetes 1.37 cluster: partitionable GPUs and static MIG devices.

One cluster for this module. The plugin serves a simulated DGX H100 whose GPU0 and GPU1 are in MIG
mode without MIG devices and listed as partitionable (`draMig: dynamic`, `draMigGpus: [0, 1]`), and
whose GPU2 has three MIG devices (static MIG). Partitionable devices (KEP-4815) are beta and on by
default since 1.36 (`DRAPartitionableDevices`): the API server keeps `sharedCounters` and
`consumesCounters`, and kube-scheduler allocates placements within the counters. The simulated
MIG backend keeps the instances it makes in `<kubelet>/plugins/topo.dev/simulated-mig.json`, which
this test reads as the node's MIG state.

The story, in file order: a claim for a 1g.10gb placement of GPU0 gets an instance made at
prepare; a 3g.40gb claim fits beside it; a 4g.40gb claim cannot (its only placement overlaps the
1g instance, and the compute slices would run out) and stays Pending with the scheduler's reason;
a driver restart keeps exactly the two instances; deleting the 1g pod destroys its instance and
the pending claim then fits; deleting everything leaves no instance. Static: a claim for GPU2's
existing 2g.20gb MIG device runs and sees it.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import pytest
from cluster import NODE, Cluster
from cluster_fixtures import numa_layout, start_cluster
from sandbox import NODE_IP, wait_for
from workloads import NAMESPACE, REPORT_MARK, Node, StageTimes, chart_values, diagnose, helm_upgrade, \
    wait_daemon_ready, workload

from plugin.sources.simulated import load_simulated
from topo_testkit.mig_node import mig_node_text

pytestmark = pytest.mark.timeout(1800)

DRIVER = "topo.dev"
STAGES = StageTimes()
stage = STAGES.stage


def template(name: str, cel: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": {
                "deviceClassName": f"mig.{DRIVER}", "selectors": [{"cel": {"expression": cel}}]}}]}}}}


def on_gpu(index: int, profile: str) -> str:
    a = f'device.attributes["{DRIVER}"]'
    return f'{a}.parentIndex == {index} && {a}.profile == "{profile}"'


TEMPLATES = [template("gpu0-1g", on_gpu(0, "1g.10gb")), template("gpu0-3g", on_gpu(0, "3g.40gb")),
             template("gpu0-4g", on_gpu(0, "4g.40gb")), template("gpu2-static-2g", on_gpu(2, "2g.20gb"))]


@pytest.fixture(scope="module")
def env(tmp_path_factory, cluster_inputs):
    node = Node.make(tmp_path_factory.mktemp("node"), simulate="dgx-h100")
    node.node_file.write_text(mig_node_text())
    numa, distances = node.numa_nodes()
    t0 = time.monotonic()
    for c in start_cluster(tmp_path_factory, cluster_inputs, numa_layout(numa), distances, tm_policy="none"):
        STAGES["cluster up"] = time.monotonic() - t0
        state = {"c": c, "node": node, "image": cluster_inputs["image"].ref,
                 "topology": load_simulated(str(node.node_file))}
        yield state
    if "pending_reason" in state:
        print(f"\nthe scheduler on the 4g.40gb claim: {state['pending_reason']}", file=sys.stderr)
    print("\nDRA MIG e2e stage times:", file=sys.stderr)
    for name, dt in STAGES.items():
        print(f"  {name:<52} {dt:7.1f} s", file=sys.stderr)


@pytest.fixture(scope="module")
def installed(env):
    c = env["c"]
    values = chart_values(
        env["image"], env["node"], dra={"resources": ["nvidia.com/gpu"]},
        extraEnv=[{"name": "KUBERNETES_SERVICE_HOST", "value": NODE_IP},
                  {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}])
    values["config"]["flags"].update({"draMig": "dynamic", "draMigGpus": ["0", "1"]})
    with stage("helm install + driver Ready"):
        helm_upgrade(c, values)
        env["daemon"] = wait_daemon_ready(c)
    # The chart adds the class of MIG devices with draMig (type "mig").
    cls = c.get("deviceclass", f"mig.{DRIVER}")
    assert '.type == "mig"' in cls["spec"]["selectors"][0]["cel"]["expression"]
    for t in TEMPLATES:
        c.apply(t)
    return env


def mig_state(c: Cluster) -> list[tuple[str, str, int]]:
    """The simulated node's MIG instances: (GPU, profile, start)."""
    path = c.w.joinpath("var-lib-kubelet", "plugins", DRIVER, "simulated-mig.json")
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return sorted((g, i["profile"], i["start"]) for g, items in data.get("gpus", {}).items() for i in items)


def mig_uuids(c: Cluster) -> list[str]:
    path = c.w.joinpath("var-lib-kubelet", "plugins", DRIVER, "simulated-mig.json")
    data = json.loads(path.read_text()) if path.exists() else {}
    return [i["uuid"] for items in data.get("gpus", {}).values() for i in items]


def pod(name: str, image: str, tmpl: str) -> dict[str, Any]:
    p = workload(name, image, {})
    p["metadata"]["namespace"] = NAMESPACE
    p["spec"]["resourceClaims"] = [{"name": "mig", "resourceClaimTemplateName": tmpl}]
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "mig"}]}
    return p


def get_pod(c: Cluster, name: str) -> dict[str, Any]:
    return c.get("pod", name, "-n", NAMESPACE)


def wait_running(c: Cluster, name: str, timeout: float = 240) -> dict[str, Any]:
    def running():
        p = get_pod(c, name)
        return p if p.get("status", {}).get("phase") == "Running" else None
    try:
        return wait_for(f"pod {name} Running", running, timeout)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{diagnose(c, NAMESPACE)}") from None


def allocated(c: Cluster, p: dict[str, Any]) -> list[str]:
    [s] = p["status"]["resourceClaimStatuses"]
    claim = c.get("resourceclaim", s["resourceClaimName"], "-n", NAMESPACE)
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def report(c: Cluster, name: str) -> dict[str, Any] | None:
    for line in c.kubectl("logs", "-n", NAMESPACE, name, check=False).stdout.splitlines():
        if line.startswith(REPORT_MARK):
            return json.loads(line[len(REPORT_MARK):])
    return None


def delete_pod(c: Cluster, name: str, timeout: float = 240) -> None:
    c.kubectl("delete", "pod", "-n", NAMESPACE, name, "--wait=false")
    wait_for(f"pod {name} gone", lambda: not c.get("pods", "-n", NAMESPACE, "--field-selector",
                                                   f"metadata.name={name}")["items"], timeout)


def test_the_api_server_keeps_the_counters_and_the_placements(installed):
    c = installed["c"]
    slices = wait_for("our slices with counters", lambda: [
        s for s in c.get("resourceslices")["items"]
        if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE] or None, 120)
    sets = sorted(cs["name"] for s in slices for cs in s["spec"].get("sharedCounters", []))
    assert sets == ["gpu-0-mig", "gpu-1-mig"], "the API server dropped sharedCounters (DRAPartitionableDevices off?)"
    devs = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
    assert devs["gpu-0-mig-1g-10gb-0"]["consumesCounters"][0]["counterSet"] == "gpu-0-mig"
    assert sorted(n for n in devs if n.startswith("gpu-2")) == ["gpu-2-mig-0", "gpu-2-mig-1", "gpu-2-mig-2"]
    assert mig_state(c) == []


def test_a_1g_claim_gets_an_instance_made_at_prepare(installed):
    c = installed["c"]
    with stage("1g.10gb pod Running (instance made)"):
        c.apply(pod("mig-a", installed["image"], "gpu0-1g"))
        p = wait_running(c, "mig-a")
    [dev] = allocated(c, p)
    start = int(dev.rsplit("-", 1)[1])
    assert dev.startswith("gpu-0-mig-1g-10gb-")
    assert mig_state(c) == [("GPU0", "1g.10gb", start)]
    rep = wait_for("pod mig-a's report", lambda: report(c, "mig-a"), 60)
    env = {k: v for k, v in rep["env"].items() if k.startswith("TOPO_DEV_")}
    assert list(env.values()) == mig_uuids(c), env  # the container names the instance that was made
    assert "/dev/nvidia0" in rep["devices"]
    installed["a_start"] = start


def test_a_second_claim_fits_in_the_remaining_counters(installed):
    c = installed["c"]
    with stage("3g.40gb pod Running beside it"):
        c.apply(pod("mig-b", installed["image"], "gpu0-3g"))
        p = wait_running(c, "mig-b")
    [dev] = allocated(c, p)
    assert dev.startswith("gpu-0-mig-3g-40gb-")
    assert len(mig_state(c)) == 2 and ("GPU0", "3g.40gb", int(dev.rsplit("-", 1)[1])) in mig_state(c)


def test_a_third_that_cannot_fit_stays_pending_with_the_schedulers_reason(installed):
    c = installed["c"]
    c.apply(pod("mig-c", installed["image"], "gpu0-4g"))

    def unschedulable():
        conds = get_pod(c, "mig-c").get("status", {}).get("conditions") or []
        return next((x for x in conds if x["type"] == "PodScheduled" and x["status"] == "False"
                     and x.get("reason") == "Unschedulable"), None)
    with stage("4g.40gb pod Unschedulable"):
        cond = wait_for("pod mig-c Unschedulable", unschedulable, 120)
    assert "claim" in cond["message"], cond["message"]
    installed["pending_reason"] = cond["message"]
    assert get_pod(c, "mig-c")["status"].get("phase") == "Pending"
    assert len(mig_state(c)) == 2


def test_a_driver_restart_leaks_and_doubles_nothing(installed):
    c = installed["c"]
    before = mig_state(c)
    old = installed["daemon"]["metadata"]["uid"]
    with stage("driver pod deleted -> new pod Ready"):
        c.kubectl("delete", "pod", "-n", NAMESPACE, installed["daemon"]["metadata"]["name"], "--wait=true")
        installed["daemon"] = wait_daemon_ready(c, not_uid=old)
    assert mig_state(c) == before
    for name in ("mig-a", "mig-b"):
        assert get_pod(c, name)["status"]["phase"] == "Running"


def test_deleting_a_pod_destroys_its_instance_and_the_pending_claim_then_fits(installed):
    c = installed["c"]
    with stage("1g pod deleted -> instance destroyed"):
        delete_pod(c, "mig-a")
        wait_for("the 1g instance destroyed",
                 lambda: ("GPU0", "1g.10gb", installed["a_start"]) not in mig_state(c), 120)
    with stage("pending 4g pod Running once the 1g is gone"):
        p = wait_running(c, "mig-c", timeout=300)
    assert allocated(c, p) == ["gpu-0-mig-4g-40gb-0"]
    assert sorted(x[1] for x in mig_state(c)) == ["3g.40gb", "4g.40gb"]
    with stage("all pods deleted -> no instance left"):
        delete_pod(c, "mig-b")
        delete_pod(c, "mig-c")
        wait_for("no MIG instance left", lambda: mig_state(c) == [], 120)


def test_a_static_mig_device_runs_and_the_container_sees_it(installed):
    c = installed["c"]
    with stage("static 2g.20gb pod Running"):
        c.apply(pod("mig-static", installed["image"], "gpu2-static-2g"))
        p = wait_running(c, "mig-static")
    [dev] = allocated(c, p)
    topo = installed["topology"]
    gpu2 = next(d for d in topo.gpus if d.index == 2)
    mig = next(m for m in topo.devices if m.parent == gpu2.name and m.attributes.get("profile") == "2g.20gb")
    assert dev == f"gpu-2-mig-{mig.index}"
    rep = wait_for("pod mig-static's report", lambda: report(c, "mig-static"), 60)
    assert mig.uuid in rep["env"].values()
    assert "/dev/nvidia2" in rep["devices"] and "/dev/nvidia0" not in rep["devices"]
    assert mig_state(c) == []  # nothing made for a static device
    delete_pod(c, "mig-static")
