"""A shared, time-sliced GPU claim on a real Kubernetes 1.37 cluster: two pods, one GPU, one setting.

One cluster for this module (tests/e2e/cluster, containerd with CDI as in test_dra_cluster.py);
the chart serves the simulated DGX H100's GPUs through DRA. The story:
- a ResourceClaim (not a template) asks for one GPU with our GpuConfig `sharing: TimeSlicing,
  interval: Short`; two pods name it. The scheduler allocates it once and reserves it for both;
  the kubelet prepares it once; both containers get the same GPU device node and env, and
  `TOPO_DEV_<GPU>_TIMESLICE=Short`; the simulated GPU backend's settings file says Short;
- a claim whose config asks an interval that does not exist: its pod never starts, the kubelet's
  event carries our reason (field and fix), nothing is prepared;
- deleting the first pod keeps the claim prepared for the second; deleting the second
  unprepares it once: checkpoint entry, CDI spec and the GPU's setting are gone;
- consumable capacity (`draSharedGpus`: GPUs published with allowMultipleAllocations; the
  DRAConsumableCapacity gate is on by default in 1.37): three claims each take 10Gi of one GPU's
  memory. The GPU has one time-slice setting: the claims asking Long both run on it, the one
  asking Short waits with our reason;
- shares by count (`draGpuShares: 2`, after a `helm upgrade`): two claims that name neither
  memory nor shares run on one GPU with a share each, a third for the same GPU stays unscheduled;
- MPS (NVIDIA's `GpuConfig` `sharing.strategy: MPS` with `mpsConfig`; the MPS stand-in of
  tests/support/mps_standin placed in the node files as `mpsControlBinary`): two claims, each with its
  own limits, take 10Gi of one GPU; their two pods run, each container has the GPU's pipe directory
  (its control socket answers from inside), `/dev/shm` from `<mpsRoot>/shm` and its own claim's limits;
  the stand-in started one control daemon for the GPU, with the first claim's defaults, and quits it
  when the last claim is unprepared (after its pod is gone), not before;
- host-managed IMEX channels (`draImexChannels: 2`, the simulated node stating the channels'
  major as /proc/devices would): a pod's claim for a channel (the chart's class
  `imex-channel.topo.dev`) gets its device node with that major;
- last, on three nodes (two more join the module's control plane, one release serves all three): two
  nodes' GPUs in one simulated NVLink clique, the third's in another. A Job of two pods, each with a
  claim for channel 0 on the first clique and held apart by pod anti-affinity, runs one pod on each
  node of that clique with channel0 inside; a pod asking the same but pinned to the other clique's
  node stays Pending, Unschedulable.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import re
import time
from collections.abc import Callable
from typing import Any

import mps_node
import pytest
import yaml
from cluster import NODE, NODE_FILES, Cluster
from cluster_fixtures import down_and_check_nothing_left, numa_layout, start_cluster
from sandbox import NODE_IP, wait_for
from topo_testkit.short_dirs import short_tmp_dir
from workloads import NAMESPACE, REPORT_MARK, Node, chart_values, daemon_pods, diagnose, helm_upgrade, ready, \
    wait_daemon_ready, workload

from plugin.dra.kubelet.checkpoint import ClaimCheckpoint
from plugin.dra.claims.gpu_config import NVIDIA_API_VERSION
from plugin.dra.claims.mps import STATE_FILE as MPS_STATE_FILE
from plugin.dra.claims.sharing import SIMULATED_STATE_FILE
from plugin.dra.slices.build import SliceOptions, device_table
from plugin.sources.simulated import load_simulated

pytestmark = pytest.mark.timeout(1800)

DRIVER = "topo.dev"


@pytest.fixture(scope="module")
def installed(tmp_path_factory, cluster_inputs):
    node = Node.make(tmp_path_factory.mktemp("node"), simulate="dgx-h100")
    numa, distances = node.numa_nodes()
    # MPS claims: the stand-in control program in the node files the daemon pod mounts (mps_node.py says why),
    # and an MPS root short enough for the control sockets under it, removed only after the cluster is down.
    mps_binary = mps_node.place(node.node_file.parent)
    with short_tmp_dir() as short:
        mps_root = mps_node.mps_root(pathlib.Path(short))
        for c in start_cluster(tmp_path_factory, cluster_inputs, numa_layout(numa), distances, tm_policy="none"):
            values = chart_values(
                cluster_inputs["image"].ref, node,
                dra={"resources": ["nvidia.com/gpu"]},
                extraEnv=[{"name": "KUBERNETES_SERVICE_HOST", "value": NODE_IP},
                          {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}])
            values["config"]["flags"].update({"draSharedGpus": True, "mpsRoot": str(mps_root),
                                              "mpsControlBinary": str(mps_binary)})
            helm_upgrade(c, values)
            wait_daemon_ready(c)
            topology = load_simulated(str(node.node_file))
            yield {"c": c, "node": node, "image": cluster_inputs["image"].ref, "mps_root": mps_root,
                   "table": device_table(topology, SliceOptions(node_name=NODE))}


# ---- helpers ---------------------------------------------------------------------------------------


def gpu_claim(name: str, interval: str, gpu_index: int | None = None, memory: str | None = None) -> dict[str, Any]:
    """A claim for one GPU with a time-slice; `gpu_index` pins the GPU, `memory` asks for a share of it."""
    exactly: dict[str, Any] = {"deviceClassName": f"gpu.{DRIVER}"}
    if gpu_index is not None:
        exactly["selectors"] = [{"cel": {"expression": f'device.attributes["{DRIVER}"].index == {gpu_index}'}}]
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": exactly}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "gpu.topo-device-plugin.io/v1alpha1", "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}}}],
        }},
    }


def claim_pod(name: str, image: str, claim: str) -> dict[str, Any]:
    pod = workload(name, image, {})
    pod["metadata"]["namespace"] = NAMESPACE
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return pod


def get_pod(c: Cluster, name: str) -> dict[str, Any]:
    return c.get("pod", name, "-n", NAMESPACE)


def wait_running(c: Cluster, name: str) -> dict[str, Any]:
    def running():
        p = get_pod(c, name)
        return p if p.get("status", {}).get("phase") == "Running" else None
    try:
        return wait_for(f"pod {name} Running", running, 240)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{diagnose(c, NAMESPACE)}") from None


def report(c: Cluster, name: str) -> dict[str, Any] | None:
    out = c.kubectl("logs", "-n", NAMESPACE, name, check=False).stdout
    for line in out.splitlines():
        if line.startswith(REPORT_MARK):
            return json.loads(line[len(REPORT_MARK):])
    return None


def plugin_dir(c: Cluster) -> pathlib.Path:
    return c.w.joinpath("var-lib-kubelet", "plugins", DRIVER)


def prepared(c: Cluster) -> dict[str, Any]:
    d = plugin_dir(c)
    return ClaimCheckpoint(str(d / "checkpoint.json"), str(d / "serialize.lock"), DRIVER).load()


def gpu_settings(c: Cluster) -> dict[str, Any]:
    """The simulated GPU backend's settings file (UUID -> index, computeMode, timeslice)."""
    path = plugin_dir(c) / SIMULATED_STATE_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def claim_specs(c: Cluster) -> list[str]:
    out = c.sb.sh("ls", "-1", "/var/run/cdi", check=False).stdout.split()
    return sorted(n for n in out if n.startswith(f"{DRIVER}-claim_"))


