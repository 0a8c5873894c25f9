"""A container gets its GPUs from CDI alone, through the device-plugin API, on the real cluster.

The chart serves the GPUs through the device-plugin API (not DRA) with NVIDIA's settings for CDI
alone: `deviceListStrategy: cdi-cri` and `passDeviceSpecs: false`. The kubelet's checkpoint must
show that `Allocate` answered with CDI names and no device node at all, and the container, run
by containerd v2 with CDI on (conftest.py), must still see exactly its GPUs' device nodes with
the NVIDIA numbers (195:N) and `/dev/nvidiactl`: injected by containerd from the spec we wrote.
"""

from __future__ import annotations

import re

import pytest
from cluster_fixtures import numa_layout, start_cluster
from workloads import Node, chart_values, helm_upgrade, report, wait_allocatable, wait_daemon_ready, \
    wait_settled, workload

pytestmark = pytest.mark.timeout(1200)

GPU = "nvidia.com/gpu"
NVIDIA_MAJOR = 195


def test_allocate_names_only_cdi_devices_and_the_container_gets_exactly_its_gpus(tmp_path_factory, cluster_inputs):
    node = Node.make(tmp_path_factory.mktemp("node"), simulate="dgx-a100")
    numa, distances = node.numa_nodes()
    image = cluster_inputs["image"].ref
    for c in start_cluster(tmp_path_factory, cluster_inputs, numa_layout(numa), distances, tm_policy="none"):
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
