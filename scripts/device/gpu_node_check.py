"""One GPU node, end to end: the real kubelet allocates a GPU through our device plugin, and the container
runs the driver's `nvidia-smi -L` from the mounts of NVIDIA's toolkit's CDI spec.

Run by scripts/device/real_gpu_check.sh, as root (it makes its own private namespaces):

    python3 scripts/device/gpu_node_check.py --mode real|simulated --workdir W --bin DIR --images DIR --out R.json \
        [--no-private-network]

What runs (every part real except, in `simulated` mode, the driver):
1. the driver root: `real`, the node's own (the directory holding libnvidia-ml.so.*: `/` or
   `/usr/local/nvidia`); `simulated`, a simulated DGX H100's (tests/support/topo_testkit/driver_root.py:
   our C NVML shim, driver library files, a static `nvidia-smi`, firmware, /dev/nvidia* by mknod);
2. `nvidia-ctk cdi generate` (NVIDIA's toolkit v1.20.2, built from its module) writes the toolkit's
   spec for it into a CDI directory, with `nvidia-cdi-hook` from the bundle as its hook;
3. containerd v2 (CDI on for that directory and ours) with runc, the busybox and pause images;
4. our daemon serving `nvidia.com/gpu` with `--device-list-strategy cdi-cri --cdi-specs external
   --no-pass-device-specs`: Allocate names the toolkit's device `nvidia.com/gpu=<UUID>` (checked against
   its spec) and passes no device node of its own, so whatever the container gets comes from the spec;
5. the kubelet (standalone, static pods) and one pod asking `nvidia.com/gpu: N` whose container lists
   /dev/nvidia* and runs the spec's `nvidia-smi -L` (a real node's, a dynamic program, through the host's
   loader mounted read-only at /host-libc; busybox has no libc);
6. the verdict: the UUIDs `nvidia-smi -L` printed equal the device IDs the kubelet recorded for the
   container (its device-manager checkpoint), and the container has exactly those GPUs' /dev/nvidia<minor>.

Everything observed goes into R.json; the last line printed is the verdict. The namespaces, processes,
containerd and teardown are the e2e framework's (tests/e2e/cluster/sandbox.py), the standalone kubelet and
its static pods tests/e2e/kubelet_e2e.py's: the same code the real-kubelet e2e runs.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import traceback
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "e2e"), str(ROOT / "tests" / "support"), str(ROOT)]

import kubelet_e2e as ke
from kubelet_e2e import BUSYBOX, GPU, log
from sandbox import Sandbox, wait_for  # kubelet_e2e put tests/e2e/cluster on sys.path

SIMULATE = "dgx-h100"
POD = "gpu-check"
UUID_RE = re.compile(r"^GPU (\d+): (.*) \(UUID: (GPU-[0-9a-fA-F-]+)\)$")


def driver_root_real() -> pathlib.Path:
    """The node's driver root: where the toolkit finds libnvidia-ml.so.<version> below lib dirs."""
    for root in ("/", "/usr/local/nvidia"):
        for sub in ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu", "usr/lib64", "lib64", "usr/lib", "lib"):
            if any(pathlib.Path(root, sub).glob("libnvidia-ml.so.*.*")):
                return pathlib.Path(root)
    raise RuntimeError("no libnvidia-ml.so.<version> under / or /usr/local/nvidia: is the NVIDIA driver installed?")


