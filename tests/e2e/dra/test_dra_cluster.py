"""The DRA driver on a real Kubernetes 1.37 cluster: helm install, the real scheduler, the real kubelet.

One cluster for this module (tests/e2e/cluster: control plane, kubelet and containerd in
private namespaces). The chart is installed with `dra.resources` = the GPUs and the NICs and
its example ResourceClaimTemplates; the plugin serves the simulated DGX H100 (8 GPUs, 8
NICs, one GPU and one NIC behind each PCIe switch, all GPUs on one NVSwitch fabric). The
tests run in file order, each one stage of the story: registration and slices, claims
allocated by kube-scheduler and prepared by us, PIX pairs, an unsatisfiable claim, driver
and kubelet restarts, unprepare on deletion, and unchanged `nvidia.com/gpu: 2` pods through the
extended-resource mapping (on a DRA node, refused for a device-plugin name, on a device-plugin node).

What a container sees: the kubelet hands our CDI IDs to the runtime (its own DRA checkpoint
holds them; the CRI request is built from it), and containerd v2 (built here, CDI on; see
conftest.py) injects what our per-claim CDI spec says: each container gets exactly its
claim's GPU device nodes (the real NVIDIA numbers, 195:N) and one env entry per device.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
import time
from typing import Any

import pytest
import yaml
from cluster import NODE, Cluster
from cluster_fixtures import down_and_check_nothing_left, numa_layout, start_cluster
from sandbox import NODE_IP, wait_for
from toolkit_node import PROBE, make_toolkit_spec
from workloads import NAMESPACE, REPORT_MARK, Node, StageTimes, chart_values, daemon_pods, diagnose, helm_upgrade, \
    wait_allocatable, wait_daemon_ready, workload

from plugin.dra.kubelet.checkpoint import ClaimCheckpoint
from plugin.dra.slices.build import SliceOptions, build_resource_slices, device_name
from plugin.sources.simulated import load_simulated

pytestmark = pytest.mark.timeout(1800)

DRIVER = "topo.dev"
STAGES = StageTimes()
stage = STAGES.stage


@pytest.fixture(scope="module")
def env(tmp_path_factory, cluster_inputs):
    node = Node.make(tmp_path_factory.mktemp("node"), simulate="dgx-h100")
    numa, distances = node.numa_nodes()
    t0 = time.monotonic()
    for c in start_cluster(tmp_path_factory, cluster_inputs, numa_layout(numa), distances, tm_policy="none"):
        STAGES["cluster up"] = time.monotonic() - t0
        yield {"c": c, "node": node, "image": cluster_inputs["image"].ref,
               "topology": load_simulated(str(node.node_file))}
    print("\nDRA e2e stage times:", file=sys.stderr)
    for name, dt in STAGES.items():
        print(f"  {name:<52} {dt:7.1f} s", file=sys.stderr)


def values(env) -> dict[str, Any]:
    return chart_values(
        env["image"], env["node"],
        dra={"resources": ["nvidia.com/gpu", "topo.dev/nic"], "exampleClaimTemplates": True},
        # No kube-proxy in this cluster: the pod reaches the API server at the node's address
        # (in the serving certificate's names) instead of the `kubernetes` Service's.
        extraEnv=[{"name": "KUBERNETES_SERVICE_HOST", "value": NODE_IP},
                  {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}])


@pytest.fixture(scope="module")
def installed(env):
    c = env["c"]
    with stage("helm install + driver Ready (registered)"):
        helm_upgrade(c, values(env))
        env["daemon"] = wait_daemon_ready(c)
    return env


# ---- helpers ---------------------------------------------------------------------------------------


def kubelet_path(c: Cluster, *parts: str) -> pathlib.Path:
    return c.w.joinpath("var-lib-kubelet", *parts)


def prepared(c: Cluster) -> dict[str, Any]:
    """Our checkpoint: claim UID -> PreparedClaim."""
    d = kubelet_path(c, "plugins", DRIVER)
    return ClaimCheckpoint(str(d / "checkpoint.json"), str(d / "serialize.lock"), DRIVER).load()


def claim_specs(c: Cluster) -> list[str]:
    """Our per-claim CDI spec files in the node's /var/run/cdi."""
    out = c.sb.sh("ls", "-1", "/var/run/cdi", check=False).stdout.split()
    return sorted(n for n in out if n.startswith(f"{DRIVER}-claim_"))


def cdi_spec(c: Cluster, uid: str) -> dict[str, Any]:
    return json.loads(c.sb.sh("cat", f"/var/run/cdi/{DRIVER}-claim_{uid}.json").stdout)


def our_slices(c: Cluster) -> list[dict[str, Any]]:
    return [s for s in c.get("resourceslices")["items"]
            if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE]


