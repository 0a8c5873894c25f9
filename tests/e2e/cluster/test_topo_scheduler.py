"""The topology-aware scheduler (scheduler-plugins' NodeResourceTopologyMatch) reads what we publish.

A real control plane (etcd, kube-apiserver, kube-controller-manager, the default kube-scheduler)
in the e2e sandbox, without a kubelet, plus the second scheduler started by topo_scheduler.py.
Two fake Nodes with the same allocatable (a simulated DGX H100: 8 GPUs, 8 NICs), each with the
NodeResourceTopology object plugin/nrt/build.py makes for it, one with a GPU held in each NUMA
zone ("fragmented": by count it fits a pod of 4 GPUs + 4 NICs, on one NUMA node it does not):

pods naming `topo-aware-scheduler` go only to the node that can align them, and once that one is
full by count the next one stays Pending with the plugin's reason, although the fragmented node has
the count; the same pod under the default scheduler is then bound to the fragmented node (where a
kubelet at `single-numa-node` would reject it with TopologyAffinityError).

What this shows and what not: the scheduler built from its pinned module starts against our
1.37 control plane with the chart's CRD and the launcher's RBAC, and filters on our objects'
zones, policy and scope. The multi-node proof with kubelets and the daemon is another test.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

import cluster_build
import cluster_fixtures
import kubelet_build
import topo_scheduler
from cluster import Binaries, Cluster
from sandbox import host_mounts_under, tools_missing, wait_for

from plugin.model.resources import ResourceOptions, build_resources
from plugin.nrt.build import TopologyManagerSettings, build_nrt, published_resources
from plugin.sources.simulated import load_simulated

TOPOLOGY = "dgx-h100"
ALIGNED, FRAGMENTED = "nrt-aligned", "nrt-fragmented"
ASK = {"nvidia.com/gpu": "4", "topo.dev/nic": "4"}


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory) -> Iterator[Cluster]:
    """A cluster's control plane only (no containerd, no kubelet), with the second scheduler."""
    if os.geteuid() != 0:
        cluster_fixtures.unavailable("the sandbox needs root (namespaces, mounts)")
    missing = tools_missing(("unshare", "nsenter", "mount", "ip", "openssl"))
    if missing:
        cluster_fixtures.unavailable(f"missing {', '.join(missing)}")
    try:
        cp = cluster_build.controlplane()
        binary = topo_scheduler.build()
    except (kubelet_build.BuildUnavailable, topo_scheduler.BuildUnavailable) as e:
        cluster_fixtures.unavailable(str(e))
    unused = pathlib.Path("/nonexistent")  # the parts of a node this test does not start
    bins = Binaries(controlplane=cp, kubelet=unused, helm=unused, harness=unused, cni_bin=unused,
                    pause_archive=unused, pause_image="unused")
    w = tmp_path_factory.mktemp("topo-scheduler")
    c = Cluster(w, bins)
    sched = topo_scheduler.TopoScheduler(c, binary=binary)
    try:
        try:
            c.sb.start()
            c.certificates()
            c.start_etcd()
            c.start_apiserver()
            c.start_controllers()
            # Pods are refused until the controller manager has made the namespace's account.
            wait_for("the default ServiceAccount", lambda: c.kubectl("get", "serviceaccount", "default",
                                                                     check=False).returncode == 0, 120)
            sched.start(install_crd=True)
        except Exception as e:  # noqa: BLE001 - report with the daemons' logs
            pytest.fail(f"control plane bring-up failed: {e}\n{c.sb.tail('kube-apiserver')}\n{sched.logs_tail()}")
        yield c
    finally:
        sched.stop()  # an API client: before the API server, which c.down() stops first
        c.down()
        assert host_mounts_under(w) == []


def node(name: str) -> dict[str, Any]:
    status = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8", "topo.dev/nic": "8"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": status, "allocatable": status,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Test",
                                       "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}


def pod(name: str, scheduler: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                     # No kubelet heartbeats: the node controller taints the fake nodes; tolerate that.
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"limits": ASK}}]}}


@pytest.fixture(scope="module")
def nodes(control_plane: Cluster) -> Cluster:
    c = control_plane
    topo = load_simulated(TOPOLOGY)
    resources = published_resources(build_resources(topo, ResourceOptions()))
    gpus = next(r for r in resources if r.name == "nvidia.com/gpu")
    one_per_zone = {(gpus.name, d.id) for d in {d.numa: d for d in gpus.devices}.values()}
    settings = TopologyManagerSettings("single-numa-node", "container")
    for name, held in ((ALIGNED, set()), (FRAGMENTED, one_per_zone)):
        c.kubectl("create", "-f", "-", input=json.dumps(node(name)))
        if c.get("node", name)["status"].get("allocatable", {}).get("nvidia.com/gpu") != "8":
            c.kubectl("patch", "node", name, "--subresource=status", "--type=merge",
                      "-p", json.dumps({"status": node(name)["status"]}))
        uid = c.get("node", name)["metadata"]["uid"]
        c.kubectl("create", "-f", "-", input=json.dumps(build_nrt(name, topo, resources, held, settings, uid)))
    return c


def bound_node(c: Cluster, name: str) -> str | None:
    return c.get("pod", name, "-n", "default")["spec"].get("nodeName")


def unschedulable_message(c: Cluster, name: str) -> str | None:
    for cond in c.get("pod", name, "-n", "default").get("status", {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message", ""))
    return None


def test_topology_aware_scheduler_binds_only_where_a_zone_aligns_the_pod(nodes: Cluster) -> None:
    c = nodes
    for i in (1, 2):  # the aligned node's two zones, one pod each
        c.kubectl("create", "-f", "-", input=json.dumps(pod(f"aware-{i}", topo_scheduler.SCHEDULER_NAME)))
        where = wait_for(f"aware-{i} bound", lambda i=i: bound_node(c, f"aware-{i}"), 120)
        assert where == ALIGNED, f"aware-{i} bound to {where}, whose zones cannot hold 4 GPUs + 4 NICs"
    # The aligned node is full by count; the fragmented one has the count but no zone for it.
    c.kubectl("create", "-f", "-", input=json.dumps(pod("aware-3", topo_scheduler.SCHEDULER_NAME)))
    msg = wait_for("aware-3 reported unschedulable", lambda: unschedulable_message(c, "aware-3"), 120)
    assert bound_node(c, "aware-3") is None
    assert "cannot align" in msg, msg
    assert "Insufficient nvidia.com/gpu" in msg, msg  # the other node: full by count

    # The same pod under the default scheduler: bound to the fragmented node, where a kubelet at
    # single-numa-node would reject it (TopologyAffinityError).
    c.kubectl("create", "-f", "-", input=json.dumps(pod("default-1", "default-scheduler")))
    assert wait_for("default-1 bound", lambda: bound_node(c, "default-1"), 120) == FRAGMENTED
