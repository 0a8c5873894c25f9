"""The chart release and the workload pods the cluster scenarios run, and what they observe.

Workload pods run the project's own image (it has Python) with a small program that
prints, once, what the container really got from the runtime: its environment, every
character device under /dev (with major:minor), its mount points and its CPUs. The tests
compare that with what the device plugin's Allocate promised (the kubelet's checkpoint
holds the exact response), with the pod-resources API and with `explain`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import stat
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml
from cluster import Cluster
from sandbox import wait_for

ROOT = pathlib.Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "topo-device-plugin"
RELEASE = "tdp"
NAMESPACE = "topo-system"
GPU = "nvidia.com/gpu"
NIC = "topo.dev/nic"
SIMULATE = "dgx-a100"
NVIDIA_MAJOR = 195
REPORT_MARK = "TOPO-E2E-REPORT "

REPORT = f"""
import json, os, stat, time
devices = {{}}
for d, dirs, files in os.walk("/dev"):
    for name in dirs + files:
        p = os.path.join(d, name)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            devices[p] = [os.major(st.st_rdev), os.minor(st.st_rdev)]
mounts = [line.split()[4] for line in open("/proc/self/mountinfo")]
print({REPORT_MARK!r} + json.dumps({{"env": dict(os.environ), "devices": devices, "mounts": mounts,
      "cpus": sorted(os.sched_getaffinity(0))}}), flush=True)
time.sleep(10**9)
"""


@dataclass
class Node:
    """The simulated node the plugin serves, as files the daemon pod and the tests share."""

    node_file: pathlib.Path  # a built-in node with GPU minor numbers (so Allocate names device nodes)
    dev_root: pathlib.Path  # harmless character devices standing in for /dev/nvidia*

    @classmethod
    def make(cls, w: pathlib.Path, simulate: str = SIMULATE) -> Node:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from plugin.sources.simulated import builtin_text

        data = yaml.safe_load(builtin_text(simulate))
        for i, gpu in enumerate(data["gpus"]):
            gpu["minor"] = i
        node_dir = w / "node"
        node_dir.mkdir()
        node_file = node_dir / "node.yaml"
        node_file.write_text(yaml.safe_dump(data, sort_keys=False))
        dev = w / "dev"
        dev.mkdir()
        # The NVIDIA driver's major number; no driver is loaded here, so opening one fails (ENXIO).
        for i in range(len(data["gpus"])):
            os.mknod(dev / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, i))
        os.mknod(dev / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, 255))
        return cls(node_file, dev)

    def numa_nodes(self) -> tuple[list[int], dict[int, list[int]]]:
        data = yaml.safe_load(self.node_file.read_text())
        nodes = data["numa"]["nodes"]
        return nodes, {n: row for n, row in zip(nodes, data["numa"]["distances"])}


def chart_values(image_ref: str, node: Node, **overrides: Any) -> dict[str, Any]:
    repo, tag = image_ref.rsplit(":", 1)
    values: dict[str, Any] = {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
        "simulate": str(node.node_file),
        "nvidia": {"enabled": False},
        "config": {"flags": {"deviceIdStrategy": "index", "logLevel": "debug", "logFormat": "text"}},
        "extraArgs": [f"--dev-root={node.dev_root}"],
        "extraVolumes": [
            {"name": "node", "hostPath": {"path": str(node.node_file.parent), "type": "Directory"}},
            {"name": "devroot", "hostPath": {"path": str(node.dev_root), "type": "Directory"}},
        ],
        "extraVolumeMounts": [
            {"name": "node", "mountPath": str(node.node_file.parent), "readOnly": True},
            {"name": "devroot", "mountPath": str(node.dev_root), "readOnly": True},
        ],
    }
    for key, value in overrides.items():
        values[key] = value
    return values


def helm_upgrade(c: Cluster, values: dict[str, Any], *extra: str, check: bool = True):
    vfile = c.w / f"values-{time.monotonic_ns()}.yaml"
    vfile.write_text(yaml.safe_dump(values, sort_keys=False))
    return c.helm("upgrade", "--install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
                  "-f", str(vfile), *extra, check=check)


def daemon_pods(c: Cluster) -> list[dict[str, Any]]:
    return c.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=topo-device-plugin")["items"]


def ready(pod: dict[str, Any]) -> bool:
    conds = {x["type"]: x["status"] for x in pod.get("status", {}).get("conditions", [])}
    return conds.get("Ready") == "True" and pod["metadata"].get("deletionTimestamp") is None


def wait_daemon_ready(c: Cluster, not_uid: str | None = None, timeout: float = 240) -> dict[str, Any]:
    """The one daemon pod, Ready (and, after a roll, a different pod than `not_uid`)."""
    def one():
        pods = [p for p in daemon_pods(c) if p["metadata"]["uid"] != not_uid]
        live = [p for p in pods if ready(p)]
        return live[0] if len(live) == 1 and len(daemon_pods(c)) == 1 else None
    try:
        return wait_for("the plugin's DaemonSet pod to be Ready", one, timeout)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{diagnose(c, NAMESPACE)}") from None


def diagnose(c: Cluster, namespace: str = "default") -> str:
    """What an operator would look at: pods, their description and events, the kubelet's log."""
    parts = []
    for args in (("get", "pods", "-A", "-o", "wide"), ("describe", "pods", "-n", namespace),
                 ("get", "events", "-A", "--sort-by=.lastTimestamp")):
        proc = c.kubectl(*args, check=False)
        parts.append(f"$ kubectl {' '.join(args)}\n{proc.stdout[-4000:]}{proc.stderr[-1000:]}")
    parts.append(c.sb.tail("kubelet", 40))
    return "\n".join(parts)


