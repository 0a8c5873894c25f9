"""Our daemon against the real kubelet device manager + Topology Manager (Go harness).

Each test writes a script (start the kubelet's managers, start our daemon, admit
pods, restart things), the harness runs it in a private mount namespace with a
temporary directory over /var/lib/kubelet, and the assertions read what the
kubelet's own code recorded. Every scenario runs on the current Kubernetes line
(`harness`); the restart and re-registration ones on the #121994 race line (1.34) too
(`line_harness`). No assertion is about time: steps wait for states with generous
deadlines.
"""

from __future__ import annotations

import pytest
from plugin.model.cdi import kind_for_resource
from topo_testkit import SHARED_DIR
from kubelet_testlib import (
    ADMISSION_PODS,
    GPU,
    NIC,
    TAP_DIR,
    admission_run,
    call_partners,
    check_admitted_pod,
    check_affinity,
    check_no_double_assignment,
    check_preferred_calls,
    container_devices,
    daemon_argv,
    discover,
    machine_for,
    node_yaml,
    numa_map,
    pod,
    preferred_offline,
    reregistration_steps,
    start_kubelet,
    start_plugin,
    wait_all,
    wait_resource,
)

# The first test of a fresh machine builds the harness/kubelet (minutes on 2 cores;
# scripts/kubelet_tests.sh prepare does it up front). Each run below has its own timeout.
pytestmark = pytest.mark.timeout(1500)

SHARED_TOPOS = SHARED_DIR / "topologies"
L40S = str(SHARED_TOPOS / "21-pcie-8x-l40s-dual-socket-node-sys-1nic.txt")


# ---------------------------------------------------------------- registration

@pytest.mark.parametrize("simulate", ["dgx-a100", "pcie-2socket-4gpu-2nic", "dgx-h100", "dgx-1-v100", L40S],
                         ids=["dgx-a100", "pcie-2socket-4gpu-2nic", "dgx-h100", "dgx-1-v100", "l40s-topo-file"])
def test_registration_capacity_and_numa(harness, tmp_path, simulate):
    disc = discover(simulate)
    gpus = next(len(r["devices"]) for r in disc["resources"] if r["name"] == GPU)
    steps = [start_kubelet("none"), start_plugin(daemon_argv(simulate)), *wait_all(disc, timeout=60),
             # The kubelet updates its device maps, then writes the checkpoint.
             {"op": "wait_checkpoint", "resource": GPU, "registered": gpus}, {"op": "snapshot"}]
    run = harness.run(steps, machine_for(simulate), tmp_path)
    snap = run.ops("snapshot")[0]
    for r in disc["resources"]:
        name = r["name"]
        healthy = [d for d in r["devices"] if d["health"] == "Healthy"]
        assert snap["capacity"][name] == len(r["devices"])
        assert snap["allocatable"][name] == len(healthy)
        # The kubelet's record of every device: the ID we serve and the NUMA node we report.
        kubelet_view = {i: d["numa"] for i, d in snap["allocatable_devices"][name].items()}
        ours = {d["id"]: (None if d.get("numa") is None else [d["numa"]]) for d in healthy}
        assert kubelet_view == ours
        assert r["socket"] in snap["device_plugin_dir"]
        # One registration per resource: no periodic or duplicate Register, and none that
        # failed first (a daemon that registers before it serves is retried: see
        # test_broken_plugin.py).
        assert snap["registrations"][name] == 1
    assert snap["inactive"] == []
    # The checkpoint records the healthy IDs per resource.
    assert snap["checkpoint"]["registered_devices"][GPU] == sorted(
        d["id"] for r in disc["resources"] if r["name"] == GPU for d in r["devices"])


# ---------------------------------------------------------------- admission under every policy

POLICIES = [("none", "container"), ("best-effort", "container"), ("best-effort", "pod"),
            ("restricted", "container"), ("restricted", "pod"),
            ("single-numa-node", "container"), ("single-numa-node", "pod")]

