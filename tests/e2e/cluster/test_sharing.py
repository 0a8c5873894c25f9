"""Time-slicing and MIG on a live cluster: what the operator configures is what pods get.

The chart is installed with NVIDIA's `sharing.timeSlicing` config as is (4 replicas of each
GPU of a simulated DGX A100): the node advertises GPUs x replicas, pods asking for replicas
run, and each container's `NVIDIA_VISIBLE_DEVICES` names the physical GPUs behind its replicas,
each once, as Allocate promised (checked through the real runtime); with NVIDIA's
`imex: {channelIDs: [0], required: true}` beside it, every replica container also has the IMEX
channel 0 node (made with mknod, the node file's stated major) and `NVIDIA_IMEX_CHANNELS=0`. Then `helm upgrade` moves
the node to the simulated DGX A100 with MIG partitions and `migStrategy: mixed`: one
resource per MIG profile appears in allocatable with the node's counts, and a pod asking for
a MIG device runs and sees it.
"""

from __future__ import annotations

import os
import stat

import pytest
import yaml
from cluster_fixtures import numa_layout, start_cluster
from workloads import (
    GPU,
    Node,
    chart_values,
    check_runtime_delivered,
    container_devices,
    delete_workloads,
    helm_upgrade,
    promised,
    report,
    wait_allocatable,
    wait_daemon_ready,
    wait_settled,
    workload,
)

pytestmark = pytest.mark.timeout(1800)

REPLICAS = 4
IMEX_MAJOR = 234  # the simulated node's stand-in for /proc/devices (any free character major would do)
IMEX_CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"


def with_imex_channel(node: Node) -> None:
    """Channel 0 under the node's dev root (mknod, as NVIDIA's CI makes them) and its major in the node file."""
    data = yaml.safe_load(node.node_file.read_text())
    data["imexChannelsMajor"] = IMEX_MAJOR
    node.node_file.write_text(yaml.safe_dump(data, sort_keys=False))
    (node.dev_root / "nvidia-caps-imex-channels").mkdir()
    os.mknod(node.dev_root / "nvidia-caps-imex-channels" / "channel0", 0o666 | stat.S_IFCHR,
             os.makedev(IMEX_MAJOR, 0))


def discover(node: Node, *extra: str) -> dict[str, int]:
    from kubelet_testlib import cli_json

    out = cli_json("discover", "--simulate", str(node.node_file), "--device-id-strategy", "index", *extra)
    return {r["name"]: len(r["devices"]) for r in out["resources"]}


@pytest.fixture(scope="module")
def shared(tmp_path_factory, cluster_inputs):
    node = Node.make(tmp_path_factory.mktemp("node"))
    numa, distances = node.numa_nodes()
    for c in start_cluster(tmp_path_factory, cluster_inputs, numa_layout(numa), distances, tm_policy="none"):
        yield {"c": c, "image": cluster_inputs["image"].ref, "inputs": cluster_inputs, "tmp": tmp_path_factory}


def test_time_slicing_replicas_as_nvidia_configures_them(shared):
    c, image = shared["c"], shared["image"]
    node = Node.make(shared["tmp"].mktemp("ts-node"))
    with_imex_channel(node)
    values = chart_values(image, node)
    values["config"]["sharing"] = {"timeSlicing": {"resources": [{"name": GPU, "replicas": REPLICAS}]}}
    values["config"]["imex"] = {"channelIDs": [0], "required": True}  # NVIDIA's keys: channel 0 to every container
    helm_upgrade(c, values)
    wait_daemon_ready(c)
    gpus = discover(node)[GPU]
    wait_allocatable(c, {GPU: str(gpus * REPLICAS)})
    problems = []
    for name, n in (("ts-a", 2), ("ts-b", 3), ("ts-c", 5)):
        c.apply(workload(name, image, {GPU: n}))
        pod = wait_settled(c, name)
        assert pod["status"]["phase"] == "Running", pod["status"]
        replicas = sorted(container_devices(c.podresources(), name)[GPU])
        assert len(replicas) == n and all("::" in r for r in replicas), replicas
        physical = sorted({r.split("::")[0] for r in replicas}, key=int)
        rep = report(c, name)
        problems += [f"{name}: {v}" for v in check_runtime_delivered(rep, promised(c, pod["metadata"]["uid"]))]
        seen = rep["env"].get("NVIDIA_VISIBLE_DEVICES", "").split(",")
        if sorted(seen, key=int) != physical or len(seen) != len(set(seen)):
            problems.append(f"{name}: NVIDIA_VISIBLE_DEVICES={seen}, replicas {replicas}")
        if rep["devices"].get(IMEX_CHANNEL) != [IMEX_MAJOR, 0] or rep["env"].get("NVIDIA_IMEX_CHANNELS") != "0":
            problems.append(f"{name}: IMEX channel {rep['devices'].get(IMEX_CHANNEL)}, "
                            f"NVIDIA_IMEX_CHANNELS={rep['env'].get('NVIDIA_IMEX_CHANNELS')}")
    assert not problems, "\n".join(problems)
    delete_workloads(c)


def test_mig_mixed_strategy_serves_one_resource_per_profile(shared):
    c, image = shared["c"], shared["image"]
    node = Node.make(shared["tmp"].mktemp("mig-node"), simulate="dgx-a100-mig")
    values = chart_values(image, node)
    values["config"]["flags"]["migStrategy"] = "mixed"
    helm_upgrade(c, values)
    wait_daemon_ready(c)
    counts = discover(node, "--mig-strategy", "mixed")
    mig = {r: n for r, n in counts.items() if r.startswith("nvidia.com/mig-")}
    assert len(mig) >= 2, counts
    wait_allocatable(c, {r: str(n) for r, n in counts.items()})
    resource = "nvidia.com/mig-1g.10gb"
    c.apply(workload("mig-a", image, {resource: 2}))
    pod = wait_settled(c, "mig-a")
    assert pod["status"]["phase"] == "Running", pod["status"]
    got = sorted(container_devices(c.podresources(), "mig-a")[resource])
    assert len(got) == 2, got
    promise = promised(c, pod["metadata"]["uid"])
    rep = report(c, "mig-a")
    assert check_runtime_delivered(rep, promise) == []
    # The container is told about exactly its MIG devices (NVIDIA names them by MIG UUID or index).
    assert rep["env"]["NVIDIA_VISIBLE_DEVICES"] == promise[resource]["envs"]["NVIDIA_VISIBLE_DEVICES"]
    assert len(rep["env"]["NVIDIA_VISIBLE_DEVICES"].split(",")) == 2
    delete_workloads(c)