def driver_log_lines(c: Cluster, pattern: str) -> list[str]:
    [daemon] = daemon_pods(c)
    out = c.kubectl("logs", "-n", NAMESPACE, daemon["metadata"]["name"], check=False).stdout
    return [line for line in out.splitlines() if re.search(pattern, line)]


def pod_events(c: Cluster, name: str) -> list[str]:
    items = c.get("events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={name}")["items"]
    return [f"{e.get('reason')}: {e.get('message')}" for e in items]


def feature_gates(metrics: str) -> dict[str, tuple[str, bool]]:
    """{gate: (stage, enabled)} from a component's kubernetes_feature_enabled metric."""
    return {m.group(1): (m.group(2), m.group(3) == "1") for m in re.finditer(
        r'^kubernetes_feature_enabled\{name="(\w+)",stage="(\w*)"\} (\d)', metrics, re.M)}


def delete_pod(c: Cluster, name: str) -> None:
    c.kubectl("delete", "pod", "-n", NAMESPACE, name, "--wait=false")
    wait_for(f"pod {name} gone", lambda: not c.get("pods", "-n", NAMESPACE, "--field-selector",
                                                   f"metadata.name={name}")["items"], 240)


# ---- the story -------------------------------------------------------------------------------------


def test_a_time_sliced_claim_shared_by_two_pods_runs_both_on_one_gpu(installed):
    c, image = installed["c"], installed["image"]
    c.apply(gpu_claim("shared-gpu", "Short"))
    t0 = time.monotonic()
    for name in ("share-a", "share-b"):
        c.apply(claim_pod(name, image, "shared-gpu"))
    pods = {name: wait_running(c, name) for name in ("share-a", "share-b")}
    print(f"\ntwo pods of one time-sliced claim Running {time.monotonic() - t0:.1f} s after creation")
    claim = c.get("resourceclaim", "shared-gpu", "-n", NAMESPACE)
    [res] = claim["status"]["allocation"]["devices"]["results"]
    assert (res["driver"], res["pool"], res["request"]) == (DRIVER, NODE, "gpu")
    gpu = res["device"]
    uid = claim["metadata"]["uid"]
    # Reserved for both pods; one allocation.
    assert sorted(r["uid"] for r in claim["status"]["reservedFor"]) == sorted(
        p["metadata"]["uid"] for p in pods.values())
    # Prepared once: one checkpoint entry with the interval recorded on the GPU, one prepare by us.
    entry = prepared(c)[uid]
    assert [(d.device, d.timeslice) for d in entry.devices] == [(gpu, "Short")]
    assert len(driver_log_lines(c, rf"\bprepared claim.*{uid}|{uid}.*\bprepared claim")) == 1
    # The GPU's setting, as the simulated backend holds it.
    dev = installed["table"][gpu]
    assert gpu_settings(c) == {dev.uuid: {"index": dev.index, "computeMode": "Default", "timeslice": "Short"}}
    # Both containers: the same GPU device node (same numbers) and env, with the interval.
    key = gpu.replace("-", "_").upper()
    reps = {n: wait_for(f"pod {n}'s report", lambda n=n: report(c, n), 60) for n in pods}
    seen = []
    for name, rep in reps.items():
        nodes = {p: v for p, v in rep["devices"].items() if re.fullmatch(r"/dev/nvidia\d+", p)}
        env = {k: v for k, v in rep["env"].items() if k.startswith("TOPO_DEV_")}
        seen.append((nodes, env))
    assert seen[0] == seen[1], seen
    nodes, env = seen[0]
    minor = dev.minor if dev.minor is not None else dev.index  # a simulated GPU's minor is its index
    assert list(nodes) == [f"/dev/nvidia{minor}"]
    assert env == {f"TOPO_DEV_{key}": dev.uuid, f"TOPO_DEV_{key}_TIMESLICE": "Short"}
    installed.update(uid=uid, gpu=gpu)


