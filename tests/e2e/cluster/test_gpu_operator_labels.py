"""The chart's pod steps aside while the GPU Operator's tools pause a node, on a real cluster.

No GPU Operator runs here (no GPUs, no registry): the test writes the node labels the way
NVIDIA's mig-manager (mig-parted v0.15.0, pkg/mig/reconfigure/reconfigure.go) and driver manager
(k8s-driver-manager v0.12.0) write them, and the real DaemonSet controller, scheduler and kubelet
(v1.37.2) do the rest: the plugin's pod must leave while a label is paused (the node's GPU
allocatable drops to 0), and a new one must serve the node again after the labels are restored.
The chart is installed with `gpuOperator.gpuClientNodeSelector` on, as docs/gpu-operator.md
recommends under a v26.7 `ClusterPolicy`: then mig-manager can see our pod by its nodeSelector key
and wait for it, which the test checks the way mig-manager looks (DaemonSet pods on the node whose
nodeSelector names `nvidia.com/gpu.deploy.client`). The tests run in file order.
"""

from __future__ import annotations

from typing import Any

import pytest
from cluster import NODE
from cluster_fixtures import numa_layout, start_cluster
from sandbox import wait_for
from workloads import (
    GPU,
    Node,
    chart_values,
    daemon_pods,
    helm_upgrade,
    wait_allocatable,
    wait_daemon_ready,
)

pytestmark = pytest.mark.timeout(1800)

DEVICE_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
CLIENT = "nvidia.com/gpu.deploy.client"


@pytest.fixture(scope="module")
def env(tmp_path_factory, cluster_inputs):
    node = Node.make(tmp_path_factory.mktemp("node"))
    numa, distances = node.numa_nodes()
    for c in start_cluster(tmp_path_factory, cluster_inputs, numa_layout(numa), distances, tm_policy="none"):
        # What the GPU Operator v26.7.0 puts on a GPU node under a ClusterPolicy.
        label(c, {DEVICE_PLUGIN: "true", CLIENT: "true"})
        values = chart_values(cluster_inputs["image"].ref, node, gpuOperator={"gpuClientNodeSelector": True})
        helm_upgrade(c, values)
        yield {"c": c}


def label(c, labels: dict[str, str]) -> None:
    """One patch, as mig-manager's setNodeLabels does."""
    c.kubectl("label", "node", NODE, "--overwrite", *(f"{k}={v}" for k, v in labels.items()))


def mig_manager_would_wait_for(c) -> list[str]:
    """mig-manager's waitForPodsWithNodeSelector: DaemonSet pods on the node whose nodeSelector has the key."""
    pods = c.get("pods", "-A", "--field-selector", f"spec.nodeName={NODE}")["items"]
    out = []
    for p in pods:
        owners = [o for o in p["metadata"].get("ownerReferences", []) if o.get("controller")]
        if owners and owners[0]["kind"] == "DaemonSet" and CLIENT in (p["spec"].get("nodeSelector") or {}):
            out.append(p["metadata"]["name"])
    return out


def wait_gone(c) -> None:
    wait_for("the plugin's pod to leave the node", lambda: not daemon_pods(c), 240)
    wait_allocatable(c, {GPU: "0"})


def serving(env: dict[str, Any], not_uid: str | None = None) -> dict[str, Any]:
    pod = wait_daemon_ready(env["c"], not_uid=not_uid)
    wait_allocatable(env["c"], {GPU: "8"})
    return pod


def test_the_pod_serves_the_node_and_mig_manager_would_wait_for_it(env):
    pod = serving(env)
    env["uid"] = pod["metadata"]["uid"]
    assert pod["spec"]["nodeSelector"] == {CLIENT: "true"}
    assert mig_manager_would_wait_for(env["c"]) == [pod["metadata"]["name"]]


def test_mig_repartition_pause_removes_the_pod_and_restore_brings_a_new_one(env):
    c = env["c"]
    label(c, {DEVICE_PLUGIN: "paused-for-mig-change", CLIENT: "paused-for-mig-change"})
    wait_gone(c)
    assert mig_manager_would_wait_for(c) == []  # mig-manager's wait is over only now
    label(c, {DEVICE_PLUGIN: "true", CLIENT: "true"})
    env["uid"] = serving(env, not_uid=env["uid"])["metadata"]["uid"]


def test_nvidia_plugin_off_on_the_node_and_the_client_label_carries_the_pause(env):
    """mig-manager keeps `false` as `false`: only the client label is paused. (That `false` alone
    keeps our pod is checked on the rendered chart, tests/chart/test_chart_gpu_operator.py: here no
    event says the DaemonSet controller has seen the change.)"""
    c = env["c"]
    label(c, {DEVICE_PLUGIN: "false", CLIENT: "paused-for-mig-change"})
    wait_gone(c)
    label(c, {DEVICE_PLUGIN: "false", CLIENT: "true"})
    env["uid"] = serving(env, not_uid=env["uid"])["metadata"]["uid"]


def test_driver_manager_pause_of_the_device_plugin_label_alone_removes_the_pod(env):
    """The affinity (honourDeployLabels, default on) follows the device-plugin label by itself."""
    c = env["c"]
    label(c, {DEVICE_PLUGIN: "paused-for-driver-upgrade", CLIENT: "true"})
    wait_gone(c)
    label(c, {DEVICE_PLUGIN: "true", CLIENT: "true"})
    serving(env, not_uid=env["uid"])