def claim_pod(name: str, image: str, templates: dict[str, str]) -> dict[str, Any]:
    pod = workload(name, image, {})
    pod["metadata"]["namespace"] = NAMESPACE
    pod["spec"]["resourceClaims"] = [{"name": n, "resourceClaimTemplateName": t} for n, t in templates.items()]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": n} for n in templates]}
    return pod


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


def claims_of(c: Cluster, pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Pod claim name -> the ResourceClaim object made from its template."""
    out = {}
    for s in pod["status"].get("resourceClaimStatuses") or []:
        out[s["name"]] = c.get("resourceclaim", s["resourceClaimName"], "-n", NAMESPACE)
    return out


def results(claim: dict[str, Any]) -> dict[str, str]:
    """Request name -> device name, as the scheduler allocated them."""
    res = claim["status"]["allocation"]["devices"]["results"]
    assert all(r["driver"] == DRIVER and r["pool"] == NODE for r in res), res
    return {r["request"]: r["device"] for r in res}


def devices(claim: dict[str, Any]) -> list[str]:
    """Every allocated device (a request of count N has N results)."""
    return sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])


def delete_pod(c: Cluster, name: str, timeout: float = 240) -> None:
    c.kubectl("delete", "pod", "-n", NAMESPACE, name, "--wait=false")
    wait_for(f"pod {name} gone", lambda: not c.get("pods", "-n", NAMESPACE, "--field-selector",
                                                   f"metadata.name={name}")["items"], timeout)


def run_claim_pod(env, name: str, templates: dict[str, str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    c = env["c"]
    c.apply(claim_pod(name, env["image"], templates))
    pod = wait_running(c, name)
    return pod, claims_of(c, pod)


def check_prepared(c: Cluster, claim: dict[str, Any]) -> None:
    """The claim is in our checkpoint with the allocated devices, its CDI spec defines them, and the
    kubelet recorded exactly our CDI IDs for the runtime."""
    uid = claim["metadata"]["uid"]
    entry = prepared(c)[uid]
    results(claim)  # all from our driver and pool
    alloc = devices(claim)
    assert sorted(d.device for d in entry.devices) == alloc
    ids = sorted(i for d in entry.devices for i in d.cdi_device_ids)
    assert ids == sorted(f"{DRIVER}/claim={uid}-{d}" for d in alloc)
    spec = cdi_spec(c, uid)
    assert spec["kind"] == f"{DRIVER}/claim"
    assert sorted(d["name"] for d in spec["devices"]) == sorted(f"{uid}-{d}" for d in alloc)
    kubelet_state = kubelet_path(c, "dra_manager_state").read_text()
    for i in ids:
        assert i in kubelet_state, f"the kubelet did not record CDI ID {i} for the runtime"


# ---- the story -------------------------------------------------------------------------------------


def test_driver_registers_with_the_kubelet_and_the_api_server_accepts_its_slices(installed):
    c = installed["c"]
    # Ready means the kubelet's plugin watcher called GetInfo and confirmed the registration
    # (NotifyRegistrationStatus); its socket is in the kubelet's plugins_registry.
    regs = [p.name for p in kubelet_path(c, "plugins_registry").iterdir() if p.is_socket()]
    assert regs == [f"{DRIVER}-{installed['daemon']['metadata']['uid']}-reg.sock"]
    # The runtime is containerd v2 with CDI (conftest.py), not Debian's 1.6.20.
    version = c.sb.sh(c.bins.containerd, "--version").stdout
    assert " 2." in version, version
    with stage("slices published"):
        slices = wait_for("our ResourceSlices", lambda: our_slices(c) or None, 120)
    node_uid = c.node()["metadata"]["uid"]
    want = build_resource_slices(installed["topology"], SliceOptions(node_name=NODE), node_uid=node_uid)
    # What the API server stored is what we built: nothing dropped or rewritten by validation.
    assert [s["spec"]["devices"] for s in slices] == [w["spec"]["devices"] for w in want]
    assert all(s["spec"]["pool"]["name"] == NODE for s in slices)
    assert all(s["metadata"]["ownerReferences"][0]["uid"] == node_uid for s in slices)
    installed["slice_devices"] = sorted(d["name"] for s in slices for d in s["spec"]["devices"])
    assert len(installed["slice_devices"]) == 16
    STAGES[f"(slices: {len(slices)}, devices: {len(installed['slice_devices'])})"] = 0.0
    # DRA devices are not extended resources: the node advertises none of ours.
    alloc = c.allocatable()
    assert "nvidia.com/gpu" not in alloc and "topo.dev/nic" not in alloc


def test_one_gpu_claim_is_allocated_by_the_scheduler_and_prepared_by_us(installed):
    c = installed["c"]
    with stage("one-gpu pod Running"):
        pod, claims = run_claim_pod(installed, "one", {"gpu": "one-gpu"})
    claim = claims["gpu"]
    assert list(results(claim)) == ["gpu"] and results(claim)["gpu"].startswith("gpu-")
    check_prepared(c, claim)
    dev = results(claim)["gpu"]
    spec = cdi_spec(c, claim["metadata"]["uid"])
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert nodes == [f"/dev/nvidia{dev.split('-')[1]}"]
    assert "/dev/nvidiactl" in [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    check_container_sees(c, "one", [claim])


def check_container_sees(c: Cluster, pod: str, claims: list[dict[str, Any]]) -> None:
    """Through CDI the container got its claims' device nodes (with their numbers) and env, and no other GPU."""
    rep = wait_for(f"pod {pod}'s report", lambda: report_ns(c, pod), 60)
    want_nodes: dict[str, list[int]] = {}
    want_env: list[str] = []
    for claim in claims:
        spec = cdi_spec(c, claim["metadata"]["uid"])
        for edits in [spec.get("containerEdits", {})] + [d["containerEdits"] for d in spec["devices"]]:
            want_nodes.update({n["path"]: [n["major"], n["minor"]] for n in edits.get("deviceNodes", [])})
            want_env += edits.get("env", [])
    assert want_env, "every device of a claim carries env"
    claim_gpus = [d for cl in claims for d in devices(cl) if d.startswith("gpu-")]
    assert len([p for p in want_nodes if re.fullmatch(r"/dev/nvidia\d+", p)]) == len(claim_gpus)
    for path, numbers in want_nodes.items():
        assert rep["devices"].get(path) == numbers, (path, rep["devices"])
    gpus = {p for p in rep["devices"] if re.fullmatch(r"/dev/nvidia\d+", p)}
    assert gpus == {p for p in want_nodes if re.fullmatch(r"/dev/nvidia\d+", p)}
    for e in want_env:
        k, v = e.split("=", 1)
        assert rep["env"].get(k) == v, (e, {k: v for k, v in rep["env"].items() if k.startswith("TOPO_DEV")})


def report_ns(c: Cluster, name: str) -> dict[str, Any] | None:
    out = c.kubectl("logs", "-n", NAMESPACE, name, check=False).stdout
    for line in out.splitlines():
        if line.startswith(REPORT_MARK):
            return json.loads(line[len(REPORT_MARK):])
    return None


PCIE_ROOT_PAIRS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
    "metadata": {"name": "two-gpu-nic-pairs-by-root", "namespace": NAMESPACE},
    "spec": {"spec": {"devices": {
        "requests": [{"name": n, "exactly": {"deviceClassName": f"{n[:3]}.{DRIVER}"}}
                     for n in ("gpu-a", "nic-a", "gpu-b", "nic-b")],
        "constraints": [{"requests": ["gpu-a", "nic-a"], "matchAttribute": "resource.kubernetes.io/pcieRoot"},
                        {"requests": ["gpu-b", "nic-b"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
    }}},
}


def check_pix_pairs(installed, claim: dict[str, Any]) -> None:
    got = results(claim)
    assert set(got) == {"gpu-a", "nic-a", "gpu-b", "nic-b"}
    assert len(set(got.values())) == 4
    topo = installed["topology"]
    name = {device_name(d): d.name for d in topo.devices}
    for g, n in (("gpu-a", "nic-a"), ("gpu-b", "nic-b")):
        assert topo.link(name[got[g]], name[got[n]]).label == "PIX", (got[g], got[n])


def test_gpu_nic_pairs_under_one_pcie_switch_get_pix_pairs(installed):
    c = installed["c"]
    with stage("2 GPU + 2 NIC (pcieSwitch) pod Running"):
        _, claims = run_claim_pod(installed, "pairs", {"pairs": "two-gpu-nic-pairs"})
    check_pix_pairs(installed, claims["pairs"])
    check_prepared(c, claims["pairs"])
    check_container_sees(c, "pairs", [claims["pairs"]])


def test_pairs_by_the_standard_pcie_root_attribute_get_pix_pairs_too(installed):
    c = installed["c"]
    c.apply(PCIE_ROOT_PAIRS)
    with stage("2 GPU + 2 NIC (pcieRoot) pod Running"):
        _, claims = run_claim_pod(installed, "pairs-root", {"pairs": "two-gpu-nic-pairs-by-root"})
    check_pix_pairs(installed, claims["pairs"])
    check_prepared(c, claims["pairs"])
    uid = claims["pairs"]["metadata"]["uid"]
    with stage("pod deleted -> claim unprepared"):
        delete_pod(c, "pairs-root")
        wait_for("the claim unprepared", lambda: uid not in prepared(c), 120)
    assert f"{DRIVER}-claim_{uid}.json" not in claim_specs(c)


def test_four_gpus_in_one_nvlink_domain(installed):
    c = installed["c"]
    with stage("4 GPU (nvlinkDomain) pod Running"):
        _, claims = run_claim_pod(installed, "four", {"gpus": "four-gpu-nvlink"})
    devs = devices(claims["gpus"])
    assert len(devs) == 4 and all(d.startswith("gpu-") for d in devs)
    used = set(devices(claims_of(c, get_pod(c, "one"))["gpu"])) | set(devices(claims_of(c, get_pod(c, "pairs"))["pairs"]))
    assert not set(devs) & used, "a device was allocated twice"
    check_prepared(c, claims["gpus"])
    check_container_sees(c, "four", [claims["gpus"]])
    uid = claims["gpus"]["metadata"]["uid"]
    delete_pod(c, "four")
    wait_for("the claim unprepared", lambda: uid not in prepared(c), 120)


UNSATISFIABLE = {
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
    "metadata": {"name": "two-gpus-one-switch", "namespace": NAMESPACE},
    # Two GPUs behind one PCIe switch: a DGX H100 has one GPU per switch.
    "spec": {"spec": {"devices": {
        "requests": [{"name": "gpus", "exactly": {"deviceClassName": f"gpu.{DRIVER}", "allocationMode": "ExactCount",
                                                  "count": 2}}],
        "constraints": [{"requests": ["gpus"], "matchAttribute": f"{DRIVER}/pcieSwitch"}],
    }}},
}


def test_unsatisfiable_claim_stays_pending_with_the_schedulers_reason(installed):
    c = installed["c"]
    c.apply(UNSATISFIABLE)
    c.apply(claim_pod("impossible", installed["image"], {"gpus": "two-gpus-one-switch"}))

    def unschedulable():
        conds = {x["type"]: x for x in get_pod(c, "impossible").get("status", {}).get("conditions", [])}
        s = conds.get("PodScheduled")
        return s if s and s["status"] == "False" and s.get("reason") == "Unschedulable" else None

    with stage("unsatisfiable claim: scheduler's verdict"):
        cond = wait_for("the scheduler to give up on the pod", unschedulable, 120)
    assert "cannot allocate all claims" in cond["message"], cond
    pod = get_pod(c, "impossible")
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    claim = claims_of(c, pod)["gpus"]
    assert not claim.get("status", {}).get("allocation")
    assert claim["metadata"]["uid"] not in prepared(c)
    delete_pod(c, "impossible")


def _state(c: Cluster) -> tuple[list[str], list[str], list[str]]:
    return sorted(prepared(c)), claim_specs(c), sorted(d["name"] for s in our_slices(c) for d in s["spec"]["devices"])


def test_driver_restart_neither_loses_nor_duplicates_prepared_claims(installed):
    c = installed["c"]
    before = _state(c)
    assert len(before[0]) == 2 and len(before[1]) == 2  # "one" and "pairs"
    old = installed["daemon"]["metadata"]["uid"]
    with stage("driver pod deleted -> new pod Ready"):
        c.kubectl("delete", "pod", "-n", NAMESPACE, installed["daemon"]["metadata"]["name"], "--wait=true")
        installed["daemon"] = wait_daemon_ready(c, not_uid=old)
    regs = [p.name for p in kubelet_path(c, "plugins_registry").iterdir() if p.is_socket()]
    assert regs == [f"{DRIVER}-{installed['daemon']['metadata']['uid']}-reg.sock"]  # the old one's is gone
    assert wait_for("slices current", lambda: _state(c) if _state(c)[2] == before[2] else None, 120) == before
    for name in ("one", "pairs"):
        assert get_pod(c, name)["status"]["phase"] == "Running"
    # The new instance prepares new claims (and answers the old ones from the checkpoint).
    _, claims = run_claim_pod(installed, "after-restart", {"gpu": "one-gpu"})
    check_prepared(c, claims["gpu"])
    assert len(prepared(c)) == 3 and len(claim_specs(c)) == 3
    delete_pod(c, "after-restart")
    wait_for("the claim unprepared", lambda: len(prepared(c)) == 2, 120)
    assert _state(c) == before


def test_kubelet_restart_keeps_claims_and_registers_the_driver_again(installed):
    c = installed["c"]
    before = _state(c)
    with stage("kubelet restart -> driver registered again, new claim prepared"):
        c.stop_kubelet()
        c.start_kubelet()
        # Only a registered driver can prepare: a new claim proves the re-registration.
        _, claims = run_claim_pod(installed, "after-kubelet", {"gpu": "one-gpu"})
    check_prepared(c, claims["gpu"])
    for name in ("one", "pairs"):
        assert get_pod(c, name)["status"]["phase"] == "Running"
    delete_pod(c, "after-kubelet")
    wait_for("the claim unprepared", lambda: len(prepared(c)) == 2, 120)
    assert wait_for("slices back", lambda: _state(c) if _state(c)[2] == before[2] else None, 120) == before


def tainted(c: Cluster) -> dict[str, list[str]]:
    return {d["name"]: [t["key"] for t in d.get("taints", [])] for s in our_slices(c) for d in s["spec"]["devices"]
            if d.get("taints")}


def set_gpu_health(node: Node, unhealthy: set[int]) -> None:
    """Edit the simulated node the plugin serves (it watches the file): these GPU indexes turn Unhealthy."""
    import yaml
    data = yaml.safe_load(node.node_file.read_text())
    for i, gpu in enumerate(data["gpus"]):
        if i in unhealthy:
            gpu["health"] = "Unhealthy"
        else:
            gpu.pop("health", None)
    tmp = node.node_file.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    tmp.replace(node.node_file)


def test_unhealthy_gpus_are_tainted_in_the_slice_and_the_scheduler_avoids_them(installed):
    c = installed["c"]
    one = devices(claims_of(c, get_pod(c, "one"))["gpu"])[0]
    used = {d for name in ("one", "pairs") for cl in claims_of(c, get_pod(c, name)).values() for d in devices(cl)}
    free = sorted(f"gpu-{i}" for i in range(8) if f"gpu-{i}" not in used)
    keep = free[-1]
    sick = {one, *free[:-1]}  # a GPU in use, and every free one but `keep`
    with stage("GPUs Unhealthy -> slice tainted"):
        set_gpu_health(installed["node"], {int(d.split("-")[1]) for d in sick})
        got = wait_for("the taints in the slice", lambda: tainted(c) if set(tainted(c)) == sick else None, 120)
    assert all(keys == [f"{DRIVER}/unhealthy"] for keys in got.values()), got
    _, claims = run_claim_pod(installed, "while-sick", {"gpu": "one-gpu"})
    assert devices(claims["gpu"]) == [keep]  # the only healthy free GPU
    assert get_pod(c, "one")["status"]["phase"] == "Running"  # NoSchedule: the pod using it keeps it
    with stage("GPUs healthy again -> taints gone"):
        set_gpu_health(installed["node"], set())
        wait_for("the taints gone", lambda: not tainted(c), 120)
    uid = claims["gpu"]["metadata"]["uid"]
    delete_pod(c, "while-sick")
    wait_for("the claim unprepared", lambda: uid not in prepared(c), 120)


def test_a_removed_nic_leaves_the_slice_and_comes_back(installed):
    """Hot-plug: the simulated node file loses a NIC no claim holds; the slice follows, both ways."""
    import yaml
    c = installed["c"]
    node = installed["node"]
    used = {d for name in ("one", "pairs") for cl in claims_of(c, get_pod(c, name)).values() for d in devices(cl)}
    original = node.node_file.read_text()
    data = yaml.safe_load(original)
    names = {device_name(d): d.name for d in installed["topology"].devices}
    gone = next(n for n in sorted(names, reverse=True) if n.startswith("nic-") and n not in used)
    data["nics"] = [x for x in data["nics"] if x["name"] != names[gone]]
    data["links"] = [x for x in data.get("links", []) if names[gone] not in x.get("devices", [])]
    before = installed["slice_devices"]
    with stage("NIC removed -> slice updated"):
        tmp = node.node_file.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
        tmp.replace(node.node_file)
        wait_for(f"{gone} gone from the slice", lambda: gone not in _state(c)[2], 120)
    assert _state(c)[2] == [d for d in before if d != gone]
    with stage("NIC back -> slice updated"):
        tmp.write_text(original)
        tmp.replace(node.node_file)
        wait_for(f"{gone} back in the slice", lambda: _state(c)[2] == before, 120)


def test_deleting_the_pods_unprepares_every_claim_and_leaks_nothing(installed):
    c = installed["c"]
    with stage("all claim pods deleted -> everything unprepared"):
        for name in ("one", "pairs"):
            delete_pod(c, name)
        wait_for("every claim unprepared", lambda: not prepared(c), 120)
        wait_for("generated claims deleted",
                 lambda: not c.get("resourceclaims", "-n", NAMESPACE)["items"], 120)
    assert claim_specs(c) == []
    assert len(daemon_pods(c)) == 1


# ---- NVIDIA's toolkit's devices beside ours (dra.toolkitCdi, docs/nvidia-toolkit.md) -------------------


def test_with_toolkit_names_prepare_waits_for_the_toolkits_spec_then_the_pod_gets_the_drivers_files(installed):
    """Without NVIDIA's spec on the node prepare fails with the reason (on the pod's events); once `nvidia-ctk cdi
    generate` wrote it, the kubelet's retry prepares the claim and the container of 2 of the 8 GPUs sees exactly
    their device nodes, the driver's files at the paths the spec names, and NVML (the probe, dlopening
    `libnvidia-ml.so.1` from those mounts) lists exactly its two GPUs."""
    c = installed["c"]
    spec = make_toolkit_spec(c.w / "toolkit", installed["node"].node_file)
    v = values(installed)
    v["dra"]["toolkitCdi"] = "uuid"
    v["config"]["flags"]["toolkitCdiDirs"] = ["/var/run/cdi"]  # where the toolkit's spec goes here
    with stage("helm upgrade dra.toolkitCdi=uuid + driver Ready"):
        helm_upgrade(c, v)
        wait_daemon_ready(c)
    pod = claim_pod("libs", installed["image"], {"pair": "two-gpu-nic-pairs"})
    pod["spec"]["containers"][0]["command"] = ["python3", "-c", PROBE, json.dumps(spec.mounted)]
    c.apply(pod)

    def refused() -> list[str]:
        """Our driver's refusals only: before the node authorizer's graph links the pod's new claim to the
        node, the kubelet's own fetch of the claim can fail first ("no relationship found between node ...")
        under the same event reason, and the kubelet retries; that transient refusal is not ours."""
        items = c.get("events", "-n", NAMESPACE, "--field-selector", "involvedObject.name=libs")["items"]
        return [e["message"] for e in items
                if e["reason"] == "FailedPrepareDynamicResources" and "CDI spec" in e["message"]]

    with stage("no toolkit spec: prepare refused"):
        (message, *_) = wait_for("prepare refused for want of the toolkit's spec", refused, 240)
    assert "no CDI spec of kind nvidia.com/gpu" in message and "nvidia-ctk cdi generate" in message, message
    assert get_pod(c, "libs")["status"]["phase"] == "Pending"

    c.sb.sh("cp", str(spec.path), "/var/run/cdi/nvidia.yaml")
    with stage("toolkit spec written: the kubelet's retry prepares, pod Running"):
        pod = wait_running(c, "libs", timeout=420)
    claim = claims_of(c, pod)["pair"]
    entry = prepared(c)[claim["metadata"]["uid"]]
    uuids = {}
    for d in entry.devices:
        if d.device.startswith("gpu-"):
            uuids[d.device] = spec.uuids[int(d.device.split("-")[1])]
            assert list(d.cdi_device_ids)[1:] == [f"nvidia.com/gpu={uuids[d.device]}"], d
        else:
            assert len(d.cdi_device_ids) == 1, d  # a NIC: ours alone
    assert len(uuids) == 2
    rep = wait_for("pod libs's report", lambda: report_ns(c, "libs"), 120)
    assert rep["devices"] == sorted(f"nvidia{g.split('-')[1]}" for g in uuids), rep
    assert rep["files"] and all(rep["files"].values()), rep["files"]
    assert rep["nvml_link"] == f"libnvidia-ml.so.{spec.root.version}"
    assert rep["smi_rc"] == 0, rep["smi_err"]
    assert sorted(re.sub(r".*\(UUID: (.*)\)$", r"\1", ln) for ln in rep["smi"]) == sorted(uuids.values())

    delete_pod(c, "libs")
    wait_for("the claim unprepared", lambda: not prepared(c), 120)
    c.sb.sh("rm", "-f", "/var/run/cdi/nvidia.yaml")
    with stage("helm upgrade back to dra.toolkitCdi=off"):
        helm_upgrade(c, values(installed))
        wait_daemon_ready(c)


# ---- unchanged pods through the extended-resource mapping (KEP-5004, GA in 1.37) --------------------
# No feature gate is set anywhere in this cluster: DRAExtendedResource is GA and locked on in
# 1.37 (API server: the DeviceClass field is kept; scheduler: the claim is made; kubelet: it
# prepares that claim through us like any other).


def unchanged_pod(name: str, image: str, gpus: int) -> dict[str, Any]:
    """A pod as written for NVIDIA's device plugin: `nvidia.com/gpu: N` in its limits, no claims."""
    pod = workload(name, image, {"nvidia.com/gpu": gpus})
    pod["metadata"]["namespace"] = NAMESPACE
    return pod


def node_gpus(rep: dict[str, Any]) -> set[str]:
    return {p for p in rep["devices"] if re.fullmatch(r"/dev/nvidia\d+", p)}


def test_extended_resource_pod_runs_on_a_dra_node_and_sees_exactly_its_two_gpus(installed):
    c = installed["c"]
    with stage("helm upgrade: gpu.topo.dev maps nvidia.com/gpu"):
        helm_upgrade(c, {**values(installed), "dra": {**values(installed)["dra"],
                                                       "extendedResources": ["nvidia.com/gpu"]}})
        installed["daemon"] = wait_daemon_ready(c)
    # The API server kept the field (it drops fields of disabled gates).
    assert c.get("deviceclass", f"gpu.{DRIVER}")["spec"].get("extendedResourceName") == "nvidia.com/gpu"
    assert "nvidia.com/gpu" not in c.allocatable()  # so the scheduler serves the name from our slices
    wait_for("our ResourceSlices", lambda: our_slices(c) or None, 120)
    with stage("unchanged nvidia.com/gpu: 2 pod Running (DRA)"):
        c.apply(unchanged_pod("unchanged", installed["image"], 2))
        pod = wait_running(c, "unchanged")
    # The scheduler made one claim for the pod and recorded which container request it serves.
    ext = pod["status"].get("extendedResourceClaimStatus")
    assert ext, pod["status"]
    assert [(m["containerName"], m["resourceName"]) for m in ext["requestMappings"]] == [("main", "nvidia.com/gpu")]
    claim = c.get("resourceclaim", ext["resourceClaimName"], "-n", NAMESPACE)
    gpus = devices(claim)
    assert len(gpus) == 2 and all(d.startswith("gpu-") for d in gpus), gpus
    # The kubelet called NodePrepareResources with that claim: our checkpoint, CDI spec and its record.
    check_prepared(c, claim)
    check_container_sees(c, "unchanged", [claim])
    rep = report_ns(c, "unchanged")
    assert node_gpus(rep) == {f"/dev/nvidia{d.split('-')[1]}" for d in gpus}, rep["devices"]
    uid = claim["metadata"]["uid"]
    with stage("unchanged pod deleted -> its claim unprepared and deleted"):
        delete_pod(c, "unchanged")
        wait_for("the claim unprepared", lambda: uid not in prepared(c), 120)
        wait_for("the scheduler's claim deleted",
                 lambda: not c.get("resourceclaims", "-n", NAMESPACE)["items"], 120)
    assert claim_specs(c) == []


#: Issue 35's node: GPU0 alone on NUMA node 1, GPU1-4 on NUMA node 0 (tests/support/nodes).
WORKSTATION = pathlib.Path(__file__).resolve().parents[2] / "support" / "nodes" / "workstation-gpu0-numa1.yaml"


def allocator_answer(topology, size: int) -> list[str]:
    """What our allocator (the device plugin's numa-first policy) picks from `topology`'s free GPUs, as slice names."""
    from allocator.policies import get_policy
    from allocator.request import AllocationRequest
    from allocator.topology import DeviceGraph

    graph = DeviceGraph.from_topology(topology, topology.gpus)
    ids = get_policy("numa-first").allocate(graph, AllocationRequest.of(graph.ids, [], size)).ids
    return sorted(device_name(topology.device(i)) for i in ids)


def slice_gpus(c: Cluster) -> list[str]:
    """Our GPUs' names in slice order (the order the scheduler's first-fit goes through)."""
    return [d["name"] for s in our_slices(c) for d in s["spec"]["devices"] if d["name"].startswith("gpu-")]


def test_unchanged_pods_on_a_node_whose_gpu_numbers_do_not_follow_its_sockets_stay_on_one_numa_node(installed):
    """The scheduler fills `nvidia.com/gpu: g` first-fit in our slice order. Listed by index, this node gave a
    2-GPU pod GPU0+GPU1 (two NUMA nodes) and a 4-GPU pod GPU0-3; the locality order gives what the device
    plugin gives: GPU1+GPU2 and GPU1-4, one NUMA node each."""
    c = installed["c"]
    data = yaml.safe_load(WORKSTATION.read_text())
    for i, gpu in enumerate(data["gpus"]):
        gpu["minor"] = i  # the node's /dev/nvidia<i> (Node.make made 0-7)
    node_file = installed["node"].node_file.parent / "workstation.yaml"
    node_file.write_text(yaml.safe_dump(data, sort_keys=False))
    topology = load_simulated(str(node_file))
    mapped = {**values(installed), "simulate": str(node_file),
              "dra": {**values(installed)["dra"], "extendedResources": ["nvidia.com/gpu"]}}
    old = installed["daemon"]["metadata"]["uid"]
    with stage("helm upgrade: the workstation node (GPU0 alone on NUMA 1)"):
        helm_upgrade(c, mapped)
        installed["daemon"] = wait_daemon_ready(c, not_uid=old)
        listed = wait_for("our slices list the workstation's 5 GPUs", lambda: len(slice_gpus(c)) == 5 and slice_gpus(c),
                          180)
    assert listed[:2] == ["gpu-1", "gpu-2"], listed
    try:
        for size in (2, 4):
            name = f"unchanged-ws-{size}"
            with stage(f"unchanged nvidia.com/gpu: {size} pod Running on the workstation node"):
                c.apply(unchanged_pod(name, installed["image"], size))
                pod = wait_running(c, name)
            claim = c.get("resourceclaim", pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"],
                          "-n", NAMESPACE)
            got = devices(claim)
            assert got == allocator_answer(topology, size), (size, got)
            assert got == [f"gpu-{i}" for i in range(1, size + 1)], (size, got)
            assert {topology.device(f"GPU{d.split('-')[1]}").numa for d in got} == {0}
            delete_pod(c, name)
            wait_for("the scheduler's claim deleted", lambda: not c.get("resourceclaims", "-n", NAMESPACE)["items"], 120)
    finally:
        old = installed["daemon"]["metadata"]["uid"]
        with stage("helm upgrade: back to the DGX H100 node"):
            helm_upgrade(c, {**values(installed), "dra": mapped["dra"]})
            installed["daemon"] = wait_daemon_ready(c, not_uid=old)
            wait_for("our slices list the DGX H100's 8 GPUs", lambda: len(slice_gpus(c)) == 8, 180)


def test_extended_resource_mapping_of_a_device_plugin_name_is_refused_at_install(installed):
    c = installed["c"]
    before = c.helm("history", "tdp", "-n", NAMESPACE, "-o", "json").stdout
    bad = {**values(installed), "dra": {"resources": ["topo.dev/nic"], "extendedResources": ["nvidia.com/gpu"]}}
    proc = helm_upgrade(c, bad, check=False)
    assert proc.returncode != 0
    assert ("dra.extendedResources: 'nvidia.com/gpu' is not served through DRA here "
            "(dra.resources: [topo.dev/nic])") in proc.stderr, proc.stderr
    assert c.helm("history", "tdp", "-n", NAMESPACE, "-o", "json").stdout == before  # nothing installed
    assert c.get("deviceclass", f"gpu.{DRIVER}")["spec"].get("extendedResourceName") == "nvidia.com/gpu"


MAPPED_ELSEWHERE = {
    # What a DRA-mode node pool's release would leave in the cluster while this node serves GPUs
    # with the device plugin.
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
    "metadata": {"name": "gpu-mapped.example.com"},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}" && '
                                             f'device.attributes["{DRIVER}"].type == "gpu"'}}],
             "extendedResourceName": "nvidia.com/gpu"},
}