def wait_allocatable(c: Cluster, want: dict[str, str], timeout: float = 180) -> dict[str, str]:
    def reached():
        alloc = c.allocatable()
        return alloc if all(alloc.get(k) == v for k, v in want.items()) else None
    return wait_for(f"node allocatable {want}", reached, timeout)


def workload(name: str, image_ref: str, limits: dict[str, int | str], guaranteed: bool = False) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": {k: str(v) for k, v in limits.items()}} if limits else {}
    if guaranteed:
        resources["requests"] = dict(resources["limits"])
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"topo-e2e": "workload"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "restartPolicy": "Never",
            "containers": [{
                "name": "main", "image": image_ref, "imagePullPolicy": "Never",
                "command": ["python3", "-c", REPORT],
                "resources": resources,
            }],
        },
    }


def phase(c: Cluster, name: str) -> dict[str, Any]:
    return c.get("pod", name, "-n", "default")


def wait_settled(c: Cluster, name: str, timeout: float = 180) -> dict[str, Any]:
    """Running with its report printed, or Failed (a kubelet admission rejection)."""
    def settled():
        p = phase(c, name)
        ph = p.get("status", {}).get("phase")
        if ph == "Failed":
            return p
        if ph == "Running" and report(c, name) is not None:
            return p
        return None
    try:
        return wait_for(f"pod {name} Running or Failed", settled, timeout)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{diagnose(c)}") from None


def report(c: Cluster, name: str) -> dict[str, Any] | None:
    out = c.kubectl("logs", "-n", "default", name, check=False).stdout
    for line in out.splitlines():
        if line.startswith(REPORT_MARK):
            return json.loads(line[len(REPORT_MARK):])
    return None


def delete_workloads(c: Cluster, timeout: float = 180) -> None:
    c.kubectl("delete", "pods", "-n", "default", "-l", "topo-e2e=workload", "--wait=false")
    wait_for("workload pods gone", lambda: not c.get("pods", "-n", "default", "-l", "topo-e2e=workload")["items"],
             timeout)


def delete_pod(c: Cluster, name: str, timeout: float = 180) -> None:
    c.kubectl("delete", "pod", "-n", "default", name, "--wait=false")
    wait_for(f"pod {name} gone", lambda: not c.get("pods", "-n", "default", "--field-selector",
                                                   f"metadata.name={name}")["items"], timeout)


def wait_kubelet_synced(c: Cluster, image_ref: str) -> None:
    """Make sure the (re)started kubelet has handled a pod update from the API server.

    The kubelet marks its pod sources ready only *after* handling an update
    (kubelet.go syncLoopIteration: AddSource follows the handler), and until then the
    device manager keeps the devices of pods deleted before the restart allocated
    (UpdateAllocatedDevices returns early). A pod without devices, Running, is that update.
    """
    name = f"kubelet-synced-{len(c.sb.logs.get('kubelet', []))}"
    c.apply(workload(name, image_ref, {}))
    st = wait_settled(c, name)["status"]
    assert st["phase"] == "Running", st
    delete_pod(c, name)


def promised(c: Cluster, pod_uid: str) -> dict[str, dict[str, Any]]:
    """resource -> {ids, envs, devices (container path -> host path), mounts} from the kubelet's checkpoint."""
    out = {}
    for e in c.checkpoint():
        if e["pod_uid"] == pod_uid:
            r = e["response"]
            out[e["resource"]] = {
                "ids": e["ids"], "envs": dict(r.envs),
                "devices": {d.container_path: d.host_path for d in r.devices},
                "mounts": {m.container_path: m.host_path for m in r.mounts},
            }
    return out


