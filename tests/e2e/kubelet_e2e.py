"""A real kubelet (the current line of tests/kubelet/k8s_versions.json), standalone, on containerd,
with our daemon serving a simulated node: the part of that e2e that is its own.

What is not its own stands on tests/e2e/cluster/sandbox.py, the one e2e framework: the private
mount, network and UTS namespaces (a holder entered with nsenter), /var/lib/kubelet,
/var/log and /run made private there (the kubelet hard-codes /var/lib/kubelet/device-plugins
whatever --root-dir says, kubernetes #68567), every process spawned and stopped by its PID,
containerd and its teardown, and the check that nothing is left in the namespaces.

What is its own: the standalone kubelet's configuration (no API server, static pods from a
directory, host-network pods only, so no CNI), its static pods, how to read what it observed
(its read-only port, pod-resources, the pods' logs) and the scenarios `run` plays. Used by
tests/e2e/test_kubelet_containerd.py (in-process) and by scripts/device/gpu_node_check.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e" / "cluster"))
from sandbox import Gone, Sandbox, wait_for  # the framework lives beside the cluster modules

NODE = "topo-e2e"
GPU = "nvidia.com/gpu"
BUSYBOX = "localhost/topo-e2e/busybox:1.35"
PAUSE = "registry.k8s.io/pause:3.10"
# The sandbox's own network namespace: these ports clash with nothing.
PORT, RO_PORT, HEALTHZ_PORT = 10350, 10355, 10358

KUBELET_CONFIG = """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: {manifests}
fileCheckFrequency: 1s
syncFrequency: 5s
address: 127.0.0.1
port: {port}
readOnlyPort: {ro_port}
healthzPort: {healthz_port}
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
# These VMs mount cgroup v1; the kubelet refuses it since 1.35 unless told otherwise.
failCgroupV1: false
containerRuntimeEndpoint: unix://{sock}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
registerNode: false
makeIPTablesUtilChains: false
topologyManagerPolicy: {tm_policy}
"""


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def start_containerd(sb: Sandbox, images: pathlib.Path, binary: str = "containerd",
                     cdi_dirs: tuple[str, ...] = ()) -> None:
    """The sandbox's containerd with the e2e's two images. Host-network pods only: the CNI directory is
    empty on purpose (containerd's CRI then reports no pod network, which static host-network pods need not)."""
    no_cni = sb.w / "no-cni"
    no_cni.mkdir(exist_ok=True)
    sb.start_containerd(no_cni, PAUSE, binary, cdi_dirs=cdi_dirs)
    for tar in ("busybox.tar", "pause.tar"):
        sb.import_image(images / tar)
    names = sb.ctr("images", "ls", "-q").stdout.split()
    if BUSYBOX not in names or PAUSE not in names:
        raise RuntimeError(f"containerd lists {names} after importing {images}/busybox.tar and pause.tar")


@dataclass
class StandaloneKubelet:
    """The kubelet without an API server, in `sb`'s namespaces; `harness`: the Go harness binary (its
    pod-resources client), empty where there is none (the GPU machine reads the checkpoint instead)."""

    sb: Sandbox
    binary: str
    harness: str = ""
    tm_policy: str = "none"

    @property
    def manifests(self) -> pathlib.Path:
        return self.sb.w / "manifests"

    def version(self) -> str:
        return self.sb.sh(self.binary, "--version").stdout.strip()

    def start(self) -> float:
        """Start it (again) and wait for /healthz; the seconds that took."""
        cfg = self.sb.w / "kubelet.yaml"
        self.manifests.mkdir(exist_ok=True)
        cfg.write_text(KUBELET_CONFIG.format(manifests=self.manifests, port=PORT, ro_port=RO_PORT,
                                             healthz_port=HEALTHZ_PORT, sock=self.sb.containerd_sock,
                                             tm_policy=self.tm_policy))
        t = time.monotonic()
        self.sb.spawn("kubelet", [self.binary, "--config", str(cfg), "--hostname-override", NODE, "--v=3"])

        def healthy() -> bool:
            if not self.sb.running("kubelet"):
                raise Gone(f"the kubelet exited:\n{self.sb.tail('kubelet')}")  # stop waiting: it cannot come up
            return self.sb.http_get(f"http://127.0.0.1:{HEALTHZ_PORT}/healthz", timeout=2) == "ok"

        wait_for("kubelet healthz", healthy, 180)
        return time.monotonic() - t

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        return self.sb.stop("kubelet", sig, timeout=15)

    # ---- what it observed ----
    def http(self, path: str) -> Any:
        body = self.sb.http_get(f"http://127.0.0.1:{RO_PORT}{path}")
        return json.loads(body) if path == "/pods" else body

    def podresources(self) -> dict[str, Any]:
        out = self.sb.sh(self.harness, "-mode", "podresources", "-socket", "/var/lib/kubelet/pod-resources/kubelet.sock")
        return json.loads(out.stdout)

    def registrations(self) -> dict[str, float]:
        out = {}
        for line in self.http("/metrics").splitlines():
            if line.startswith("kubelet_device_plugin_registration_total{"):
                res = line.split('resource_name="', 1)[1].split('"', 1)[0]
                out[res] = float(line.rsplit(" ", 1)[1])
        return out

    def checkpoint(self) -> dict[str, Any]:
        """The device manager's checkpoint (what it registered and allocated), read through the bind mount."""
        path = self.sb.kubelet_dir / "device-plugins" / "kubelet_internal_checkpoint"
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def wait_gpus(self, n: int, timeout: float = 120) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            pr = self.podresources()
            return pr if len(pr["allocatable"].get(GPU, {})) == n else None
        return wait_for(f"{n} allocatable GPUs in pod-resources", ready, timeout)

    # ---- static pods ----
    def write_pod(self, name: str, gpus: int, command: str | None = None,
                  manifest: dict[str, Any] | None = None) -> None:
        """A static pod asking `gpus` GPUs (or `manifest` as it is): the kubelet picks it up within a second."""
        command = command or 'echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; sleep 3600'
        manifest = manifest or {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1, "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", command],
                "resources": {"limits": {GPU: str(gpus)}},
            }]},
        }
        self.manifests.mkdir(exist_ok=True)
        (self.manifests / f"{name}.json").write_text(json.dumps(manifest))

    def pod_status(self, name: str) -> dict[str, Any] | None:
        for p in self.http("/pods")["items"]:
            if p["metadata"]["name"] == f"{name}-{NODE}":
                return dict(p)
        return None

    def wait_phase(self, name: str, phases: tuple[str, ...], timeout: float = 180) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            p = self.pod_status(name)
            return p if p and p.get("status", {}).get("phase") in phases else None
        return wait_for(f"pod {name} in {phases}", check, timeout)

    def container_log(self, name: str) -> str:
        logs = self.sb.glob(f"/var/log/pods/default_{name}-{NODE}_*/main/*.log")
        return self.sb.read_text(logs[-1]) if logs else ""

    def env_from_log(self, name: str) -> str:
        def get() -> str | None:
            for line in self.container_log(name).splitlines():
                if "NVIDIA_VISIBLE_DEVICES=" in line:
                    return line.split("NVIDIA_VISIBLE_DEVICES=", 1)[1].strip()
            return None
        return wait_for(f"log line of {name}", get, 120)

    def pod_devices(self, pr: dict[str, Any], name: str) -> dict[str, list[int]]:
        for p in pr["pods"] or []:
            if p["name"] == f"{name}-{NODE}":
                for c in p["containers"] or []:
                    if c["name"] == "main":
                        return dict(c["devices"].get(GPU, {}))
        return {}

    def remove_pods(self) -> None:
        """Static pods go when their manifests go: the kubelet stops their containers (waited for while it runs)."""
        for f in self.manifests.glob("*.json"):
            f.unlink()
        if self.sb.running("kubelet"):
            try:
                wait_for("static pods gone", lambda: not self.http("/pods")["items"], 30)
            except Exception as e:  # noqa: BLE001 - containerd's teardown kills what is left; say so
                log(f"pods not gone: {e}")


