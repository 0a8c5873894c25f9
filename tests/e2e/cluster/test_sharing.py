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

Between the two, `helm upgrade` to NVIDIA's `sharing.mps` config (4 replicas of each GPU) with the
MPS stand-in (tests/support/mps_standin, placed in the node files: mps_node.py) as `mpsControlBinary`:
the replicas are registered but not allocatable while no control daemon can start, and become
allocatable once it answers with its defaults; a pod asking for one replica runs with the pipe
directory (its control socket answers from inside), the share's limits and `<mpsRoot>/shm` as
`/dev/shm`; a killed control daemon takes every replica out of allocatable until the supervisor has
started a new one, and the running pod keeps running.
"""

from __future__ import annotations

import json
import os
import pathlib
import stat

import mps_node
import pytest
import yaml
from cluster_fixtures import numa_layout, start_cluster
from sandbox import wait_for
from topo_testkit.short_dirs import short_tmp_dir
from workloads import (
    GPU,
    NAMESPACE,
    Node,
    chart_values,
    check_runtime_delivered,
    container_devices,
    daemon_pods,
    delete_workloads,
    helm_upgrade,
    promised,
    report,
    wait_allocatable,
    wait_daemon_ready,
    wait_settled,
    workload,
)

from plugin.sources.simulated import load_simulated

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
    # A short directory for the MPS root (its control socket's path), removed only after the cluster is down.
    with short_tmp_dir() as short:
        for c in start_cluster(tmp_path_factory, cluster_inputs, numa_layout(numa), distances, tm_policy="none"):
            yield {"c": c, "image": cluster_inputs["image"].ref, "inputs": cluster_inputs, "tmp": tmp_path_factory,
                   "short": pathlib.Path(short)}


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


MPS_REPLICAS = 2  # NVIDIA's sharing.mps needs 2 or more; the time-slicing test above uses 4


def test_mps_replicas_as_nvidia_configures_them_with_a_stand_in_control_daemon(shared):
    c, image = shared["c"], shared["image"]
    node = Node.make(shared["tmp"].mktemp("mps-node"))
    node_dir = node.node_file.parent
    binary = mps_node.place(node_dir, held=True)  # no control daemon can start until the stand-in is placed
    root = mps_node.mps_root(shared["short"])
    log_dir = root / "nvidia.com_gpu" / "log"
    values = chart_values(image, node)
    values["config"]["sharing"] = {"mps": {"resources": [{"name": GPU, "replicas": MPS_REPLICAS}]}}
    values["config"]["flags"].update({"mpsRoot": str(root), "mpsControlBinary": str(binary)})
    old = next((p["metadata"]["uid"] for p in daemon_pods(c)), None)  # none when this test runs alone
    helm_upgrade(c, values)
    wait_daemon_ready(c, not_uid=old)
    gpus = discover(node)[GPU]
    replicas = str(gpus * MPS_REPLICAS)  # not the time-slicing test's count: these are the new daemon's
    # Registered, none allocatable: no control daemon is ready, so no pod can get a replica.
    wait_for("the MPS replicas registered, none allocatable",
             lambda: c.capacity().get(GPU) == replicas and c.allocatable().get(GPU) == "0", 180)
    assert not (root / "nvidia.com_gpu" / ".ready").exists() and mps_node.records(log_dir) == []
    [daemon] = daemon_pods(c)
    said = c.kubectl("logs", "-n", NAMESPACE, daemon["metadata"]["name"]).stdout
    assert "MPS control daemon not started" in said and "held by the test" in said, said[-2000:]
    c.apply(workload("mps-a", image, {GPU: 1}))
    wait_for("pod mps-a unschedulable (no replica allocatable)", lambda: unschedulable(c, "mps-a"), 180)

    # The stand-in in place: the supervisor's next try starts it, sets the defaults, and the replicas turn up.
    mps_node.place(node_dir)
    wait_allocatable(c, {GPU: replicas})
    assert (root / "nvidia.com_gpu" / ".ready").exists()
    recs = mps_node.records(log_dir)
    [first] = [r for r in recs if r["event"] == "start"]
    # Every GPU of the node once, named as the containers' NVIDIA_VISIBLE_DEVICES names it (a real GPU by its
    # UUID; these simulated ones have none, and the chart's deviceIdStrategy here is index).
    assert first["CUDA_VISIBLE_DEVICES"].split(",") == [str(i) for i in range(gpus)], first
    memory = load_simulated(str(node.node_file)).gpus[0].memory_mib
    assert memory
    mib = memory // MPS_REPLICAS
    assert mps_node.settings_told(recs) == [f"set_default_device_pinned_mem_limit {n} {mib}M" for n in range(gpus)] \
        + [f"set_default_active_thread_percentage {100 // MPS_REPLICAS}"]

    pod = wait_settled(c, "mps-a")
    assert pod["status"]["phase"] == "Running", pod["status"]
    [replica] = container_devices(c.podresources(), "mps-a")[GPU]
    rep = report(c, "mps-a")
    assert check_runtime_delivered(rep, promised(c, pod["metadata"]["uid"])) == []
    pipe = "/mps/nvidia.com_gpu/pipe"
    env = {k: v for k, v in rep["env"].items() if k.startswith("CUDA_MPS_")}
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(100 // MPS_REPLICAS),
                   "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={mib}M"}, env
    assert rep["env"]["NVIDIA_VISIBLE_DEVICES"] == replica.split("::")[0]
    assert pipe in rep["mounts"] and "/dev/shm" in rep["mounts"]
    # From inside: the pipe directory is the control daemon's (its socket answers with the share), and
    # /dev/shm is the host's <mpsRoot>/shm (a file the host puts there is seen), where MPS clients meet servers.
    (root / "shm" / "from-host").write_text("written on the node")
    inside = json.loads(c.kubectl("exec", "-n", "default", "mps-a", "--", "python3", "-c", mps_node.INSIDE,
                                  pipe, "from-host").stdout)
    assert "control" in inside["pipe"] and "nvidia-cuda-mps-control.pid" in inside["pipe"], inside
    assert inside["answer"] == {"ok": True, "out": str(100 // MPS_REPLICAS)}, inside
    assert inside["shm"] == "written on the node", inside
    # The workload runs as its image's non-root user, as many do: it can still make its segment in /dev/shm.
    assert inside["uid"] != 0 and inside["shm_write_error"] is None, inside
    assert (root / "shm" / f"client-{inside['uid']}").read_text() == "client"

    # The control daemon dies (and cannot come back while held): every replica leaves allocatable; the pod runs on.
    mps_node.place(node_dir, held=True)
    pid = int((root / "nvidia.com_gpu" / "pipe" / "nvidia-cuda-mps-control.pid").read_text())
    [daemon] = daemon_pods(c)
    c.kubectl("exec", "-n", NAMESPACE, daemon["metadata"]["name"], "--", "python3", "-c",
              f"import os, signal; os.kill({pid}, signal.SIGKILL)")
    wait_allocatable(c, {GPU: "0"})
    assert c.capacity().get(GPU) == replicas
    assert phase_of(c, "mps-a") == "Running"
    mps_node.place(node_dir)
    wait_allocatable(c, {GPU: replicas})
    starts = [r for r in mps_node.records(log_dir) if r["event"] == "start"]
    assert len(starts) == 2 and starts[1]["pid"] != pid, starts
    assert phase_of(c, "mps-a") == "Running"
    delete_workloads(c)


def phase_of(c, name: str) -> str:
    return c.get("pod", name, "-n", "default")["status"]["phase"]


def unschedulable(c, name: str) -> bool:
    conds = c.get("pod", name, "-n", "default").get("status", {}).get("conditions", [])
    return any(x.get("type") == "PodScheduled" and x.get("reason") == "Unschedulable" for x in conds)


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