def test_a_bad_sharing_config_keeps_the_pod_from_starting_with_the_reason(installed):
    c, image = installed["c"], installed["image"]
    c.apply(gpu_claim("bad-gpu", "Fast"))
    c.apply(claim_pod("bad", image, "bad-gpu"))

    def refused():
        msgs = [m for m in pod_events(c, "bad") if "timeSlicingConfig.interval" in m]
        return msgs or None
    try:
        msgs = wait_for("the kubelet's event with our reason", refused, 180)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{diagnose(c, NAMESPACE)}") from None
    assert "'Fast' is not an interval" in msgs[0] and "Default, Short, Medium, Long" in msgs[0], msgs
    p = get_pod(c, "bad")
    assert p["status"]["phase"] == "Pending"
    [cs] = p["status"].get("containerStatuses") or [{"state": {"waiting": {"reason": "ContainerCreating"}}}]
    assert "running" not in cs["state"], cs
    bad_uid = c.get("resourceclaim", "bad-gpu", "-n", NAMESPACE)["metadata"]["uid"]
    assert bad_uid not in prepared(c)
    assert f"{DRIVER}-claim_{bad_uid}.json" not in claim_specs(c)
    # The shared GPU's setting is untouched by the refused claim.
    assert [v["timeslice"] for v in gpu_settings(c).values()] == ["Short"]
    delete_pod(c, "bad")


def test_the_claim_is_unprepared_once_after_the_last_pod_is_gone(installed):
    c = installed["c"]
    uid = installed["uid"]
    delete_pod(c, "share-a")
    wait_for("share-a out of reservedFor", lambda: [r["name"] for r in c.get(
        "resourceclaim", "shared-gpu", "-n", NAMESPACE)["status"].get("reservedFor", [])] == ["share-b"], 120)
    # Still prepared for share-b, which keeps running on the time-sliced GPU.
    assert uid in prepared(c)
    assert f"{DRIVER}-claim_{uid}.json" in claim_specs(c)
    assert get_pod(c, "share-b")["status"]["phase"] == "Running"
    assert [v["timeslice"] for v in gpu_settings(c).values()] == ["Short"]
    t0 = time.monotonic()
    delete_pod(c, "share-b")
    wait_for("the claim unprepared", lambda: uid not in prepared(c), 120)
    print(f"\nlast pod deleted -> claim unprepared and the GPU back to Default: {time.monotonic() - t0:.1f} s")
    assert f"{DRIVER}-claim_{uid}.json" not in claim_specs(c)
    assert gpu_settings(c) == {}, "the GPU's time-slice goes back to Default with its last claim"
    assert len(driver_log_lines(c, rf"unprepared claim.*{uid}|{uid}.*unprepared claim")) == 1


MPS_CLAIMS = {"mps-a": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"},
              "mps-b": {"defaultActiveThreadPercentage": 30, "defaultPinnedDeviceMemoryLimit": "4Gi"}}


def mps_claim(name: str, gpu_index: int, mps: dict[str, Any]) -> dict[str, Any]:
    """A claim for 10Gi of the GPU of `gpu_index`, with NVIDIA's GpuConfig `sharing.strategy: MPS` and `mps`."""
    exactly = {"deviceClassName": f"gpu.{DRIVER}", "capacity": {"requests": {"memory": "10Gi"}},
               "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].index == {gpu_index}'}}]}
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": exactly}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": mps}}}}],
        }},
    }


def mps_holders(c: Cluster) -> dict[str, list[str]]:
    """{GPU UUID: claim UIDs} from the driver's record of who holds which control daemon."""
    path = plugin_dir(c) / MPS_STATE_FILE
    return {k: e["holders"] for k, e in json.loads(path.read_text()).items()} if path.exists() else {}