def container_devices(pr: dict[str, Any], pod: str, container: str = "main") -> dict[str, dict[str, list[int]]]:
    for p in pr.get("pods") or []:
        if p["name"] == pod and p.get("namespace", "default") == "default":
            for ctr in p.get("containers") or []:
                if ctr["name"] == container:
                    return {r: dict(d) for r, d in (ctr.get("devices") or {}).items()}
    return {}


def host_rdev(path: str) -> list[int]:
    st = os.stat(path)
    assert stat.S_ISCHR(st.st_mode), f"{path} is not a character device"
    return [os.major(st.st_rdev), os.minor(st.st_rdev)]


def check_runtime_delivered(rep: dict[str, Any], promise: dict[str, dict[str, Any]]) -> list[str]:
    """What Allocate promised (env, device nodes, mounts) is what the container has; [] when it is."""
    v = []
    for res, p in promise.items():
        for k, val in p["envs"].items():
            if rep["env"].get(k) != val:
                v.append(f"{res}: env {k}={val!r} promised, container has {rep['env'].get(k)!r}")
        for cpath, hpath in p["devices"].items():
            if rep["devices"].get(cpath) != host_rdev(hpath):
                v.append(f"{res}: device {cpath} ({hpath}, {host_rdev(hpath)}) promised, container has "
                         f"{rep['devices'].get(cpath)}")
        for cpath in p["mounts"]:
            if cpath not in rep["mounts"]:
                v.append(f"{res}: mount {cpath} promised, container has none there")
    promised_nvidia = {c for p in promise.values() for c in p["devices"] if os.path.basename(c).startswith("nvidia")}
    seen_nvidia = {c for c in rep["devices"] if os.path.basename(c).startswith("nvidia")}
    if seen_nvidia != promised_nvidia:
        v.append(f"/dev/nvidia* in the container {sorted(seen_nvidia)} != promised {sorted(promised_nvidia)}")
    return v


def explain(node: Node, policy: str, limits: dict[str, int], held: dict[str, list[str]]) -> dict[str, Any]:
    """`topo-device-plugin explain` for one pod on the node with `held` devices in use (JSON)."""
    from kubelet_testlib import cli_json

    args = ["explain", "--simulate", str(node.node_file), "--device-id-strategy", "index", "--policy", policy]
    for res, n in limits.items():
        args += ["--request", f"{res}={n}"]
    for res, ids in sorted(held.items()):
        if ids:
            args += ["--allocated", f"{res}={','.join(sorted(ids))}"]
    return cli_json(*args)


def held_devices(pr: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in pr.get("pods") or []:
        if p.get("namespace", "default") != "default":
            continue
        for ctr in p.get("containers") or []:
            for res, ids in (ctr.get("devices") or {}).items():
                out.setdefault(res, []).extend(ids)
    return out


class StageTimes(dict[str, float]):
    """Wall time of each named stage of a module's cluster run, printed at its end (timings are reported,
    never asserted). `with times.stage("name"):` records the stage, failed or not."""

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self[name] = time.monotonic() - t0



class AllocatableGap:
    """How long the kubelet lists none of `resource` while a rollout replaces the daemon pod: sampled from
    pod-resources GetAllocatableResources (the kubelet's own view, not the Node status it posts every few
    seconds) in a thread, reported, never asserted. `with AllocatableGap(c, GPU) as gap: ...; gap.zero_s`."""

    def __init__(self, c: Cluster, resource: str, every_s: float = 0.2):
        self.c, self.resource, self.every_s = c, resource, every_s
        self.zero_s = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="allocatable-gap", daemon=True)

    def _run(self) -> None:
        zero_since: float | None = None
        while not self._stop.is_set():
            try:
                listed = self.c.podresources()["allocatable"].get(self.resource) or []
            except Exception:  # noqa: BLE001 - a failed sample is skipped: this is a measurement
                listed = None
            now = time.monotonic()
            if listed is not None:
                self.samples += 1
                if not listed and zero_since is None:
                    zero_since = now
                elif listed and zero_since is not None:
                    self.zero_s += now - zero_since
                    zero_since = None
            self._stop.wait(self.every_s)
        if zero_since is not None:
            self.zero_s += time.monotonic() - zero_since

    def __enter__(self) -> AllocatableGap:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