@pytest.mark.parametrize("policy,scope", POLICIES, ids=[f"{p}-{s}" for p, s in POLICIES])
def test_admission_uses_our_preferred_allocation(harness, tmp_path, policy, scope):
    simulate = "dgx-a100"
    run, disc = admission_run(harness, tmp_path, simulate, policy, scope, ADMISSION_PODS)
    admits = run.admits()
    numa = numa_map(disc)
    problems: list[str] = []
    for step in admits.values():
        problems += check_preferred_calls(step)
        problems += check_affinity(step, numa, policy)
        if step["admit"]:
            problems += check_admitted_pod(step)
    problems += check_no_double_assignment(list(admits.values()), deleted=["p1"])
    assert not problems, "\n".join(problems)

    # Pods the node can always fit were admitted; the oversized one was refused.
    assert admits["p1"]["admit"] and admits["p6"]["admit"]
    assert not admits["p5"]["admit"]
    if policy == "none":
        assert admits["p5"]["reason"] == "UnexpectedAdmissionError"
        assert "requested number of devices unavailable" in admits["p5"]["message"]
    # p1 on an empty node: the kubelet asked us and used our answer (one NUMA node).
    p1 = admits["p1"]["containers"][0]
    assert {numa[GPU][d][0] for d in container_devices(p1, GPU)} in ({0}, {1})

    # The kubelet asked us whenever it had a choice, and our daemon's answers are the
    # offline allocator's answers for the same request (with the GPU–NIC partners the call had).
    calls = [r for r in run.rpcs if r["method"] == "GetPreferredAllocation"]
    assert calls, "the kubelet never called GetPreferredAllocation"
    for r, partners in zip(calls, call_partners(run.rpcs), strict=True):
        req = r["request"][0]
        offline = preferred_offline(simulate, r["resource"], req["size"], req["available"], req["must_include"],
                                    partners)
        assert sorted(r["response"][0]) == sorted(offline), r

    # Allocate got exactly the devices the kubelet recorded, once per (container, resource).
    for step in admits.values():
        allocs = [r for r in step["rpcs"] if r["method"] == "Allocate"]
        for r in allocs:
            c = next(c for c in step["containers"] if c["name"] == r["container"])
            assert set(r["request"][0]) == container_devices(c, r["resource"])


def test_single_numa_node_rejects_what_cannot_align(harness, tmp_path):
    """5 GPUs cannot fit one NUMA node of a DGX A100 (4 + 4): restricted admits across both
    nodes (the narrowest possible mask is preferred), single-numa-node refuses."""
    for policy, admitted in (("single-numa-node", False), ("restricted", True), ("best-effort", True)):
        run, _ = admission_run(harness, tmp_path / policy, "dgx-a100", policy, "container",
                                   [pod("big", {GPU: 5})])
        step = run.admits()["big"]
        assert step["admit"] is admitted, (policy, step)
        if not admitted:
            assert step["reason"] == "TopologyAffinityError"
        else:
            assert not check_preferred_calls(step)


def test_init_container_devices_are_reused(harness, tmp_path):
    # "grow" first: its app container needs the init's 2 GPUs plus one more on the same node.
    pods = [pod("grow", {GPU: 3}, init=[{GPU: 2}]),
            pod("reuse", {GPU: 2}, init=[{GPU: 2}])]
    run, _ = admission_run(harness, tmp_path, "dgx-a100", "single-numa-node", "container", pods)
    problems = []
    for step in run.admits().values():
        assert step["admit"], step
        problems += check_preferred_calls(step) + check_admitted_pod(step)
    assert not problems, "\n".join(problems)
    reuse = run.admits()["reuse"]
    init, app = reuse["containers"]
    assert container_devices(app, GPU) == container_devices(init, GPU)
    # The kubelet calls Allocate again for the same IDs (our Allocate must accept repeats)
    # and does not ask for a preferred allocation when reuse covers the request.
    allocs = [r for r in reuse["rpcs"] if r["method"] == "Allocate"]
    assert [set(a["request"][0]) for a in allocs] == [container_devices(init, GPU)] * 2
    assert not [r for r in reuse["rpcs"] if r["method"] == "GetPreferredAllocation" and r["container"] == "c0"]
    grow = run.admits()["grow"]
    init, app = grow["containers"]
    assert container_devices(init, GPU) < container_devices(app, GPU)
    prefs = [r for r in grow["rpcs"] if r["method"] == "GetPreferredAllocation" and r["container"] == "c0"]
    for p in prefs:
        assert set(p["request"][0]["must_include"]) == container_devices(init, GPU)


# ---------------------------------------------------------------- life cycle (no tap: kubelet.sock directly)

def test_device_turning_unhealthy(harness, tmp_path):
    node = tmp_path / "node.yaml"
    node.write_text(node_yaml())
    steps = [
        start_kubelet("single-numa-node"), start_plugin(daemon_argv(str(node))),
        wait_resource(GPU, capacity=8, allocatable=8, timeout=60),
        {"op": "write_file", "path": str(node), "content": node_yaml(unhealthy=("GPU3",))},
        # Every open stream gets the new list (how fast is measured in benchmarks/, not here).
        wait_resource(GPU, capacity=8, allocatable=7, timeout=30),
        {"op": "snapshot"},
        # NUMA 0 has only 3 healthy GPUs left, so 4 must come from NUMA 1.
        pod("four", {GPU: 4}),
        {"op": "write_file", "path": str(node), "content": node_yaml()},
        wait_resource(GPU, capacity=8, allocatable=8, timeout=30),
    ]
    run = harness.run(steps, machine_for("dgx-a100"), tmp_path)
    snap = run.ops("snapshot")[0]
    assert "3" not in snap["allocatable_devices"][GPU]
    four = run.admits()["four"]
    assert four["admit"], four
    assert container_devices(four["containers"][0], GPU) == {"4", "5", "6", "7"}
    assert not check_admitted_pod(four)


