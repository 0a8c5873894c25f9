"""A real kubelet (the current line of tests/kubelet/k8s_versions.json) on containerd, with
our daemon, on this machine.

Run by tests/e2e/test_kubelet_containerd.py as

    unshare --mount --net --propagation private python tests/e2e/kubelet_e2e.py \
        --workdir W --kubelet BIN --harness BIN --images DIR --out result.json

It refuses to run outside a private mount namespace. In its own network namespace
(loopback only) the kubelet's ports clash with nothing. Inside, it mounts
W/var-lib-kubelet over /var/lib/kubelet (the kubelet hard-codes
/var/lib/kubelet/device-plugins whatever --root-dir says, kubernetes #68567),
W/var-log-pods over /var/log/pods and a tmpfs over /run/containerd, so nothing of
a real node is touched. Then: containerd (Debian's, its own root/state under W) with
the locally built images imported, our daemon serving a simulated 8-GPU node,
the kubelet standalone (no API server, static pods, host network), and the
scenarios. Every observation goes into the JSON result; pytest asserts on it.
Everything started here is stopped here (by PID).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
NODE = "topo-e2e"
GPU = "nvidia.com/gpu"
BUSYBOX = "localhost/topo-e2e/busybox:1.35"
PAUSE = "registry.k8s.io/pause:3.10"
PORT, RO_PORT, HEALTHZ_PORT = 10350, 10355, 10358

CONTAINERD_CONFIG = """version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # This VM's root has no CAP_SYS_RESOURCE: runc cannot lower oom_score_adj to the
  # kubelet's -998 for sandboxes, so clamp it at containerd's own value.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{w}/cni-bin"
    conf_dir = "{w}/cni-conf"
"""

KUBELET_CONFIG = """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: {w}/manifests
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


def check_private_namespace() -> None:
    own = os.readlink("/proc/self/ns/mnt")
    for path in (f"/proc/{os.getppid()}/ns/mnt", "/proc/1/ns/mnt"):
        try:
            if os.readlink(path) == own:
                sys.exit(f"refusing to run in the mount namespace of {path}: start me with "
                         "`unshare --mount --propagation private`")
        except OSError:
            continue


def sh(*cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=timeout)