def test_two_mps_claims_on_one_gpu_share_one_control_daemon_that_quits_with_the_last(installed):
    c, image, root = installed["c"], installed["image"], installed["mps_root"]
    dev = installed["table"]["gpu-6"]
    minor = dev.minor if dev.minor is not None else dev.index  # a simulated GPU's minor is its index
    for name, mps in MPS_CLAIMS.items():
        c.apply(mps_claim(name, 6, mps))
    # The first claim's prepare starts the daemon with its defaults: start its pod alone.
    c.apply(claim_pod("mps-a", image, "mps-a"))
    wait_running(c, "mps-a")
    c.apply(claim_pod("mps-b", image, "mps-b"))
    wait_running(c, "mps-b")
    claims = {n: c.get("resourceclaim", n, "-n", NAMESPACE) for n in MPS_CLAIMS}
    uids = {n: cl["metadata"]["uid"] for n, cl in claims.items()}
    assert {r["device"] for cl in claims.values() for r in cl["status"]["allocation"]["devices"]["results"]} == \
        {"gpu-6"}
    log_dir = root / f"dra-{dev.uuid}" / "log"
    recs = mps_node.records(log_dir)
    assert [r["CUDA_VISIBLE_DEVICES"] for r in recs if r["event"] == "start"] == [dev.uuid], recs
    assert mps_node.settings_told(recs) == ["set_default_device_pinned_mem_limit 0 10240M",
                                            "set_default_active_thread_percentage 50"]
    assert sorted(mps_holders(c)[dev.uuid]) == sorted(uids.values())
    pipe = f"/mps/dra-{dev.uuid}/pipe"
    (root / "shm" / "from-host").write_text("written on the node")
    for name, pinned in (("mps-a", "0=10240M"), ("mps-b", "0=4096M")):
        rep = wait_for(f"pod {name}'s report", lambda n=name: report(c, n), 60)
        assert [p for p in rep["devices"] if re.fullmatch(r"/dev/nvidia\d+", p)] == [f"/dev/nvidia{minor}"]
        env = {k: v for k, v in rep["env"].items() if k.startswith("CUDA_MPS_")}
        thread = str(MPS_CLAIMS[name]["defaultActiveThreadPercentage"])
        assert env == {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": thread,
                       "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": pinned}, (name, env)
        assert pipe in rep["mounts"] and "/dev/shm" in rep["mounts"], rep["mounts"]
        inside = json.loads(c.kubectl("exec", "-n", NAMESPACE, name, "--", "python3", "-c", mps_node.INSIDE,
                                      pipe, "from-host").stdout)
        # One daemon behind both pipes: it answers with the first claim's default, whoever asks.
        assert "control" in inside["pipe"] and inside["answer"] == {"ok": True, "out": "50"}, (name, inside)
        assert inside["shm"] == "written on the node", (name, inside)
        # As its image's non-root user (as many workloads run), it can still make its segment in /dev/shm.
        assert inside["uid"] != 0 and inside["shm_write_error"] is None, (name, inside)

    delete_pod(c, "mps-a")
    wait_for("claim mps-a unprepared", lambda: uids["mps-a"] not in prepared(c), 120)
    assert mps_holders(c) == {dev.uuid: [uids["mps-b"]]}
    assert mps_node.records(log_dir)[-1]["event"] != "quit", "the other claim still holds the daemon"
    assert get_pod(c, "mps-b")["status"]["phase"] == "Running"
    delete_pod(c, "mps-b")
    wait_for("claim mps-b unprepared", lambda: uids["mps-b"] not in prepared(c), 120)
    recs = mps_node.records(log_dir)
    assert recs[-1]["event"] == "quit" and len([r for r in recs if r["event"] == "start"]) == 1, recs[-3:]
    assert mps_holders(c) == {}
    assert not (root / f"dra-{dev.uuid}" / ".ready").exists()
    for name in MPS_CLAIMS:
        c.kubectl("delete", "resourceclaim", "-n", NAMESPACE, name, "--wait=false")


SHARES = {"long-a": "Long", "short": "Short", "long-b": "Long"}


def test_shares_of_one_gpu_by_consumable_capacity_hold_one_time_slice_setting(installed):
    c, image = installed["c"], installed["image"]
    # The gate is on by 1.37's defaults (nothing in the test cluster sets it), and the API server kept the field.
    assert feature_gates(c.kubectl("get", "--raw", "/metrics").stdout).get("DRAConsumableCapacity") == ("BETA", True)
    assert feature_gates(c.kubectl("get", "--raw", f"/api/v1/nodes/{NODE}/proxy/metrics").stdout).get(
        "DRAConsumableCapacity") == ("BETA", True)
    gpus = [d for s in c.get("resourceslices")["items"] if s["spec"]["driver"] == DRIVER
            for d in s["spec"].get("devices", []) if d["name"].startswith("gpu-")]
    assert len(gpus) == 8 and all(d.get("allowMultipleAllocations") is True for d in gpus), gpus[:1]
    for name, interval in SHARES.items():
        c.apply(gpu_claim(f"share-{name}", interval, gpu_index=7, memory="10Gi"))
    # The first holder decides the GPU's setting: start it alone.
    c.apply(claim_pod("long-a", image, "share-long-a"))
    wait_running(c, "long-a")
    for name in ("short", "long-b"):
        c.apply(claim_pod(name, image, f"share-{name}"))
    wait_running(c, "long-b")
    claims = {n: c.get("resourceclaim", f"share-{n}", "-n", NAMESPACE) for n in SHARES}
    results = {n: cl["status"]["allocation"]["devices"]["results"] for n, cl in claims.items()}
    assert {r["device"] for rs in results.values() for r in rs} == {"gpu-7"}
    shares = [r.get("shareID") for rs in results.values() for r in rs]
    assert all(shares) and len(set(shares)) == 3, shares
    assert all(r["consumedCapacity"] == {"memory": "10Gi"} for rs in results.values() for r in rs)

    def refused():
        msgs = [m for m in pod_events(c, "short") if "a GPU has one time-slice setting" in m]
        return msgs or None
    try:
        [msg, *_] = wait_for("the Short share refused with our reason", refused, 180)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{diagnose(c, NAMESPACE)}") from None
    assert "gpu-7 (GPU7) is time-sliced with interval Long for claim topo-system/share-long-" in msg, msg
    assert "this claim asks Short (fix: ask Long" in msg, msg
    assert get_pod(c, "short")["status"]["phase"] == "Pending"
    # The two Long shares: one checkpoint entry each, with their share IDs; both containers on GPU 7.
    table = prepared(c)
    for n in ("long-a", "long-b"):
        [d] = table[claims[n]["metadata"]["uid"]].devices
        [r] = results[n]
        assert (d.device, d.timeslice, d.share_id) == ("gpu-7", "Long", r["shareID"])
        rep = wait_for(f"pod {n}'s report", lambda n=n: report(c, n), 60)
        assert [p for p in rep["devices"] if re.fullmatch(r"/dev/nvidia\d+", p)] == ["/dev/nvidia7"]
        assert rep["env"]["TOPO_DEV_GPU_7_TIMESLICE"] == "Long"
    assert claims["short"]["metadata"]["uid"] not in table
    assert [(v["index"], v["timeslice"]) for v in gpu_settings(c).values()] == [(7, "Long")]
    for n in SHARES:
        delete_pod(c, n)
    wait_for("the shares unprepared", lambda: not set(prepared(c)) & {cl["metadata"]["uid"]
                                                                      for cl in claims.values()}, 120)
    assert gpu_settings(c) == {}