class GpuCheck:
    """The check on one sandboxed node: the toolkit's spec, containerd v2 with CDI, our daemon, the kubelet, one pod."""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.w = pathlib.Path(a.workdir).resolve()
        self.bin = pathlib.Path(a.bin).resolve()
        self.toolkit_dir = self.w / "cdi-toolkit"
        self.our_cdi = self.w / "cdi-ours"
        self.result: dict[str, Any] = {}
        self.t0 = time.monotonic()
        self.sb = Sandbox(self.w, hostname=ke.NODE, address=None, private_network=a.private_network)
        self.kubelet = ke.StandaloneKubelet(self.sb, str(self.bin / "kubelet"))

    # ---- the toolkit's spec ----
    def driver_root(self) -> tuple[pathlib.Path, dict[str, Any]]:
        if self.a.mode == "real":
            return driver_root_real(), {}
        from topo_testkit import driver_root as dr

        # Our discover, by the Python the daemon runs under (with the carried wheels on the GPU machine's).
        report = json.loads(
            subprocess.run([self.a.python, "-m", "plugin", "discover", "--simulate", SIMULATE, "--format", "json"],
                           check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                               filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}).stdout)
        root = dr.build_driver_root(self.w / "driver-root", dr.gpus_from_discover(report))
        return root.path, report

    def generate_spec(self, root: pathlib.Path) -> dict[str, Any]:
        self.toolkit_dir.mkdir(parents=True, exist_ok=True)
        out = self.toolkit_dir / "nvidia.yaml"
        cmd = [str(self.bin / "nvidia-ctk"), "cdi", "generate", "--driver-root", str(root),
               "--dev-root", "/" if self.a.mode == "real" else str(root), "--device-name-strategy", "uuid",
               "--nvidia-cdi-hook-path", str(self.bin / "nvidia-cdi-hook"), "--output", str(out)]
        t = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        (self.w / "nvidia-ctk.log").write_text(proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"nvidia-ctk cdi generate failed ({proc.returncode}): {proc.stderr[-2000:]}")
        self.result["toolkit_generate_s"] = round(time.monotonic() - t, 2)
        import yaml

        spec = yaml.safe_load(out.read_text())
        mounts = [m["containerPath"] for m in (spec.get("containerEdits") or {}).get("mounts") or []]
        self.result["toolkit_spec"] = {"devices": [d["name"] for d in spec.get("devices") or []], "mounts": mounts}
        return spec

    # ---- components (containerd v2 with CDI, our daemon in CDI external mode) ----
    def start_containerd(self) -> None:
        self.our_cdi.mkdir(parents=True, exist_ok=True)
        ke.start_containerd(self.sb, pathlib.Path(self.a.images), str(self.bin / "containerd"),
                            cdi_dirs=(str(self.toolkit_dir), str(self.our_cdi)))

    def start_daemon(self) -> None:
        argv = ["serve", "--kubelet-root-dir", "/var/lib/kubelet",
                "--device-list-strategy", "cdi-cri", "--cdi-specs", "external", "--no-pass-device-specs",
                "--toolkit-cdi-dirs", str(self.toolkit_dir), "--cdi-spec-dir", str(self.our_cdi),
                "--log-level", "debug"]
        if self.a.mode == "simulated":
            argv += ["--simulate", SIMULATE]
        ke.start_daemon(self.sb, self.a.python, argv,
                        pythonpath=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))

    # ---- the pod ----
    def write_check_pod(self, spec: dict[str, Any], gpus: int) -> None:
        mounts = {m["containerPath"] for m in (spec.get("containerEdits") or {}).get("mounts") or []}
        smi = next((p for p in sorted(mounts) if p.endswith("/nvidia-smi")), None)
        if smi is None:
            raise RuntimeError(f"the toolkit's spec mounts no nvidia-smi (mounts: {sorted(mounts)})")
        libdirs = sorted({os.path.dirname(p) for p in mounts if ".so" in p})
        run_smi = smi if self.a.mode == "simulated" else (
            f"/host-libc/ld-linux-x86-64.so.2 --library-path /host-libc:{':'.join(libdirs)} {smi}")
        command = f"echo DEVICES $(ls /dev | grep '^nvidia[0-9]'); {run_smi} -L; echo SMI_RC=$?; sleep 3600"
        pod: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": "default"},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1, "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", command],
                "resources": {"limits": {GPU: str(gpus)}}}]},
        }
        if self.a.mode == "real":  # the host's loader and libc for the real, dynamic nvidia-smi (read-only)
            pod["spec"]["volumes"] = [{"name": "host-libc", "hostPath": {"path": "/lib/x86_64-linux-gnu"}}]
            pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "host-libc", "mountPath": "/host-libc",
                                                              "readOnly": True}]
        self.kubelet.write_pod(POD, gpus, manifest=pod)

    def checkpoint(self) -> dict[str, Any]:
        return self.kubelet.checkpoint()

    def wait_gpus(self, n: int, timeout: float = 180) -> dict[str, Any]:
        """The kubelet registered our GPUs: its device-manager checkpoint lists `n` (no pod-resources client here)."""
        return wait_for(f"{n} GPUs registered with the kubelet", lambda: (lambda d: d if len(
            (d["Data"].get("RegisteredDevices") or {}).get(GPU) or []) == n else None)(self.checkpoint()), timeout)

    def allocated(self) -> list[str]:
        """The device IDs the kubelet's device manager recorded for the check pod's container."""
        for e in self.checkpoint()["Data"]["PodDeviceEntries"] or []:
            if e["ContainerName"] == "main" and e["ResourceName"] == GPU:
                ids = e["DeviceIDs"]
                return sorted({i for v in ids.values() for i in v} if isinstance(ids, dict) else set(ids))
        return []

    def run(self) -> None:
        self.result["mode"] = self.a.mode
        self.sb.start()
        self.result["kubelet_version"] = self.kubelet.version()
        root, _ = self.driver_root()
        self.result["driver_root"] = str(root)
        spec = self.generate_spec(root)
        self.start_containerd()
        self.start_daemon()
        self.result["kubelet_start_s"] = round(self.kubelet.start(), 2)
        n_gpus = len([d for d in self.result["toolkit_spec"]["devices"] if d != "all"])
        self.wait_gpus(n_gpus)
        t = time.monotonic()
        self.write_check_pod(spec, self.a.gpus)
        st = self.kubelet.wait_phase(POD, ("Running", "Failed", "Succeeded"))
        self.result["pod_phase"] = st["status"]["phase"]
        text = wait_for("nvidia-smi's output", lambda: (lambda t: t if "SMI_RC=" in t else None)(
            self.kubelet.container_log(POD)), 120)
        self.result["pod_start_s"] = round(time.monotonic() - t, 2)
        lines = [ln.split(" ", 3)[-1] if ln[:4].isdigit() else ln for ln in text.splitlines()]  # CRI log prefix
        self.result["container_output"] = lines
        self.result["allocated"] = self.allocated()
        printed = [m.groups() for m in (UUID_RE.match(ln.strip()) for ln in lines) if m]
        self.result["printed"] = [{"index": i, "name": n, "uuid": u} for i, n, u in printed]
        devices: list[str] = next((ln.split()[1:] for ln in lines if ln.startswith("DEVICES")), [])
        self.result["container_devices"] = devices
        rc = next((ln.split("=", 1)[1] for ln in lines if ln.startswith("SMI_RC=")), "?")
        uuids = sorted(u for _, _, u in printed)
        self.result["ok"] = (bool(uuids) and rc == "0" and uuids == self.result["allocated"]
                             and len(devices) == len(uuids))