class E2E:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.w = pathlib.Path(a.workdir).resolve()
        self.sock = str(self.w / "containerd" / "containerd.sock")
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, list[str]] = {}
        self.result: dict[str, Any] = {"scenarios": {}}
        self.t0 = time.monotonic()
        # containerd puts the pods' cgroups under <controller>/k8s.io; remove what we created.
        self.cgroups_before = {str(p) for p in pathlib.Path("/sys/fs/cgroup").glob("*/k8s.io")}

    # ---- plumbing ----
    def mounts(self) -> None:
        # In a private network namespace (test_kubelet_containerd.py starts us in one) only
        # the loopback exists, down: the kubelet and the pods (host network) use 127.0.0.1.
        sh("ip", "link", "set", "lo", "up")
        sh("mount", "--make-rprivate", "/")
        for src, dst in (("var-lib-kubelet", "/var/lib/kubelet"), ("var-log-pods", "/var/log/pods")):
            (self.w / src).mkdir(parents=True, exist_ok=True)
            os.makedirs(dst, exist_ok=True)  # an empty mount point where the host has none
            sh("mount", "--bind", str(self.w / src), dst)
        os.makedirs("/run/containerd", exist_ok=True)
        sh("mount", "-t", "tmpfs", "tmpfs", "/run/containerd")
        (pathlib.Path("/var/lib/kubelet") / ".topo-e2e-sandbox").write_text(str(self.w))
        assert (self.w / "var-lib-kubelet" / ".topo-e2e-sandbox").exists(), "bind mount did not take"

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        n = len(self.logs.setdefault(name, [])) + 1
        logf = self.w / f"{name}-{n}.log"
        self.logs[name].append(str(logf))
        full_env = dict(os.environ, **(env or {}))
        p = subprocess.Popen(argv, stdout=open(logf, "w"), stderr=subprocess.STDOUT, env=full_env,
                             start_new_session=True)
        self.procs[name] = p
        log(f"started {name} pid {p.pid} ({logf.name})")
        return p

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 15) -> int | None:
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            return None if p is None else p.returncode
        p.send_signal(sig)
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            return p.wait(10)

    def wait_for(self, what: str, fn, timeout: float, interval: float = 0.2):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = fn()
                if last:
                    return last
            except Exception as e:  # noqa: BLE001 - keep polling, report the last error
                last = e
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh("ctr", "--address", self.sock, "-n", "k8s.io", *args, check=check)

    def http(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{RO_PORT}{path}", timeout=5) as r:
            body = r.read().decode()
        return json.loads(body) if path == "/pods" else body

    def podresources(self) -> dict[str, Any]:
        out = sh(self.a.harness, "-mode", "podresources", "-socket", "/var/lib/kubelet/pod-resources/kubelet.sock")
        return json.loads(out.stdout)

    def registrations(self) -> dict[str, float]:
        text = self.http("/metrics")
        out = {}
        for line in text.splitlines():
            if line.startswith("kubelet_device_plugin_registration_total{"):
                res = line.split('resource_name="', 1)[1].split('"', 1)[0]
                out[res] = float(line.rsplit(" ", 1)[1])
        return out

    # ---- components ----
    def start_containerd(self) -> None:
        d = self.w / "containerd"
        d.mkdir(parents=True, exist_ok=True)
        cfg = d / "config.toml"
        cfg.write_text(CONTAINERD_CONFIG.format(root=d / "root", state=d / "state", sock=self.sock, pause=PAUSE, w=d))
        self.spawn("containerd", ["containerd", "--config", str(cfg)])
        self.wait_for("containerd socket", lambda: os.path.exists(self.sock), 120)
        t = time.monotonic()
        for tar in ("busybox.tar", "pause.tar"):
            self.ctr("images", "import", str(pathlib.Path(self.a.images) / tar))
        self.result["images_import_s"] = round(time.monotonic() - t, 2)
        names = self.ctr("images", "ls", "-q").stdout.split()
        assert BUSYBOX in names and PAUSE in names, names

    def start_daemon(self) -> None:
        node = self.w / "node.yaml"
        if not node.exists():
            shutil.copy(self.a.node_file, node)
        self.spawn("daemon", [self.a.python, "-m", "plugin", "serve", "--simulate", str(node),
                              "--kubelet-root-dir", "/var/lib/kubelet", "--device-id-strategy", "index",
                              "--log-level", "debug"],
                   env={"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})

    def start_kubelet(self) -> float:
        cfg = self.w / "kubelet.yaml"
        (self.w / "manifests").mkdir(exist_ok=True)
        cfg.write_text(KUBELET_CONFIG.format(w=self.w, port=PORT, ro_port=RO_PORT, healthz_port=HEALTHZ_PORT,
                                             sock=self.sock, tm_policy="none"))
        t = time.monotonic()
        self.spawn("kubelet", [self.a.kubelet, "--config", str(cfg), "--hostname-override", NODE, "--v=3"])

        def healthy():
            with urllib.request.urlopen(f"http://127.0.0.1:{HEALTHZ_PORT}/healthz", timeout=2) as r:
                return r.read() == b"ok"

        self.wait_for("kubelet healthz", healthy, 180)
        return time.monotonic() - t

    def wait_gpus(self, n: int, timeout: float = 120) -> dict[str, Any]:
        def ready():
            pr = self.podresources()
            return pr if len(pr["allocatable"].get(GPU, {})) == n else None
        return self.wait_for(f"{n} allocatable GPUs in pod-resources", ready, timeout)

    # ---- pods ----
    def write_pod(self, name: str, gpus: int, command: str | None = None) -> None:
        command = command or 'echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; sleep 3600'
        manifest = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1, "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", command],
                "resources": {"limits": {GPU: str(gpus)}},
            }]},
        }
        (self.w / "manifests" / f"{name}.json").write_text(json.dumps(manifest))

    def pod_status(self, name: str) -> dict[str, Any] | None:
        for p in self.http("/pods")["items"]:
            if p["metadata"]["name"] == f"{name}-{NODE}":
                return p
        return None

    def wait_phase(self, name: str, phases: tuple[str, ...], timeout: float = 180) -> dict[str, Any]:
        def check():
            p = self.pod_status(name)
            return p if p and p.get("status", {}).get("phase") in phases else None
        return self.wait_for(f"pod {name} in {phases}", check, timeout)

    def container_log(self, name: str) -> str:
        logs = sorted(pathlib.Path("/var/log/pods").glob(f"default_{name}-{NODE}_*/main/*.log"))
        return logs[-1].read_text() if logs else ""

    def env_from_log(self, name: str) -> str:
        def get():
            for line in self.container_log(name).splitlines():
                if "NVIDIA_VISIBLE_DEVICES=" in line:
                    return line.split("NVIDIA_VISIBLE_DEVICES=", 1)[1].strip()
            return None
        return self.wait_for(f"log line of {name}", get, 120)

    def pod_devices(self, pr: dict[str, Any], name: str) -> dict[str, list[int]]:
        for p in pr["pods"] or []:
            if p["name"] == f"{name}-{NODE}":
                for c in p["containers"] or []:
                    if c["name"] == "main":
                        return c["devices"].get(GPU, {})
        return {}

    # ---- scenarios ----
    def run(self) -> None:
        self.result["kubelet_version"] = sh(self.a.kubelet, "--version").stdout.strip()
        t = time.monotonic()
        self.start_containerd()
        self.result["containerd_start_s"] = round(time.monotonic() - t, 2)
        self.start_daemon()
        self.result["kubelet_start_s"] = round(self.start_kubelet(), 2)
        t = time.monotonic()
        pr = self.wait_gpus(8)
        self.result["registration_s"] = round(time.monotonic() - t, 2)
        self.result["allocatable"] = pr["allocatable"]
        self.result["registrations_1"] = self.registrations()

        # 1. a pod asking for 2 GPUs starts and sees the allocated IDs
        t = time.monotonic()
        self.write_pod("gpu2", 2)
        st = self.wait_phase("gpu2", ("Running", "Failed", "Succeeded"))
        env = self.env_from_log("gpu2")
        pr = self.podresources()
        self.result["scenarios"]["gpu2"] = {
            "phase": st["status"]["phase"], "env": env, "podresources": self.pod_devices(pr, "gpu2"),
            "allocatable_after": pr["allocatable"], "start_s": round(time.monotonic() - t, 2),
            "container_status": (st["status"].get("containerStatuses") or [{}])[0],
        }

        # 2. a pod asking for more than is free is rejected by the kubelet
        self.write_pod("toomany", 7)
        st = self.wait_phase("toomany", ("Failed", "Running", "Succeeded"))
        self.result["scenarios"]["toomany"] = {"phase": st["status"]["phase"], "reason": st["status"].get("reason"),
                                               "message": st["status"].get("message")}

        # 3. kubelet restart: it comes back, our daemon registers again, the running pod keeps its devices
        for sig_name, sig in (("TERM", signal.SIGTERM), ("KILL", signal.SIGKILL)):
            before = self.podresources()
            rc = self.stop("kubelet", sig)
            t = time.monotonic()
            self.start_kubelet()
            pr = self.wait_gpus(8)
            took = time.monotonic() - t
            st = self.wait_phase("gpu2", ("Running",))
            # The plugin can re-register before the restarted kubelet has re-read its static
            # pods: wait for gpu2 to be listed with devices (recorded as empty if it never is).
            try:
                pr = self.wait_for("gpu2's devices in pod-resources",
                                   lambda: (lambda p: p if self.pod_devices(p, "gpu2") else None)(self.podresources()),
                                   120)
            except TimeoutError as e:
                log(str(e))
                pr = self.podresources()
            self.result["scenarios"][f"kubelet_restart_{sig_name}"] = {
                "kubelet_exit": rc, "reregistered_s": round(took, 2), "registrations": self.registrations(),
                "gpu2_devices_before": self.pod_devices(before, "gpu2"), "gpu2_devices_after": self.pod_devices(pr, "gpu2"),
                "gpu2_restart_count": (st["status"].get("containerStatuses") or [{}])[0].get("restartCount"),
                "allocatable": pr["allocatable"],
            }

        # 4. after the restarts the accounting still holds: 6 free GPUs, a new pod gets 2 of them
        self.write_pod("after", 2)
        st = self.wait_phase("after", ("Running", "Failed"))
        pr = self.podresources()
        self.result["scenarios"]["after_restart"] = {"phase": st["status"]["phase"], "env": self.env_from_log("after")
                                                     if st["status"]["phase"] == "Running" else None,
                                                     "podresources": self.pod_devices(pr, "after")}
        self.result["daemon_running"] = self.procs["daemon"].poll() is None

    def teardown(self) -> None:
        t = time.monotonic()
        # Static pods go when their manifests go; the kubelet stops their containers.
        for f in (self.w / "manifests").glob("*.json"):
            f.unlink()
        if self.procs.get("kubelet") and self.procs["kubelet"].poll() is None:
            try:
                self.wait_for("static pods gone", lambda: not self.http("/pods")["items"], 30)
            except Exception as e:  # noqa: BLE001
                log(f"pods not gone: {e}")
        self.stop("kubelet")
        self.result["daemon_exit"] = self.stop("daemon")
        if self.procs.get("containerd") and self.procs["containerd"].poll() is None:
            for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
            time.sleep(0.5)
            for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "delete", "-f", task, check=False)
            for c in self.ctr("containers", "ls", "-q", check=False).stdout.split():
                self.ctr("containers", "delete", c, check=False)
        self.stop("containerd")
        # containerd shims outlive containerd: stop the ones that belong to our containerd.
        for pid_dir in pathlib.Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            try:
                cmd = (pid_dir / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and self.sock.encode() in b" ".join(cmd):
                log(f"stopping leftover shim {pid_dir.name}")
                try:
                    os.kill(int(pid_dir.name), signal.SIGKILL)
                except OSError:
                    pass
        for d in pathlib.Path("/sys/fs/cgroup").glob("*/k8s.io"):
            if str(d) in self.cgroups_before:
                continue
            for dirpath, _, _ in os.walk(d, topdown=False):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass
        self.result["teardown_s"] = round(time.monotonic() - t, 2)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--kubelet", required=True)
    ap.add_argument("--harness", required=True)
    ap.add_argument("--images", required=True)
    ap.add_argument("--node-file", required=True, help="simulated node YAML (copied into the workdir)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    check_private_namespace()
    e = E2E(a)
    e.w.mkdir(parents=True, exist_ok=True)
    rc = 0
    try:
        e.mounts()
        e.run()
    except Exception as ex:  # noqa: BLE001 - report, then still tear down
        import traceback

        e.result["error"] = f"{type(ex).__name__}: {ex}"
        e.result["traceback"] = traceback.format_exc()
        rc = 1
    finally:
        try:
            e.teardown()
        except Exception as ex:  # noqa: BLE001
            e.result["teardown_error"] = repr(ex)
        e.result["logs"] = e.logs
        e.result["total_s"] = round(time.monotonic() - e.t0, 2)
        pathlib.Path(a.out).write_text(json.dumps(e.result, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