COUNTED = ("count-a", "count-b", "count-c")


def counted_claim(name: str, gpu_index: int) -> dict[str, Any]:
    """A claim for one GPU of a given index, naming no capacity and no config: with shares by count it takes 1."""
    sel = [{"cel": {"expression": f'device.attributes["{DRIVER}"].index == {gpu_index}'}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": f"gpu.{DRIVER}", "selectors": sel}}]}}}


def test_shares_by_count_let_two_claims_that_name_no_memory_share_a_gpu_and_a_third_wait(installed):
    """`draGpuShares: 2` (NVIDIA's --consumable-shares 2): each claim takes one share by default and no memory."""
    c, image, node = installed["c"], installed["image"], installed["node"]
    old = wait_daemon_ready(c)["metadata"]["uid"]
    values = chart_values(image, node, dra={"resources": ["nvidia.com/gpu"]},
                          extraEnv=[{"name": "KUBERNETES_SERVICE_HOST", "value": NODE_IP},
                                    {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}])
    values["config"]["flags"].update({"draSharedGpus": True, "draGpuShares": 2})
    helm_upgrade(c, values)
    wait_daemon_ready(c, not_uid=old)

    def counted_gpus():
        gpus = [d for s in c.get("resourceslices")["items"] if s["spec"]["driver"] == DRIVER
                for d in s["spec"].get("devices", []) if d["name"].startswith("gpu-")]
        return gpus if len(gpus) == 8 and all("shares" in d.get("capacity", {}) for d in gpus) else None
    gpus = wait_for("GPUs published with a share count", counted_gpus, 180)
    assert gpus[0]["capacity"]["shares"]["value"] == "2", gpus[0]["capacity"]
    for name in COUNTED:
        c.apply(counted_claim(name, 5))
    for name in COUNTED[:2]:
        c.apply(claim_pod(name, image, name))
    for name in COUNTED[:2]:
        wait_running(c, name)
    c.apply(claim_pod(COUNTED[2], image, COUNTED[2]))
    claims = {n: c.get("resourceclaim", n, "-n", NAMESPACE) for n in COUNTED[:2]}
    results = [r for cl in claims.values() for r in cl["status"]["allocation"]["devices"]["results"]]
    assert {r["device"] for r in results} == {"gpu-5"}
    assert len({r.get("shareID") for r in results}) == 2 and all(r.get("shareID") for r in results), results
    for r in results:
        used = r.get("consumedCapacity", {})
        assert used.get("shares") == "1" and used.get("memory", "0") == "0", used

    def unschedulable():
        conds = get_pod(c, COUNTED[2]).get("status", {}).get("conditions", [])
        return next((x for x in conds if x.get("type") == "PodScheduled" and x.get("reason") == "Unschedulable"),
                    None)
    try:
        cond = wait_for("the third claim's pod unschedulable", unschedulable, 180)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{diagnose(c, NAMESPACE)}") from None
    assert get_pod(c, COUNTED[2])["status"]["phase"] == "Pending", cond
    assert "allocation" not in c.get("resourceclaim", COUNTED[2], "-n", NAMESPACE).get("status", {})
    # Both running pods got GPU 5.
    for n in COUNTED[:2]:
        rep = wait_for(f"pod {n}'s report", lambda n=n: report(c, n), 60)
        assert [p for p in rep["devices"] if re.fullmatch(r"/dev/nvidia\d+", p)] == ["/dev/nvidia5"]
    for n in COUNTED:
        delete_pod(c, n)


IMEX_MAJOR = 234  # the simulated node's stand-in for /proc/devices (any free character major would do)
IMEX_CLASS = f"imex-channel.{DRIVER}"  # the chart's DeviceClass for channels


def test_a_claim_for_an_imex_channel_gets_the_channel_node_with_the_drivers_major(installed):
    """`draImexChannels: 2` (host-managed IMEX) on a simulated node stating `imexChannelsMajor` (what a real
    node's /proc/devices lists for nvidia-caps-imex-channels): the channels are published, and a pod's claim
    for one gets /dev/nvidia-caps-imex-channels/channel<n> with that major and minor n."""
    c, image, node = installed["c"], installed["image"], installed["node"]
    data = yaml.safe_load(node.node_file.read_text())
    data["imexChannelsMajor"] = IMEX_MAJOR
    node.node_file.write_text(yaml.safe_dump(data, sort_keys=False))
    old = wait_daemon_ready(c)["metadata"]["uid"]
    values = chart_values(image, node, dra={"resources": ["nvidia.com/gpu"]},
                          extraEnv=[{"name": "KUBERNETES_SERVICE_HOST", "value": NODE_IP},
                                    {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}])
    values["config"]["flags"]["draImexChannels"] = 2
    helm_upgrade(c, values)
    wait_daemon_ready(c, not_uid=old)

    def channels():
        names = sorted(d["name"] for s in c.get("resourceslices")["items"] if s["spec"]["driver"] == DRIVER
                       for d in s["spec"].get("devices", []) if d["name"].startswith("imex-channel-"))
        return names or None
    assert wait_for("IMEX channels published", channels, 180) == ["imex-channel-0", "imex-channel-1"]
    # The chart's class for channels (draImexChannels > 0), as a user's claim would name it.
    c.get("deviceclass", IMEX_CLASS)
    c.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "imex", "namespace": NAMESPACE},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": IMEX_CLASS}}]}}})
    c.apply(claim_pod("imex", image, "imex"))
    wait_running(c, "imex")
    [result] = c.get("resourceclaim", "imex", "-n", NAMESPACE)["status"]["allocation"]["devices"]["results"]
    channel = int(result["device"].rsplit("-", 1)[1])
    rep = wait_for("pod imex's report", lambda: report(c, "imex"), 60)
    got = {p: v for p, v in rep["devices"].items() if p.startswith("/dev/nvidia-caps-imex-channels/")}
    assert got == {f"/dev/nvidia-caps-imex-channels/channel{channel}": [IMEX_MAJOR, channel]}, rep["devices"]
    assert not [p for p in rep["devices"] if re.fullmatch(r"/dev/nvidia\d+", p)]  # a channel, no GPU
    delete_pod(c, "imex")


# ---- three nodes: IMEX channels across the nodes of one clique ------------------------------------
#
# Last in the module (before teardown): the tests from here on see three nodes. The control plane is the
# module's; two more nodes join it (`Cluster.add_node`: namespaces, containerd with CDI and a kubelet each)
# and one chart release serves all three, each node its own simulated node file at NODE_FILES.

CLIQUE_A = ("4f1c2a9e-7b3d-4e5a-9c8f-0d2b6a1e3f70", 1)
CLIQUE_B = ("9d2e4b61-3c5a-4f7e-8a1b-6e0c2d4f5a83", 2)
#: topo-node and topo-imex-a: one simulated NVLink clique (GPUs with one cluster UUID and clique ID, as NVML's
#: fabric info on two trays of one NVL72 rack); topo-imex-b: another rack's.
IMEX_NODES = {NODE: CLIQUE_A, "topo-imex-a": CLIQUE_A, "topo-imex-b": CLIQUE_B}
JOB_LABEL = {"topo-e2e": "imex-job"}


def clique_of(fabric: tuple[str, int]) -> str:
    """The `clique` attribute's value: `<cluster UUID>.<clique ID>`, as the GPUs publish it."""
    return f"{fabric[0]}.{fabric[1]}"


def fabric_node(w: pathlib.Path, fabric: tuple[str, int]) -> Node:
    """The DGX H100 with every GPU's fabric in `fabric` (state completed) and the channels' major stated."""
    w.mkdir(parents=True, exist_ok=True)
    node = Node.make(w, simulate="dgx-h100")
    data = yaml.safe_load(node.node_file.read_text())
    for gpu in data["gpus"]:
        gpu["fabric"] = {"clusterUuid": fabric[0], "cliqueId": fabric[1], "state": "completed"}
    data["imexChannelsMajor"] = IMEX_MAJOR
    node.node_file.write_text(yaml.safe_dump(data, sort_keys=False))
    return node


def node_files(fabric: tuple[str, int]) -> Callable[[pathlib.Path], None]:
    """What `Cluster.add_node` calls with a joining node's own directory: its simulated node, at `sim`."""
    def write(files: pathlib.Path) -> None:
        fabric_node(files / "sim", fabric)
    return write


def at_node_files(node: Node, files: pathlib.Path) -> Node:
    """The node's files as its daemon pod sees them: at NODE_FILES in that node's mount namespace."""
    return Node(pathlib.Path(NODE_FILES) / node.node_file.relative_to(files),
                pathlib.Path(NODE_FILES) / node.dev_root.relative_to(files))


def channel_cliques(c: Cluster) -> dict[str, str | None]:
    """Per node: the `clique` its published imex-channel-0 carries."""
    out: dict[str, str | None] = {}
    for sl in c.get("resourceslices")["items"]:
        if sl["spec"]["driver"] != DRIVER:
            continue
        for d in sl["spec"].get("devices", []):
            if d["name"] == "imex-channel-0":
                out[sl["spec"].get("nodeName")] = d.get("attributes", {}).get("clique", {}).get("string")
    return out


def ready_daemon_nodes(c: Cluster) -> list[str]:
    return sorted(p["spec"].get("nodeName", "") for p in daemon_pods(c) if ready(p))


def clique_channel_template(name: str, fabric: tuple[str, int]) -> dict[str, Any]:
    """IMEX channel 0 on a node of the clique `fabric`, and one GPU of the same clique.

    The clique is named by a CEL selector: a claim is allocated on one node, so `matchAttribute` cannot hold
    two pods' claims to one clique. Within the claim it can: the GPU and the channel match on `clique`."""
    attrs = f'device.attributes["{DRIVER}"]'
    expr = f'"clique" in {attrs} && {attrs}.clique == "{clique_of(fabric)}" && {attrs}.id == 0'
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {
                "requests": [
                    {"name": "channel",
                     "exactly": {"deviceClassName": IMEX_CLASS, "selectors": [{"cel": {"expression": expr}}]}},
                    {"name": "gpu", "exactly": {"deviceClassName": f"gpu.{DRIVER}"}}],
                "constraints": [{"requests": ["channel", "gpu"], "matchAttribute": f"{DRIVER}/clique"}]}}}}