def verdict(r: dict[str, Any]) -> str:
    """The one line the script ends with: passed or failed, and what the run proves (or would, on a real GPU)."""
    what = ("the real kubelet allocated nvidia.com/gpu through topo-device-plugin (CDI names of NVIDIA's toolkit "
            "spec, no device node of ours), and the container, given only what that spec injects, ran the driver's "
            "nvidia-smi -L and printed exactly the allocated UUIDs")
    if r.get("ok"):
        got = f"{', '.join(r['allocated'])}: {what}"
    else:
        why = r.get("error") or (f"allocated {r.get('allocated')}, nvidia-smi printed {r.get('printed')}, "
                                 f"device nodes {r.get('container_devices')}")
        got = f"{why}; the check was that {what}"
    status = "PASSED" if r.get("ok") else "FAILED"
    if r.get("mode") == "real":
        names = ", ".join(sorted({p["name"] for p in r.get("printed") or []})) or "GPU"
        return f"REAL GPU CHECK {status} ({names}): {got}"
    return (f"SIMULATED CHECK {status} on a simulated {SIMULATE} (NVML shim, fake nvidia-smi): {got}. On a real GPU "
            "this proves that our device plugin, the real kubelet, containerd's CDI injection and NVIDIA's toolkit "
            "spec give a container its allocated GPU with the driver's libraries and nvidia-smi, and that the UUID we "
            "allocated is the GPU the driver shows there.")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("real", "simulated"), required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--bin", required=True, help="kubelet, containerd, containerd-shim-runc-v2, runc, ctr, nvidia-ctk, "
                                                  "nvidia-cdi-hook")
    ap.add_argument("--images", required=True, help="busybox.tar and pause.tar")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-private-network", dest="private_network", action="store_false",
                    help="a mount namespace only (where this machine refuses network namespaces)")
    a = ap.parse_args()
    # ctr, runc and the shim from the bundle first (containerd and the sandbox's `ctr` calls look them up in PATH).
    os.environ["PATH"] = f"{pathlib.Path(a.bin).resolve()}:{os.environ.get('PATH', '')}"
    e = GpuCheck(a)
    try:
        e.run()
    except Exception as ex:  # noqa: BLE001 - report, then still tear down
        e.result["error"] = f"{type(ex).__name__}: {ex}"
        e.result["traceback"] = traceback.format_exc()
        log(e.result["traceback"])
    finally:
        try:
            ke.close(e.sb, e.kubelet, e.result)
        except Exception as ex:  # noqa: BLE001 - reported in the result; the verdict is then FAILED
            e.result["teardown_error"] = repr(ex)
        e.result["total_s"] = round(time.monotonic() - e.t0, 2)
        pathlib.Path(a.out).write_text(json.dumps(e.result, indent=1))
    print(verdict(e.result), flush=True)
    return 0 if e.result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