def start_daemon(sb: Sandbox, python: str, argv: list[str], pythonpath: str = str(ROOT)) -> None:
    """Our daemon in the sandbox (`python -m plugin` + `argv`), its kubelet directory the sandbox's. A relative
    `python` is made absolute here: nsenter's entry into the mount namespace moves the working directory to /."""
    if os.sep in python:
        python = os.path.abspath(python)
    sb.spawn("daemon", [python, "-m", "plugin", *argv], env={"PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1"})


def scenarios(k: StandaloneKubelet, result: dict[str, Any]) -> None:
    """The pods and restarts whose observations test_kubelet_containerd.py asserts on (into `result`)."""
    sc: dict[str, Any] = result.setdefault("scenarios", {})
    t = time.monotonic()
    pr = k.wait_gpus(8)
    result["registration_s"] = round(time.monotonic() - t, 2)
    result["allocatable"] = pr["allocatable"]
    result["registrations_1"] = k.registrations()

    # 1. a pod asking for 2 GPUs starts and sees the allocated IDs
    t = time.monotonic()
    k.write_pod("gpu2", 2)
    st = k.wait_phase("gpu2", ("Running", "Failed", "Succeeded"))
    env = k.env_from_log("gpu2")
    pr = k.podresources()
    sc["gpu2"] = {
        "phase": st["status"]["phase"], "env": env, "podresources": k.pod_devices(pr, "gpu2"),
        "allocatable_after": pr["allocatable"], "start_s": round(time.monotonic() - t, 2),
        "container_status": (st["status"].get("containerStatuses") or [{}])[0],
    }

    # 2. a pod asking for more than is free is rejected by the kubelet
    k.write_pod("toomany", 7)
    st = k.wait_phase("toomany", ("Failed", "Running", "Succeeded"))
    sc["toomany"] = {"phase": st["status"]["phase"], "reason": st["status"].get("reason"),
                     "message": st["status"].get("message")}

    # 3. kubelet restart: it comes back, our daemon registers again, the running pod keeps its devices
    for sig_name, sig in (("TERM", signal.SIGTERM), ("KILL", signal.SIGKILL)):
        before = k.podresources()
        rc = k.stop(sig)
        t = time.monotonic()
        k.start()
        pr = k.wait_gpus(8)
        took = time.monotonic() - t
        st = k.wait_phase("gpu2", ("Running",))
        # The plugin can re-register before the restarted kubelet has re-read its static
        # pods: wait for gpu2 to be listed with devices (recorded as empty if it never is).
        try:
            pr = wait_for("gpu2's devices in pod-resources",
                          lambda: (lambda p: p if k.pod_devices(p, "gpu2") else None)(k.podresources()), 120)
        except TimeoutError as e:
            log(str(e))
            pr = k.podresources()
        sc[f"kubelet_restart_{sig_name}"] = {
            "kubelet_exit": rc, "reregistered_s": round(took, 2), "registrations": k.registrations(),
            "gpu2_devices_before": k.pod_devices(before, "gpu2"), "gpu2_devices_after": k.pod_devices(pr, "gpu2"),
            "gpu2_restart_count": (st["status"].get("containerStatuses") or [{}])[0].get("restartCount"),
            "allocatable": pr["allocatable"],
        }

    # 4. after the restarts the accounting still holds: 6 free GPUs, a new pod gets 2 of them
    k.write_pod("after", 2)
    st = k.wait_phase("after", ("Running", "Failed"))
    pr = k.podresources()
    sc["after_restart"] = {"phase": st["status"]["phase"],
                           "env": k.env_from_log("after") if st["status"]["phase"] == "Running" else None,
                           "podresources": k.pod_devices(pr, "after")}
    result["daemon_running"] = k.sb.running("daemon")