def with_channel_claim(pod_spec: dict[str, Any], template: str) -> dict[str, Any]:
    pod_spec["resourceClaims"] = [{"name": "channel", "resourceClaimTemplateName": template}]
    pod_spec["containers"][0]["resources"] = {"claims": [{"name": "channel"}]}
    return pod_spec


def imex_pod_devices(c: Cluster, name: str) -> tuple[dict[str, list[int]], list[str]]:
    """The channel nodes (path -> [major, minor]) and the GPU nodes the pod's container sees."""
    rep = wait_for(f"pod {name}'s report", lambda: report(c, name), 60)
    return ({p: v for p, v in rep["devices"].items() if p.startswith("/dev/nvidia-caps-imex-channels/")},
            sorted(p for p in rep["devices"] if re.fullmatch(r"/dev/nvidia\d+", p)))


def daemon_timeline(c: Cluster, since: datetime.datetime) -> str:
    """Where the roll's time went, per daemon pod: created, its container started, Ready (seconds after
    `since`, at the API's one-second resolution). Printed, never asserted."""
    def at(stamp: str | None) -> str:
        if not stamp:
            return "-"
        t = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        return f"{(t - since).total_seconds():+.0f} s"
    rows = ["daemon pod    node          created  started  Ready"]
    for p in sorted(daemon_pods(c), key=lambda p: p["spec"].get("nodeName", "")):
        st = p.get("status", {})
        started = next((cs["state"]["running"].get("startedAt") for cs in st.get("containerStatuses", [])
                        if "running" in cs.get("state", {})), None)
        rdy = next((x.get("lastTransitionTime") for x in st.get("conditions", [])
                    if x.get("type") == "Ready" and x.get("status") == "True"), None)
        rows.append(f"{p['metadata']['name'][-12:]:<13} {p['spec'].get('nodeName', ''):<13} "
                    f"{at(p['metadata'].get('creationTimestamp')):>7}  {at(started):>7}  {at(rdy):>5}")
    return "\n".join(rows)