# ---- restarts and re-registration: on both Kubernetes lines (line_harness) ----

@pytest.mark.parametrize("stale_socket", [True, False], ids=["crashed-kubelet", "clean-stop"])
def test_kubelet_restart(line_harness, tmp_path, stale_socket):
    simulate = "dgx-a100"
    steps = [
        start_kubelet("single-numa-node"), start_plugin(daemon_argv(simulate)),
        wait_resource(GPU, capacity=8, allocatable=8, timeout=60),
        pod("before", {GPU: 2}),
        {"op": "restart_kubelet", "stale_socket": stale_socket},
        # A new device manager over the same directory: our daemon must notice the new
        # kubelet.sock (and its own socket being deleted) and register again.
        {"op": "wait_registrations", "resource": GPU, "at_least": 2, "timeout": 60},
        wait_resource(GPU, capacity=8, allocatable=8, timeout=60, hold_s=2),
        {"op": "snapshot"},
        {"op": "run_options", "pod": "before", "container": "c0"},
        pod("after", {GPU: 2}),
    ]
    run = line_harness.run(steps, machine_for(simulate), tmp_path)
    snap = run.ops("snapshot")[0]
    assert snap["registrations"][GPU] == 2
    before = container_devices(run.admits()["before"]["containers"][0], GPU)
    # The checkpoint kept the allocation; the restarted kubelet still knows it.
    entries = [e for e in snap["checkpoint"]["entries"] if e["pod_uid"] == "uid-before" and e["resource"] == GPU]
    assert entries and {d for ids in entries[0]["device_ids"].values() for d in ids} == before
    ro = run.ops("run_options")[0]
    assert set(ro["devices"][GPU]) == before
    assert set(ro["run_options"]["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")) == before
    after = run.admits()["after"]
    assert after["admit"], after
    assert not container_devices(after["containers"][0], GPU) & before


def test_kubelet_restart_keeps_accounting(line_harness, tmp_path):
    simulate = "dgx-a100"
    steps = [
        start_kubelet("none"), start_plugin(daemon_argv(simulate)),
        wait_resource(GPU, capacity=8, allocatable=8, timeout=60),
        pod("before", {GPU: 2}),
        {"op": "restart_kubelet", "stale_socket": True},
        {"op": "wait_registrations", "resource": GPU, "at_least": 2, "timeout": 60},
        wait_resource(GPU, capacity=8, allocatable=8, timeout=60),
        pod("rest", {GPU: 6}),
        pod("extra", {GPU: 1}),
    ]
    run = line_harness.run(steps, machine_for(simulate), tmp_path)
    before = container_devices(run.admits()["before"]["containers"][0], GPU)
    rest = run.admits()["rest"]
    assert rest["admit"], rest
    assert container_devices(rest["containers"][0], GPU) == {str(i) for i in range(8)} - before
    assert not run.admits()["extra"]["admit"]


def test_daemon_sigkill_and_restart(line_harness, tmp_path):
    simulate = "dgx-a100"
    argv = daemon_argv(simulate)
    steps = [
        start_kubelet("none"), start_plugin(argv),
        wait_resource(GPU, capacity=8, allocatable=8, timeout=60),
        pod("held", {GPU: 2}),
        {"op": "signal_plugin", "signal": "KILL", "wait_s": 60},
        # Stream gone: the kubelet marks every device unhealthy and keeps the capacity.
        wait_resource(GPU, capacity=8, allocatable=0, timeout=60),
        {"op": "snapshot"},
        start_plugin(argv),
        {"op": "wait_registrations", "resource": GPU, "at_least": 2, "timeout": 60},
        wait_resource(GPU, capacity=8, allocatable=8, timeout=60, hold_s=2),
        {"op": "snapshot"},
        pod("rest", {GPU: 6}),
    ]
    run = line_harness.run(steps, machine_for(simulate), tmp_path)
    kill = run.ops("signal_plugin")[0]
    assert kill["exited"] and kill["exit_code"] == -1
    snap = run.ops("snapshot")[1]
    assert snap["registrations"][GPU] == 2 and snap["inactive"] == []
    held = container_devices(run.admits()["held"]["containers"][0], GPU)
    rest = run.admits()["rest"]
    assert rest["admit"], rest
    assert container_devices(rest["containers"][0], GPU) == {str(i) for i in range(8)} - held