def close(sb: Sandbox, k: StandaloneKubelet | None, result: dict[str, Any]) -> None:
    """Static pods, the kubelet, the daemon (its exit code recorded), then the sandbox: containerd, its
    shims, the holder; what had to be killed without its PID being ours goes into `result["leftovers"]`."""
    t = time.monotonic()
    if k is not None:
        k.remove_pods()
    sb.stop("kubelet")
    result["daemon_exit"] = sb.stop("daemon")
    sb.close()
    result["leftovers"] = list(sb.leftovers)
    result["logs"] = {name: [str(f) for f in files] for name, files in sb.logs.items()}
    result["teardown_s"] = round(time.monotonic() - t, 2)


def run(workdir: pathlib.Path, kubelet: str, harness: str, images: pathlib.Path, node_file: pathlib.Path,
        python: str = sys.executable) -> dict[str, Any]:
    """The whole standalone-kubelet e2e, torn down whatever happened; every observation in the result
    (`error` and `traceback` where it failed, `teardown_error` where tearing down did)."""
    t0 = time.monotonic()
    result: dict[str, Any] = {"scenarios": {}}
    sb = Sandbox(workdir, hostname=NODE, address=None)
    k: StandaloneKubelet | None = None
    try:
        sb.start()
        k = StandaloneKubelet(sb, kubelet, harness)
        result["kubelet_version"] = k.version()
        t = time.monotonic()
        start_containerd(sb, images)
        result["containerd_start_s"] = round(time.monotonic() - t, 2)
        node = workdir / "node.yaml"
        shutil.copy(node_file, node)
        start_daemon(sb, python, ["serve", "--simulate", str(node), "--kubelet-root-dir", "/var/lib/kubelet",
                                  "--device-id-strategy", "index", "--log-level", "debug"])
        result["kubelet_start_s"] = round(k.start(), 2)
        scenarios(k, result)
    except Exception as ex:  # noqa: BLE001 - report, then still tear down
        result["error"] = f"{type(ex).__name__}: {ex}"
        result["traceback"] = traceback.format_exc()
    finally:
        try:
            close(sb, k, result)
        except Exception as ex:  # noqa: BLE001 - reported in the result, the caller fails on it
            result["teardown_error"] = repr(ex)
            result["logs"] = {name: [str(f) for f in files] for name, files in sb.logs.items()}
        result["total_s"] = round(time.monotonic() - t0, 2)
    return result