@pytest.fixture(scope="module")
def three_nodes(installed, cluster_inputs):
    """Two nodes more (one of clique A, one of clique B), the first node moved to clique A, one release."""
    c, node = installed["c"], installed["node"]
    start = time.monotonic()
    since = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    numa, distances = node.numa_nodes()
    # The release first, with every path at NODE_FILES: the first node's daemon rolls once, and each node that
    # joins gets its pod of the new template at once (a pod of the old one, deleted by the roll right after it
    # started, held its node for the 30 s grace period).
    first = fabric_node(c.files / "sim", IMEX_NODES[NODE])
    old = wait_daemon_ready(c)["metadata"]["uid"]
    values = chart_values(installed["image"], at_node_files(first, c.files), dra={"resources": ["nvidia.com/gpu"]},
                          extraEnv=[{"name": "KUBERNETES_SERVICE_HOST", "value": NODE_IP},
                                    {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}])
    values["config"]["flags"]["draImexChannels"] = 2
    helm_upgrade(c, values)
    wait_daemon_ready(c, not_uid=old)
    rolled = time.monotonic() - start
    for name, fabric in IMEX_NODES.items():
        if name != NODE:
            c.add_node(name, numa_layout(numa), distances, tm_policy="none", images=[cluster_inputs["image"].archive],
                       files=node_files(fabric))
    joined = time.monotonic() - start - rolled
    want = {n: clique_of(f) for n, f in IMEX_NODES.items()}
    try:
        wait_for("a Ready daemon on each node, each node's channels carrying its clique",
                 lambda: ready_daemon_nodes(c) == sorted(IMEX_NODES) and channel_cliques(c) == want, 300)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{diagnose(c, NAMESPACE)}") from None
    seconds = time.monotonic() - start
    print(f"\nthe release at NODE_FILES, the first node's daemon rolled: {rolled:.1f} s; two nodes joined (Ready) "
          f"{joined:.1f} s; every node's daemon Ready with its clique's channels {seconds - rolled - joined:.1f} s "
          "later")
    print(daemon_timeline(c, since))
    yield {"c": c, "image": installed["image"], "seconds": seconds}


