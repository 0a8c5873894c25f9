"""The GPU-machine script (scripts/device/real_gpu_check.sh) runs here, `--simulated`, before any GPU minute is spent.

One run against a simulated DGX H100's driver root (our NVML shim, the static `nvidia-smi`,
/dev/nvidia* by mknod), with everything else real: NVIDIA's nvidia-ctk 1.20.2 writes the spec,
containerd v2 injects it (runc runs its nvidia-cdi-hook hooks), our daemon answers Allocate with
the toolkit's CDI names only (`cdi-cri`, `--cdi-specs external`, `--no-pass-device-specs`), the
kubelet admits a static pod asking two GPUs. What a user would check:

- the container sees exactly its two GPUs' device nodes, from the toolkit's spec;
- `nvidia-smi -L` there (loading `libnvidia-ml.so.1` through the link the toolkit's hook made)
  prints exactly the UUIDs the kubelet recorded for the container;
- the script's last line is the verdict, and says what the run would prove on a real GPU.

Needs root, the kubelet and containerd v2 builds (scripts/kubelet_tests.sh prepare); skips
without them except under TOPO_DP_REQUIRE_KUBELET_E2E=1 (CI), where that is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import kubelet_build
import pytest
from kubelet_testlib import ROOT, build_or_skip, unavailable

pytestmark = pytest.mark.timeout(1500)
WHAT = "the device script in simulated mode (scripts/device/real_gpu_check.sh)"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    if os.geteuid() != 0:
        unavailable(WHAT, "the kubelet, containerd and mknod need root")
    for tool in ("unshare", "mount", "gcc", "runc"):
        if shutil.which(tool) is None:
            unavailable(WHAT, f"{tool} is missing (scripts/kubelet_tests.sh prepare installs the packages)")
    build_or_skip(f"{WHAT}: the kubelet binary", kubelet_build.kubelet_binary)
    build_or_skip(f"{WHAT}: the pod images", kubelet_build.e2e_images)
    out = tmp_path_factory.mktemp("device-check")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "device" / "real_gpu_check.sh"), "run", "--simulated",
                           "--gpus", "2", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200, env=env)
    result_file = out / "gpu-check.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    return proc, result


def test_the_container_gets_its_two_gpus_and_nvidia_smi_prints_their_uuids(run) -> None:
    proc, r = run
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}\n{r.get('error')}"
    assert len(r["allocated"]) == 2
    assert sorted(p["uuid"] for p in r["printed"]) == r["allocated"]
    assert [p["index"] for p in r["printed"]] == ["0", "1"]  # NVML renumbers the container's GPUs from 0
    assert len(r["container_devices"]) == 2
    # Everything came from the toolkit's spec: every GPU of the node named, its libraries mounted.
    assert len([d for d in r["toolkit_spec"]["devices"] if d != "all"]) == 8
    assert "/usr/bin/nvidia-smi" in r["toolkit_spec"]["mounts"]


def test_the_last_line_is_the_verdict_and_says_what_a_real_gpu_would_prove(run) -> None:
    proc, _ = run
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("SIMULATED CHECK PASSED")
    assert "On a real GPU this proves" in last