def test_extended_resource_pod_on_a_device_plugin_node_is_served_by_the_device_plugin(installed):
    c = installed["c"]
    old = installed["daemon"]["metadata"]["uid"]
    with stage("helm upgrade: GPUs back to the device plugin (NICs stay DRA)"):
        helm_upgrade(c, {**values(installed), "dra": {"resources": ["topo.dev/nic"]}})
        installed["daemon"] = wait_daemon_ready(c, not_uid=old)
        wait_allocatable(c, {"nvidia.com/gpu": "8"})
    c.apply(MAPPED_ELSEWHERE)
    with stage("unchanged nvidia.com/gpu: 2 pod Running (device plugin)"):
        c.apply(unchanged_pod("unchanged-dp", installed["image"], 2))
        pod = wait_running(c, "unchanged-dp")
    # The node advertises the name, so the scheduler left it to the device plugin: no claim.
    assert not pod["status"].get("extendedResourceClaimStatus"), pod["status"]
    assert not c.get("resourceclaims", "-n", NAMESPACE)["items"]
    rep = wait_for("the pod's report", lambda: report_ns(c, "unchanged-dp"), 60)
    assert len(node_gpus(rep)) == 2, rep["devices"]
    assert not prepared(c)
    delete_pod(c, "unchanged-dp")
    c.kubectl("delete", "deviceclass", MAPPED_ELSEWHERE["metadata"]["name"])


def test_helm_uninstall_removes_the_drivers_sockets(installed):
    c = installed["c"]
    with stage("helm uninstall"):
        c.helm("uninstall", "tdp", "-n", NAMESPACE, "--wait")
        wait_for("the driver's sockets gone", lambda: not [
            p for p in kubelet_path(c, "plugins_registry").iterdir() if p.is_socket()], 120)
    assert not [p for p in kubelet_path(c, "plugins", DRIVER).iterdir() if p.is_socket()]


def test_teardown_stops_everything_and_leaves_nothing(installed):
    down_and_check_nothing_left(installed["c"])