def test_a_two_pod_job_gets_channel_0_on_the_two_nodes_of_its_clique(three_nodes, record_property):
    """A Job of two pods, each with a claim from one template asking channel 0 on a node of clique A (and a GPU
    of the channel's clique), kept on distinct nodes by pod anti-affinity: both run, one on each node of clique A
    (never on clique B's), and each container has /dev/nvidia-caps-imex-channels/channel0 with the node's major
    and minor 0, beside its GPU."""
    c, image = three_nodes["c"], three_nodes["image"]
    record_property("measured: the release moved to NODE_FILES, two nodes joined, every node's channels "
                    "published (the three-node tests' set-up)", f"{three_nodes['seconds']:.1f} s")
    c.apply(clique_channel_template("imex-clique-a", CLIQUE_A))
    spec = with_channel_claim(workload("unused", image, {})["spec"], "imex-clique-a")
    spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": JOB_LABEL}, "topologyKey": "kubernetes.io/hostname"}]}}
    c.apply({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "imex-job", "namespace": NAMESPACE},
             "spec": {"parallelism": 2, "completions": 2, "backoffLimit": 0,
                      "template": {"metadata": {"labels": JOB_LABEL}, "spec": spec}}})

    def both_running():
        pods = c.get("pods", "-n", NAMESPACE, "-l", "topo-e2e=imex-job")["items"]
        running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
        return running if len(running) == 2 else None
    try:
        pods = wait_for("both pods of the job Running", both_running, 300)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{diagnose(c, NAMESPACE)}") from None
    on = sorted(p["spec"]["nodeName"] for p in pods)
    assert on == sorted(n for n, f in IMEX_NODES.items() if f == CLIQUE_A), on
    for p in pods:
        name = p["metadata"]["name"]
        [ref] = p["status"]["resourceClaimStatuses"]
        claim = c.get("resourceclaim", ref["resourceClaimName"], "-n", NAMESPACE)
        results = {r["request"]: r for r in claim["status"]["allocation"]["devices"]["results"]}
        assert {(r["driver"], r["pool"]) for r in results.values()} == {(DRIVER, p["spec"]["nodeName"])}, results
        assert results["channel"]["device"] == "imex-channel-0", results
        channels, gpus = imex_pod_devices(c, name)
        assert channels == {"/dev/nvidia-caps-imex-channels/channel0": [IMEX_MAJOR, 0]}, name
        # The claim's GPU, of the same clique (matchAttribute): the one GPU node in the container.
        assert gpus == [f"/dev/nvidia{results['gpu']['device'].rsplit('-', 1)[1]}"], (name, gpus, results)


def test_a_pod_for_clique_a_pinned_to_clique_b_stays_pending(three_nodes):
    """The same template from a pod held to the clique-B node (nodeSelector): no channel there matches, so the
    scheduler leaves it Pending as Unschedulable, saying it cannot allocate the claim, and allocates nothing."""
    c, image = three_nodes["c"], three_nodes["image"]
    [other] = [n for n, f in IMEX_NODES.items() if f == CLIQUE_B]
    pod = workload("imex-elsewhere", image, {})
    pod["metadata"]["namespace"] = NAMESPACE
    with_channel_claim(pod["spec"], "imex-clique-a")
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": other}
    c.apply(pod)

    def unschedulable():
        st = get_pod(c, "imex-elsewhere").get("status", {})
        return next((x for x in st.get("conditions", []) if x.get("type") == "PodScheduled"
                     and x.get("reason") == "Unschedulable"), None)
    try:
        cond = wait_for("the pod pinned to clique B unschedulable", unschedulable, 180)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{diagnose(c, NAMESPACE)}") from None
    p = get_pod(c, "imex-elsewhere")
    assert p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName"), p["status"]
    assert "cannot allocate all claims" in cond.get("message", ""), cond
    for ref in p["status"].get("resourceClaimStatuses") or []:
        claim = c.get("resourceclaim", ref["resourceClaimName"], "-n", NAMESPACE)
        assert "allocation" not in claim.get("status", {}), claim["status"]
    delete_pod(c, "imex-elsewhere")
    c.kubectl("delete", "job", "-n", NAMESPACE, "imex-job", "--cascade=foreground", "--wait=false")
    wait_for("the job's pods gone", lambda: not c.get("pods", "-n", NAMESPACE, "-l", "topo-e2e=imex-job")["items"],
             240)


def test_teardown_stops_everything_and_leaves_nothing(installed):
    c = installed["c"]
    for name in ("shared-gpu", "bad-gpu", *MPS_CLAIMS, *(f"share-{n}" for n in SHARES), *COUNTED, "imex"):
        c.kubectl("delete", "resourceclaim", "-n", NAMESPACE, name, "--wait=false", check=False)
    down_and_check_nothing_left(c)
