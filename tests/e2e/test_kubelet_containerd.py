"""A real kubelet (the current line of tests/kubelet/k8s_versions.json) on Debian's containerd,
with our daemon serving a simulated DGX A100 (8 GPUs, NUMA 0: 0-3, NUMA 1: 4-7).

The whole run happens once (tests/e2e/kubelet_e2e.py, in this process, on the e2e framework
tests/e2e/cluster/sandbox.py: private mount, network and UTS namespaces of its own, so it can run
beside the cluster modules); each test below checks one part of what it observed.

Needs root, containerd, runc, ctr, unshare and nsenter (scripts/kubelet_tests.sh installs
them). Where they are missing the tests skip with the reason printed, except under
TOPO_DP_REQUIRE_KUBELET_E2E=1 (CI), where that is a failure (kubelet_testlib.unavailable);
a failed build always fails.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

import kubelet_build
import kubelet_e2e
import pytest
from kubelet_testlib import (
    GPU,
    PYTHON,
    ROOT,
    build_or_skip,
    discover,
    preferred_offline,
    unavailable,
)

# The first test of a fresh machine builds the harness/kubelet (minutes on 2 cores;
# scripts/kubelet_tests.sh prepare does it up front). Each run below has its own timeout.
pytestmark = pytest.mark.timeout(1500)

SIMULATE = "dgx-a100"
REQUIRED_TOOLS = ("containerd", "runc", "ctr", "unshare", "nsenter", "mount")


WHAT = "the real-kubelet e2e (tests/e2e)"


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    if os.geteuid() != 0:
        unavailable(WHAT, "the kubelet and containerd need root")
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if missing:
        unavailable(WHAT, f"missing {', '.join(missing)} (Debian packages containerd, runc; "
                     "`bash scripts/kubelet_tests.sh prepare` installs them)")
    kubelet = build_or_skip(f"{WHAT}: the kubelet binary", kubelet_build.kubelet_binary)
    harness = build_or_skip(f"{WHAT}: the Go harness", kubelet_build.harness_binary)
    images = build_or_skip(f"{WHAT}: the pod images", kubelet_build.e2e_images)
    w = tmp_path_factory.mktemp("kubelet-e2e")
    sys.path.insert(0, str(ROOT))
    from plugin.sources.simulated import builtin_text

    node = w / "node.yaml"
    node.write_text(builtin_text(SIMULATE))
    result = kubelet_e2e.run(w / "run", str(kubelet), str(harness), images["busybox"].parent, node, python=PYTHON)
    if "error" in result or "teardown_error" in result:
        tails = []
        for files in (result.get("logs") or {}).values():
            for f in files[-1:]:
                lines = pathlib.Path(f).read_text(errors="replace").splitlines()[-25:]
                tails.append(f"--- {f}\n" + "\n".join(lines))
        pytest.fail(f"e2e run failed: {result.get('error')}\n{result.get('traceback', '')}\n"
                    f"teardown: {result.get('teardown_error')}\n" + "\n".join(tails))
    print(f"\nreal-kubelet e2e: containerd {result['containerd_start_s']}s, kubelet start {result['kubelet_start_s']}s, "
          f"registration {result['registration_s']}s, total {result['total_s']}s", file=sys.stderr)
    return result


def test_the_kubelet_is_the_current_line(e2e):
    assert e2e["kubelet_version"] == f"Kubernetes {kubelet_build.line('current').kubernetes}"


@pytest.fixture(scope="module")
def disc():
    return discover(SIMULATE)


def _numa(disc, resource):
    r = next(r for r in disc["resources"] if r["name"] == resource)
    return {d["id"]: [d["numa"]] for d in r["devices"]}


def test_pod_asking_two_gpus_runs_with_our_preferred_devices(e2e, disc):
    s = e2e["scenarios"]["gpu2"]
    assert s["phase"] == "Running", s
    seen = set(s["env"].split(","))
    # The container's environment, the kubelet's record and our allocator's answer agree.
    assert seen == set(s["podresources"])
    assert len(seen) == 2
    all_gpus = sorted(_numa(disc, GPU))
    assert seen == set(preferred_offline(SIMULATE, GPU, 2, all_gpus, []))
    # pod-resources List reports each device's NUMA node as we sent it.
    assert s["podresources"] == {i: _numa(disc, GPU)[i] for i in seen}


def test_podresources_allocatable_lists_every_device_with_numa(e2e, disc):
    alloc = e2e["scenarios"]["gpu2"]["allocatable_after"]
    for r in disc["resources"]:
        assert alloc[r["name"]] == _numa(disc, r["name"]), r["name"]


def test_pod_asking_more_than_is_free_is_rejected(e2e):
    s = e2e["scenarios"]["toomany"]
    assert s["phase"] == "Failed", s
    assert s["reason"] == "UnexpectedAdmissionError"
    assert "requested number of devices unavailable" in s["message"]


@pytest.mark.parametrize("how", ["TERM", "KILL"])
def test_kubelet_restart_leads_to_reregistration(e2e, how):
    s = e2e["scenarios"][f"kubelet_restart_{how}"]
    # The counter lives in the new kubelet process: 1 means our daemon registered with it
    # once, accepted the first time. (How fast is measured in benchmarks/, not here.)
    assert s["registrations"][GPU] == 1
    assert len(s["allocatable"][GPU]) == 8
    # The running pod keeps its devices and was not restarted.
    assert s["gpu2_devices_after"] == s["gpu2_devices_before"] and s["gpu2_devices_after"]
    assert s["gpu2_restart_count"] == 0


def test_accounting_survives_kubelet_restarts(e2e, disc):
    held = set(e2e["scenarios"]["gpu2"]["podresources"])
    s = e2e["scenarios"]["after_restart"]
    assert s["phase"] == "Running", s
    got = set(s["env"].split(","))
    assert got == set(s["podresources"]) and not got & held
    free = sorted(set(_numa(disc, GPU)) - held)
    assert got == set(preferred_offline(SIMULATE, GPU, 2, free, []))


def test_daemon_lived_through_it_and_exits_cleanly(e2e):
    assert e2e["daemon_running"]
    assert e2e["daemon_exit"] == 0


def test_teardown_stopped_everything_by_its_pid(e2e):
    # The sandbox kills and lists whatever is still in its namespaces after every process it
    # started was stopped by its PID: a kubelet, daemon or shim that outlived its stop shows here.
    assert e2e["leftovers"] == []