def test_reregistration_does_not_hit_kubernetes_121994(line_harness, tmp_path):
    """Deleting our socket makes the daemon serve again and re-register while the kubelet
    lives. Registering while the old ListAndWatch stream is still open goes wrong on every
    line, differently: on 1.34 the new registration is torn down when the old stream ends
    (kubernetes #121994: the resource drops to 0 allocatable); on 1.37 the kubelet refuses
    it ("device plugin already connected") and keeps the dying endpoint, so our later
    device updates never arrive. The daemon ends the old stream first: the kubelet ends
    with one registration it listens to, healthy and usable, on both lines."""
    gpu_sock = next(r["socket"] for r in discover("dgx-a100")["resources"] if r["name"] == GPU)
    node = tmp_path / "node.yaml"
    node.write_text(node_yaml())
    run = line_harness.run(reregistration_steps(daemon_argv(str(node)), node), machine_for("dgx-a100"),
                           tmp_path / "run")
    first, last = run.ops("snapshot")
    # Exactly one more Register, accepted the first time (a refused one is retried and counted).
    assert first["registrations"][GPU] == 2 and last["registrations"][GPU] == 2, \
        (first["registrations"], last["registrations"])
    assert gpu_sock in first["device_plugin_dir"]
    assert first["inactive"] == [] and last["inactive"] == []
    # The health change went through the new stream (wait_resource allocatable=7 passed).
    assert last["allocatable"][GPU] == 8
    works = run.admits()["works"]
    assert works["admit"] and not check_admitted_pod(works), works


def test_sigterm_sends_empty_list_and_exits_zero(harness, tmp_path):
    simulate = "dgx-a100"
    disc = discover(simulate)
    steps = [start_kubelet("none"), start_plugin(daemon_argv(simulate)), *wait_all(disc, timeout=60),
             {"op": "signal_plugin", "signal": "TERM", "wait_s": 60},
             wait_resource(GPU, capacity=0, allocatable=0, timeout=30),
             {"op": "snapshot"}]
    run = harness.run(steps, machine_for(simulate), tmp_path)
    term = run.ops("signal_plugin")[0]
    assert term["exited"] and term["exit_code"] == 0, term
    snap = run.ops("snapshot")[0]
    for r in disc["resources"]:
        assert r["socket"] not in snap["device_plugin_dir"]


def test_run_options_are_what_our_allocate_returned(harness, tmp_path):
    """GetDeviceRunContainerOptions (what the kubelet hands the runtime) carries our Allocate
    response: env, device nodes, mounts, CDI names (CRI field) and CDI annotations."""
    argv = daemon_argv("dgx-a100", "--device-list-strategy", "envvar,cdi-cri,cdi-annotations", plugin_dir=TAP_DIR)
    run, _ = admission_run(harness, tmp_path, "dgx-a100", "single-numa-node", "container",
                            [pod("cdi", {GPU: 2, NIC: 1})], argv=argv)
    step = run.admits()["cdi"]
    assert step["admit"] and not check_admitted_pod(step) and not check_preferred_calls(step), step
    c = step["containers"][0]
    ro = c["run_options"]
    gpus = container_devices(c, GPU)
    gpu_kind = kind_for_resource(GPU)  # our own CDI kind, never NVIDIA's (specs must not collide)
    assert set(ro["cdi_devices"]) >= {f"{gpu_kind}={i}" for i in gpus}
    allocs = [r for r in step["rpcs"] if r["method"] == "Allocate"]
    assert {r["resource"] for r in allocs} == {GPU, NIC}
    want_env, want_dev, want_cdi, want_ann = {}, set(), set(), {}
    for r in allocs:
        resp = r["response"]["container_responses"][0]
        want_env.update(resp.get("envs") or {})
        want_dev |= {(d["host_path"], d["container_path"], d["permissions"]) for d in resp.get("devices") or []}
        want_cdi |= {d["name"] for d in resp.get("cdi_devices") or []}
        want_ann.update(resp.get("annotations") or {})
    assert ro["envs"] == want_env
    assert {(d["host_path"], d["container_path"], d["permissions"]) for d in ro["devices"]} == want_dev
    assert set(ro["cdi_devices"]) == want_cdi
    assert ro["annotations"] == want_ann
    assert any(",".join(sorted(f"{gpu_kind}={i}" for i in gpus)) == ",".join(sorted(v.split(",")))
               for v in ro["annotations"].values())
