"""A container gets its GPUs from CDI alone, through the device-plugin API, on the real cluster.

The chart serves the GPUs through the device-plugin API (not DRA) with NVIDIA's settings for CDI
alone: `deviceListStrategy: cdi-cri` and `passDeviceSpecs: false`. The kubelet's checkpoint must
show that `Allocate` answered with CDI names and no device node at all, and the container, run
by containerd v2 with CDI on (conftest.py), must still see exactly its GPUs' device nodes with
the NVIDIA numbers (195:N) and `/dev/nvidiactl`: injected by containerd from the spec we wrote.

Then the same cluster with `cdiSpecs: external` and NVIDIA's own spec on the node: `nvidia-ctk
cdi generate` (v1.20.2) for a simulated driver root of the node's GPUs (toolkit_node.py). A pod
given 2 of the 8 GPUs sees exactly their two device nodes, every library file at the path the
spec names, the `libnvidia-ml.so.1` link its hook made, and `nvidia-smi -L` there (the probe,
dlopening `libnvidia-ml.so.1`: our NVML shim) lists exactly the two allocated GPUs. With a spec
generated with index names only, the kubelet's Allocate is refused with the fix, visible on the pod.
"""

from __future__ import annotations

import re

import pytest
from cluster_fixtures import numa_layout, start_cluster
from toolkit_node import PROBE, make_toolkit_spec
from workloads import Node, chart_values, helm_upgrade, report, wait_allocatable, wait_daemon_ready, \
    wait_settled, workload

pytestmark = pytest.mark.timeout(1500)

GPU = "nvidia.com/gpu"
NVIDIA_MAJOR = 195


@pytest.fixture(scope="module")
def env(tmp_path_factory, cluster_inputs):
    node = Node.make(tmp_path_factory.mktemp("node"), simulate="dgx-a100")
    numa, distances = node.numa_nodes()
    for c in start_cluster(tmp_path_factory, cluster_inputs, numa_layout(numa), distances, tm_policy="none"):
        yield {"c": c, "node": node, "image": cluster_inputs["image"].ref, "w": tmp_path_factory.mktemp("toolkit")}


def test_allocate_names_only_cdi_devices_and_the_container_gets_exactly_its_gpus(env):
    c, node, image = env["c"], env["node"], env["image"]
    values = chart_values(image, node)
    values["config"]["flags"].update({"deviceListStrategy": "cdi-cri", "passDeviceSpecs": False})
    helm_upgrade(c, values)
    wait_daemon_ready(c)
    wait_allocatable(c, {GPU: "8"})
    c.apply(workload("cdi-alone", image, {GPU: 2}))
    pod = wait_settled(c, "cdi-alone")
    assert pod["status"]["phase"] == "Running", pod["status"]

    (entry,) = [e for e in c.checkpoint() if e["pod_uid"] == pod["metadata"]["uid"] and e["resource"] == GPU]
    resp, ids = entry["response"], entry["ids"]
    assert len(ids) == 2
    assert list(resp.devices) == [], "CDI alone: Allocate lists no device node"
    assert sorted(d.name for d in resp.cdi_devices) == sorted(f"topo-dp.nvidia.com/gpu={i}" for i in ids)
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == "void"

    seen = report(c, "cdi-alone")["devices"]
    want = {f"/dev/nvidia{i}": [NVIDIA_MAJOR, int(i)] for i in ids}
    for path, numbers in {**want, "/dev/nvidiactl": [NVIDIA_MAJOR, 255]}.items():
        assert seen.get(path) == numbers, (path, seen)
    assert {p for p in seen if re.fullmatch(r"/dev/nvidia\d+", p)} == set(want), seen
    c.kubectl("delete", "pod", "-n", "default", "cdi-alone", "--wait=true", "--timeout=120s")


def probe_pod(name: str, image: str, paths: list[str]) -> dict:
    import json

    pod = workload(name, image, {GPU: 2})
    pod["spec"]["containers"][0]["command"] = ["python3", "-c", PROBE, json.dumps(paths)]
    return pod


def test_external_names_give_the_container_the_toolkits_files_and_nvml_sees_its_two_gpus(env):
    c, node, image = env["c"], env["node"], env["image"]
    spec = make_toolkit_spec(env["w"], node.node_file)
    c.sb.sh("cp", str(spec.path), "/var/run/cdi/nvidia.yaml")
    values = chart_values(image, node)
    values["config"]["flags"].update({"deviceListStrategy": "cdi-cri", "passDeviceSpecs": False,
                                      "cdiSpecs": "external", "toolkitCdiDirs": ["/var/run/cdi"]})
    helm_upgrade(c, values)
    wait_daemon_ready(c)
    wait_allocatable(c, {GPU: "8"})
    c.apply(probe_pod("toolkit-libs", image, spec.mounted))
    pod = wait_settled(c, "toolkit-libs")
    assert pod["status"]["phase"] == "Running", pod["status"]

    (entry,) = [e for e in c.checkpoint() if e["pod_uid"] == pod["metadata"]["uid"] and e["resource"] == GPU]
    ids = entry["ids"]  # deviceIdStrategy index (chart_values): GPU indexes
    uuids = sorted(spec.uuids[int(i)] for i in ids)
    assert sorted(d.name for d in entry["response"].cdi_devices) == [f"nvidia.com/gpu={u}" for u in uuids]
    assert list(entry["response"].devices) == []

    seen = report(c, "toolkit-libs")
    assert seen["devices"] == sorted(f"nvidia{i}" for i in ids), seen
    assert seen["files"] and all(seen["files"].values()), seen["files"]  # every library, nvidia-smi, firmware
    assert seen["nvml_link"] == f"libnvidia-ml.so.{spec.root.version}"
    assert seen["smi_rc"] == 0, seen["smi_err"]
    assert sorted(re.sub(r".*\(UUID: (.*)\)$", r"\1", ln) for ln in seen["smi"]) == uuids
    c.kubectl("delete", "pod", "-n", "default", "toolkit-libs", "--wait=true", "--timeout=120s")


def test_a_spec_without_the_uuid_names_refuses_the_allocate_with_the_fix(env):
    c, node, image = env["c"], env["node"], env["image"]
    stale = make_toolkit_spec(env["w"], node.node_file, strategies=("index",))
    c.sb.sh("cp", str(stale.path), "/var/run/cdi/nvidia.yaml")
    c.apply(probe_pod("toolkit-stale", image, []))
    pod = wait_settled(c, "toolkit-stale")
    assert pod["status"]["phase"] == "Failed", pod["status"]
    assert pod["status"].get("reason") == "UnexpectedAdmissionError"
    message = pod["status"].get("message", "")
    assert "is not defined in /var/run/cdi/nvidia.yaml" in message and "nvidia-ctk cdi generate" in message
    c.sb.sh("rm", "-f", "/var/run/cdi/nvidia.yaml")
