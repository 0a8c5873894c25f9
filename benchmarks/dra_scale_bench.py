"""DRA at cluster scale (issue 24): how fast a real kube-scheduler places DRA pods on our ResourceSlices.

A private control plane (etcd, kube-apiserver, kube-scheduler of tests/e2e/cluster/cluster_build.py's
`controlplane()` build, certificates from tests/e2e/cluster/pki.py) on free 127.0.0.1 ports in a temp
dir; no kubelet and no controller manager. The scheduler places pods on fake Node objects created
Ready (the TaintNodesByCondition admission plugin is off, so no `not-ready` taint that only the node
controller would remove); each node gets the ResourceSlices our driver would publish for a built-in
topology (plugin/dra/slices/build.py, node name set), or the *minimal* layout: GPUs only, with the
attributes NVIDIA's DRA driver publishes (type, index, uuid, productName, brand, architecture,
cudaComputeCapability, cudaDriverVersion, driverVersion, pciBusID, pcieRoot; capacity memory).

Per case (topology × layout × claim shape) a namespace, on fake nodes and slices kept from the previous case where
they match (`fleet`); one ResourceClaim per pod, created before the pods; the pods are created while the
scheduler is stopped (SIGSTOP, then SIGCONT), so the bench's own create rate does not cap what is
measured; pods/s counted from the first to the last binding seen on a watch.
Also: slice bytes per node (JSON), kube-apiserver RSS after the case (it grows over the cases of one
run: `--memory` gives per-layout figures), kube-scheduler CPU per pod (utime+stime from
/proc/<pid>/stat, from the scheduler's resume to the last binding).

The scheduler's client rate limit is raised as upstream's scheduler_perf does (`--scheduler-qps`,
default 5000); `--scheduler-qps 50` is kube-scheduler's default (see docs/dra.md).

Layout variants (`--layouts`): `ours-gpus` (GPUs only, as with `--dra-resources nvidia.com/gpu`),
`ours-lean-nics` (NICs with only the attributes claims pair on), `ours-gpus-first-split` (GPUs and
NICs in two slices of one pool). `--repeat N` runs each case N times and prints medians as ratios.
`--memory` instead starts a fresh control plane per topology and layout and reports the API server's
RSS growth for the nodes and their slices.

`--churn` instead measures the slice publisher (plugin/dra/slices/publisher.py) against the real API server:
one GPU flapping healthy/unhealthy every 100 ms for 5 s, with and without coalescing.

Usage: python benchmarks/dra_scale_bench.py [--nodes 100] [--topologies dgx-h100,...] [--shapes ...]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "e2e" / "cluster")]

import aiohttp
from pki import PKI

from allocator.topology import DeviceKind, NodeTopology
from plugin.dra.slices.build import ATTR_PCI_BUS_ID, ATTR_PCIE_ROOT, SliceOptions, build_resource_slices
from plugin.sources.simulated import load_simulated

DRIVER = "topo.dev"
SHAPES = ("gpu1", "gpu-all", "gpu4", "gpu4-nvlink", "pairs", "pairs-switch", "pairs-root")
SHAPE_TEXT = {
    "gpu1": "1 GPU", "gpu-all": "all GPUs of a node", "gpu4": "4 GPUs (any)", "gpu4-nvlink": "4 GPUs, one nvlinkDomain",
    "pairs": "2×(GPU+NIC), unconstrained", "pairs-switch": "2×(GPU+NIC), each pair on one pcieSwitch",
    "pairs-root": "2×(GPU+NIC), each pair on one pcieRoot",
}
PAIR_ATTR = {"pairs-switch": f"{DRIVER}/pcieSwitch", "pairs-root": ATTR_PCIE_ROOT}
ARCH = {"H100": ("Hopper", "9.0"), "A100": ("Ampere", "8.0"), "L40S": ("Ada Lovelace", "8.9")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- slices ------------------------------------------------------------------------------------------
def our_slices(topo: NodeTopology, node: str, layout: str) -> list[dict[str, Any]]:
    if layout == "ours-gpus":
        # What the driver publishes with only GPUs served through DRA (`--dra-resources nvidia.com/gpu`).
        return build_resource_slices(topo, SliceOptions(node_name=node, include=lambda d: d.kind == DeviceKind.GPU))
    slices = build_resource_slices(topo, SliceOptions(node_name=node))
    if layout == "ours-lean-nics":
        # Variant: NICs keep only what claims pair on (type, pcieSwitch, pcieRoot, numaNode). The scheduler
        # converts a device's whole attribute map for every selector it evaluates on it, and on a node whose
        # GPUs are taken every free NIC is evaluated for a GPU request: does the NICs' attribute count matter?
        keep = {"type", "pcieSwitch", "nvlinkDomain", "complex", ATTR_PCIE_ROOT, "resource.kubernetes.io/numaNode"}
        for d in slices[0]["spec"].get("devices", ()):
            if d["attributes"]["type"]["string"] == "nic":
                d["attributes"] = {k: v for k, v in d["attributes"].items() if k in keep}
        return slices
    if layout == "ours-gpus-first-split":
        # Variant: GPUs and NICs in two slices of one pool (does a smaller slice per request kind help?).
        devs = slices[0]["spec"]["devices"]
        gpus = [d for d in devs if d["attributes"]["type"]["string"] == "gpu"]
        nics = [d for d in devs if d["attributes"]["type"]["string"] != "gpu"]
        out = []
        for i, chunk in enumerate((gpus, nics)):
            s = copy.deepcopy(slices[0])
            s["metadata"]["name"] = f"{node}-{DRIVER}-{i}"
            s["spec"]["devices"] = chunk
            s["spec"]["pool"]["resourceSliceCount"] = 2
            out.append(s)
        return out
    return slices


def minimal_slices(topo: NodeTopology, node: str) -> list[dict[str, Any]]:
    """GPUs only, attributes as NVIDIA's DRA driver publishes them (research/landscape-2026.md)."""
    ours = build_resource_slices(topo, SliceOptions(node_name=node))[0]
    devices = []
    for d in ours["spec"]["devices"]:
        a = d["attributes"]
        if a["type"]["string"] != "gpu":
            continue
        model = a.get("model", {}).get("string", "NVIDIA GPU")
        arch, cc = next((v for k, v in ARCH.items() if k in model), ("Hopper", "9.0"))
        attrs = {"type": {"string": "gpu"}, "index": a["index"], "uuid": a["uuid"], "productName": {"string": model},
                 "brand": {"string": "Nvidia"}, "architecture": {"string": arch},
                 "cudaComputeCapability": {"version": cc + ".0"}, "cudaDriverVersion": {"version": "12.8.0"},
                 "driverVersion": {"version": "570.148.8"}}
        for k in (ATTR_PCI_BUS_ID, ATTR_PCIE_ROOT):
            if k in a:
                attrs[k] = a[k]
        devices.append({"name": d["name"], "attributes": attrs, "capacity": d.get("capacity", {})})
    out = copy.deepcopy(ours)
    out["spec"]["devices"] = devices
    return [out]


def slices_for(topo: NodeTopology, node: str, layout: str) -> list[dict[str, Any]]:
    return minimal_slices(topo, node) if layout == "minimal" else our_slices(topo, node, layout)


def per_node_capacity(slices: list[dict[str, Any]], shape: str) -> int:
    """How many claims of `shape` one node can hold (0: the shape cannot be met on this layout)."""
    devs = [d for s in slices for d in s["spec"].get("devices", ())]
    gpus = [d for d in devs if d["attributes"]["type"]["string"] == "gpu"]
    nics = [d for d in devs if d["attributes"]["type"]["string"] == "nic"]
    if shape == "gpu1":
        return len(gpus)
    if shape == "gpu-all":
        return 1 if gpus else 0
    if shape == "gpu4":
        return len(gpus) // 4
    if shape == "gpu4-nvlink":
        domains: dict[str, int] = {}
        for g in gpus:
            v = g["attributes"].get("nvlinkDomain", {}).get("string")
            if v:
                domains[v] = domains.get(v, 0) + 1
        return sum(n // 4 for n in domains.values())
    if shape == "pairs":
        return min(len(gpus), len(nics)) // 2
    key = PAIR_ATTR[shape]
    attr = key.split("/", 1)[1] if key.startswith(DRIVER + "/") else key

    def count(ds: list[dict[str, Any]]) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in ds:
            v = d["attributes"].get(attr, {}).get("string")
            if v:
                out[v] = out.get(v, 0) + 1
        return out

    g, n = count(gpus), count(nics)
    return sum(min(g[v], n.get(v, 0)) for v in g) // 2


def claim(name: str, shape: str, n_gpus: int) -> dict[str, Any]:
    def req(rname: str, kind: str, count: int) -> dict[str, Any]:
        return {"name": rname, "exactly": {
            "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": count,
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].type == "{kind}"'}}]}}

    constraints: list[dict[str, Any]] = []
    if shape == "gpu1":
        requests = [req("gpu", "gpu", 1)]
    elif shape == "gpu-all":
        requests = [req("gpu", "gpu", n_gpus)]
    elif shape in ("gpu4", "gpu4-nvlink"):
        requests = [req("gpu", "gpu", 4)]
        if shape == "gpu4-nvlink":
            constraints = [{"requests": ["gpu"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}]
    else:
        requests = [req("gpu-a", "gpu", 1), req("nic-a", "nic", 1), req("gpu-b", "gpu", 1), req("nic-b", "nic", 1)]
        if shape in PAIR_ATTR:
            constraints = [{"requests": ["gpu-a", "nic-a"], "matchAttribute": PAIR_ATTR[shape]},
                           {"requests": ["gpu-b", "nic-b"], "matchAttribute": PAIR_ATTR[shape]}]
    spec: dict[str, Any] = {"devices": {"requests": requests}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec}


def pod(name: str, claim_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "devs"}]}}],
                     "resourceClaims": [{"name": "devs", "resourceClaimName": claim_name}],
                     "terminationGracePeriodSeconds": 0}}


def node_obj(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "bench": "dra-scale"}},
            "status": {"capacity": {"cpu": "128", "memory": "2Ti", "pods": "110"},
                       "allocatable": {"cpu": "128", "memory": "2Ti", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Bench",
                                       "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}


# -- processes ---------------------------------------------------------------------------------------
def cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class ControlPlane:
    def __init__(self, bins: pathlib.Path, work: pathlib.Path, qps: int):
        self.bins, self.w, self.qps = bins, work, qps
        self.procs: dict[str, subprocess.Popen] = {}
        self.fleet: tuple[int, str, str] | None = None  # (nodes, topology, layout) now in the API (see `fleet`)
        self.api_port, self.etcd_port, self.peer_port, self.sched_port = (free_port() for _ in range(4))
        self.url = f"https://127.0.0.1:{self.api_port}"

    def spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.w / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    async def up(self) -> None:
        p = PKI(self.w / "pki")
        p.make_ca()
        serving = p.issue("apiserver", "kube-apiserver", server_sans=["IP:127.0.0.1", "DNS:localhost"])
        self.admin = p.issue("admin", "dra-bench-admin", "system:masters")
        self.ca = p.ca_cert
        sched = p.kubeconfig(p.issue("scheduler", "system:kube-scheduler"), self.url)
        self.admin_kubeconfig = p.kubeconfig(self.admin, self.url)
        b = lambda n: str(self.bins / n)  # noqa: E731 (a one-line shorthand)
        self.spawn("etcd", [b("etcd"), "--name", "bench", "--data-dir", str(self.w / "etcd"),
                            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                            "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
                            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
                            "--initial-cluster", f"bench=http://127.0.0.1:{self.peer_port}",
                            "--unsafe-no-fsync", "--log-level", "warn"])
        self.spawn("kube-apiserver", [
            b("kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", f"--secure-port={self.api_port}", "--advertise-address=127.0.0.1",
            f"--cert-dir={self.w / 'apiserver'}", f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}", f"--client-ca-file={p.ca_cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p.sa_pub}", f"--service-account-signing-key-file={p.sa_key}",
            "--service-cluster-ip-range=10.96.0.0/24", "--authorization-mode=Node,RBAC",
            # No node controller here: nodes must not get the not-ready taint; no service-account controller.
            "--disable-admission-plugins=TaintNodesByCondition,ServiceAccount",
            "--endpoint-reconciler-type=none", "--profiling=false", "--v=0"])
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl(), limit=64))
        await self.wait("the API server's /readyz", lambda: self.ok("/readyz"), "kube-apiserver")
        cfg = self.w / "scheduler.yaml"
        cfg.write_text("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
                       f"clientConnection: {{kubeconfig: {sched}, qps: {self.qps}, burst: {self.qps}}}\n"
                       "leaderElection: {leaderElect: false}\n")
        self.spawn("kube-scheduler", [b("kube-scheduler"), f"--config={cfg}", f"--authentication-kubeconfig={sched}",
                                      f"--authorization-kubeconfig={sched}", "--bind-address=127.0.0.1",
                                      f"--secure-port={self.sched_port}", "--profiling=false", "--v=0"])
        await self.req("POST", "/apis/resource.k8s.io/v1/deviceclasses", {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}})

    def ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.load_cert_chain(str(self.admin.cert), str(self.admin.key))
        return ctx

    async def ok(self, path: str) -> bool:
        try:
            async with self.session.get(self.url + path) as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    async def wait(self, what: str, check: Callable[[], Any], proc: str, timeout: float = 300) -> None:
        end = time.monotonic() + timeout
        while not await check():
            if self.procs[proc].poll() is not None:
                raise RuntimeError(f"{proc} exited; see {self.w / (proc + '.log')}")
            if time.monotonic() > end:
                raise TimeoutError(what)
            await asyncio.sleep(0.3)

    async def req(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201, 202),
                  ctype: str = "application/json") -> Any:
        for attempt in range(20):
            async with self.session.request(method, self.url + path, data=None if body is None else json.dumps(body),
                                            headers={"Content-Type": ctype}) as r:
                text = await r.text()
                if r.status in ok or (method == "DELETE" and r.status == 404):
                    return json.loads(text) if text else None
                if r.status == 429 or r.status >= 500:
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                raise RuntimeError(f"{method} {path}: {r.status} {text[:300]}")
        raise RuntimeError(f"{method} {path}: gave up")

    async def many(self, calls: list[tuple], width: int = 32) -> None:
        sem = asyncio.Semaphore(width)

        async def one(c: tuple) -> None:
            async with sem:
                await self.req(*c)

        await asyncio.gather(*(one(c) for c in calls))

    async def down(self) -> None:
        await self.session.close()
        for name in ("kube-scheduler", "kube-apiserver", "etcd"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a scheduler stopped mid-case handles no SIGTERM
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


# -- one case ----------------------------------------------------------------------------------------
@dataclass
class Result:
    topology: str
    layout: str
    shape: str
    nodes: int
    pods: int
    bound: int
    pods_per_s: float
    sched_cpu_ms_per_pod: float
    slice_bytes: int
    apiserver_rss_mib: float
    create_per_s: float
    load: float


async def run_case(cp: ControlPlane, case: int, topology: str, layout: str, shape: str, nodes: int,
                   pods_per_node: int, max_pods: int = 0) -> Result | None:
    topo = load_simulated(topology)
    sample = slices_for(topo, "sample", layout)
    cap = per_node_capacity(sample, shape)
    if cap == 0:
        return None
    n_gpus = sum(1 for s in sample for d in s["spec"].get("devices", ()) if d["attributes"]["type"]["string"] == "gpu")
    ns = f"bench-{case}"
    names = await fleet(cp, topo, topology, layout, nodes)
    slice_bytes = len(json.dumps(slices_for(topo, names[0], layout), separators=(",", ":")))
    await cp.req("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    n_pods = min(nodes * min(pods_per_node, cap), max_pods or nodes * cap)
    claims = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
    await cp.many([("POST", claims, claim(f"claim-{i}", shape, n_gpus)) for i in range(n_pods)])
    await asyncio.sleep(3 + nodes / 250)  # let the scheduler's informers take in nodes, slices and claims
    pid = cp.pid("kube-scheduler")
    bound: dict[str, float] = {}
    listed = await cp.req("GET", f"/api/v1/namespaces/{ns}/pods")
    rv = listed["metadata"]["resourceVersion"]
    done = asyncio.Event()

    async def watch() -> None:
        url = f"{cp.url}/api/v1/namespaces/{ns}/pods?watch=1&resourceVersion={rv}&timeoutSeconds=600"
        async with cp.session.get(url, timeout=aiohttp.ClientTimeout(total=None)) as r:
            async for line in r.content:
                ev = json.loads(line)
                obj = ev.get("object", {})
                name = obj.get("metadata", {}).get("name")
                if obj.get("spec", {}).get("nodeName") and name not in bound:
                    bound[name] = time.monotonic()
                    if len(bound) == n_pods:
                        done.set()
                        return

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.2)
    # The scheduler is paused while the pods are created, so what is measured is its rate, not ours.
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        await cp.many([("POST", f"/api/v1/namespaces/{ns}/pods", pod(f"p-{i}", f"claim-{i}")) for i in range(n_pods)])
    finally:
        created = time.monotonic() - t0
        cpu0 = cpu_s(pid)
        os.kill(pid, signal.SIGCONT)
    last_progress, seen = time.monotonic(), 0
    while not done.is_set():  # until all bound, or no binding for 30 s (unschedulable)
        await asyncio.sleep(0.25)
        if len(bound) != seen:
            seen, last_progress = len(bound), time.monotonic()
        elif time.monotonic() - last_progress > 30:
            break
    cpu1 = cpu_s(pid)
    watcher.cancel()
    times = sorted(bound.values())
    span = times[-1] - times[0] if len(times) > 1 else float("nan")
    cpu_per_pod = (cpu1 - cpu0) / max(1, len(bound)) * 1000
    rss = rss_mib(cp.pid("kube-apiserver"))
    res = Result(topology, layout, shape, nodes, n_pods, len(bound), (len(times) - 1) / span if span else 0.0,
                 cpu_per_pod, slice_bytes, rss, n_pods / created, os.getloadavg()[0])
    await cleanup(cp, ns, n_pods)
    return res


async def fleet(cp: ControlPlane, topo: NodeTopology, topology: str, layout: str, nodes: int) -> list[str]:
    """The fake nodes and their slices for a case, kept from the previous case where they match.

    Creating and deleting 1,000 nodes and their slices for every case cost more than the case itself on
    the 2-core VM; the nodes depend only on their count and the slices on topology and layout, so a case
    that follows one with the same count keeps the nodes, and one with the same layout keeps the slices
    too (the previous case's pods and claims are gone by then: the devices are free again)."""
    names = [f"n{i:04d}" for i in range(nodes)]
    if cp.fleet == (nodes, topology, layout):
        return names
    if cp.fleet is not None:
        # One delete-collection request for every slice of our driver.
        await cp.req("DELETE", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3D{DRIVER}")
        if cp.fleet[0] != nodes:
            await cp.req("DELETE", "/api/v1/nodes?labelSelector=bench%3Ddra-scale")
    if cp.fleet is None or cp.fleet[0] != nodes:
        await cp.many([("POST", "/api/v1/nodes", node_obj(n)) for n in names])
    await cp.many([("POST", "/apis/resource.k8s.io/v1/resourceslices", s) for n in names
                   for s in slices_for(topo, n, layout)])
    cp.fleet = (nodes, topology, layout)
    return names


async def cleanup(cp: ControlPlane, ns: str, n_pods: int) -> None:
    """Pods (no kubelet: gone at once with grace 0) and claims (the scheduler's finalizer is ours to drop
    without a controller manager); the nodes and slices stay for the next case (`fleet`)."""
    await cp.req("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")
    await cp.req("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")
    await cp.many([("PATCH", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/claim-{i}",
                    {"metadata": {"finalizers": None}}, (200, 404), "application/merge-patch+json")
                   for i in range(n_pods)])


# -- memory: what a layout's slices cost the API server ---------------------------------------------
async def heap_mib(cp: ControlPlane) -> float:
    async with cp.session.get(cp.url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith("go_memstats_heap_inuse_bytes "):
                return float(line.split()[1]) / 2**20
    return float("nan")


async def memory_case(bins: pathlib.Path, qps: int, topology: str, layout: str, nodes: int) -> dict[str, float]:
    """A fresh control plane; the API server's RSS and Go heap in use before and after `nodes` nodes with
    their slices (the scheduler's informers hold them too, which is the same for every layout)."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="dra-scale-mem-"))
    cp = ControlPlane(bins, work, qps)
    try:
        await cp.up()
        await asyncio.sleep(5)
        pid = cp.pid("kube-apiserver")
        rss0, heap0 = rss_mib(pid), await heap_mib(cp)
        topo = load_simulated(topology)
        names = [f"m-n{i:04d}" for i in range(nodes)]
        await cp.many([("POST", "/api/v1/nodes", node_obj(n)) for n in names])
        slices = [s for n in names for s in slices_for(topo, n, layout)]
        await cp.many([("POST", "/apis/resource.k8s.io/v1/resourceslices", s) for s in slices])
        await asyncio.sleep(5)
        return {"rss": rss_mib(pid) - rss0, "heap": await heap_mib(cp) - heap0,
                "bytes": len(json.dumps(slices_for(topo, names[0], layout), separators=(",", ":"))),
                "load": os.getloadavg()[0]}
    finally:
        await cp.down()


# -- churn: the publisher against the real API server ------------------------------------------------
async def churn(cp: ControlPlane, min_interval_s: float, seconds: float = 5.0) -> dict[str, float]:
    from plugin.kube.client import kubeconfig_api
    from plugin.dra.slices.publisher import SlicePublisher

    node = f"churn-{int(min_interval_s * 1000)}"
    await cp.req("POST", "/api/v1/nodes", node_obj(node))
    api = await kubeconfig_api(str(cp.admin_kubeconfig))
    writes = 0

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(api, name)

        async def replace_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
            nonlocal writes
            writes += 1
            return await api.replace_slice(obj)

        async def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
            nonlocal writes
            writes += 1
            return await api.create_slice(obj)

    topo = load_simulated("dgx-h100")
    pub = SlicePublisher(Counting(), SliceOptions(node_name=node), resync_s=3600, min_interval_s=min_interval_s)
    pub.start(topo)
    try:
        while not pub.successes:
            await asyncio.sleep(0.05)
        before, passes0, t0, flaps = writes, pub.passes, time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            flaps += 1
            pub.update(topo.with_health({"GPU3": "Unhealthy"}) if flaps % 2 else topo)
            await asyncio.sleep(0.1)
        final = topo.with_health({"GPU3": "Unhealthy", "GPU5": "Unhealthy"})
        pub.update(final)
        last_change = time.monotonic()
        burst = last_change - t0

        async def published() -> bool:
            found = await api.list_slices(node, DRIVER)
            return any(d["name"] == "gpu-5" and d.get("taints") for s in found for d in s["spec"].get("devices", ()))

        while not await published():
            await asyncio.sleep(0.02)
        lag = time.monotonic() - last_change
        return {"flaps": flaps + 1, "writes": writes - before, "per_s": (writes - before) / burst, "final_s": lag,
                "passes": pub.passes - passes0}
    finally:
        await pub.stop(delete=True)
        await api.close()


def print_ratios(results: list[Result]) -> None:
    """Medians per case, then the issue's goals as ratios: ours vs minimal, pairing vs unconstrained."""
    from statistics import median

    groups: dict[tuple, list[Result]] = {}
    for r in results:
        groups.setdefault((r.nodes, r.topology, r.layout, r.shape), []).append(r)
    med = {k: (median(x.pods_per_s for x in v), median(x.sched_cpu_ms_per_pod for x in v)) for k, v in groups.items()}
    print("\n| nodes | topology | claim | layout vs | pods/s ratio | sched CPU/pod ratio |")
    print("|---|---|---|---|---|---|")
    for (nodes, topo, layout, shape), (pps, cpu) in med.items():
        if layout != "minimal" and (nodes, topo, "minimal", shape) in med:
            mp, mc = med[(nodes, topo, "minimal", shape)]
            print(f"| {nodes} | {topo} | {SHAPE_TEXT[shape]} | {layout} / minimal | {pps / mp:.2f} | {cpu / mc:.2f} |")
        base = {"pairs-switch": "pairs", "pairs-root": "pairs", "gpu4-nvlink": "gpu4"}.get(shape)
        if base and (nodes, topo, layout, base) in med:
            bp, bc = med[(nodes, topo, layout, base)]
            print(f"| {nodes} | {topo} | {SHAPE_TEXT[shape]} | {layout}: vs {SHAPE_TEXT[base]} | {pps / bp:.2f} "
                  f"| {cpu / bc:.2f} |")


# -- main --------------------------------------------------------------------------------------------
def controlplane_bins() -> pathlib.Path:
    xdg = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
    cache = xdg / "topo-device-plugin" / "bin"
    found = sorted(cache.glob("controlplane-*"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"no control plane under {cache}: build it with tests/e2e/cluster/cluster_build.py")
    return found[-1]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="100", help="node counts, comma-separated (the issue's: 100,500,1000)")
    ap.add_argument("--topologies", default="dgx-h100,dgx-a100,pcie-2socket-4gpu-2nic")
    ap.add_argument("--layouts", default="ours,minimal",
                    help="ours, minimal, ours-gpus (GPUs only), ours-lean-nics, ours-gpus-first-split")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--pods-per-node", type=int, default=1)
    ap.add_argument("--max-pods", type=int, default=0,
                    help="at most this many pods per case (0: pods-per-node on every node); fills fewer nodes")
    ap.add_argument("--scheduler-qps", type=int, default=5000, help="kube-scheduler's default is 50")
    ap.add_argument("--repeat", type=int, default=1, help="runs per case (medians in the ratio table)")
    ap.add_argument("--memory", action="store_true",
                    help="API server memory per layout instead (a fresh control plane per topology and layout)")
    ap.add_argument("--churn", action="store_true", help="measure the slice publisher under a flapping GPU instead")
    ap.add_argument("--bins", default=None, help="control-plane binaries (default: the newest cached build)")
    o = ap.parse_args()
    bins = pathlib.Path(o.bins) if o.bins else controlplane_bins()
    if o.memory:
        print(f"control plane: {bins.name}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
        print("| nodes | topology | layout | slice bytes/node | apiserver RSS growth MiB "
              "| Go heap in use growth MiB | load |")
        print("|---|---|---|---|---|---|---|")
        for nodes in (int(x) for x in o.nodes.split(",")):
            for topology in o.topologies.split(","):
                for layout in o.layouts.split(","):
                    m = await memory_case(bins, o.scheduler_qps, topology, layout, nodes)
                    print(f"| {nodes} | {topology} | {layout} | {m['bytes']} | {m['rss']:.1f} | {m['heap']:.1f} "
                          f"| {m['load']:.1f} |", flush=True)
        return
    work = pathlib.Path(tempfile.mkdtemp(prefix="dra-scale-"))
    cp = ControlPlane(bins, work, o.scheduler_qps)
    print(f"control plane: {bins.name}; scheduler QPS {o.scheduler_qps}; {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    try:
        await cp.up()
        if o.churn:
            print("| coalescing | flaps in 5 s | passes (one list each) | slice writes | writes/s "
                  "| final state in the API after |")
            print("|---|---|---|---|---|---|")
            for interval in (0.0, 1.0):
                r = await churn(cp, interval)
                label = "off" if not interval else f"{interval:g} s"
                print(f"| {label} | {r['flaps']} | {r['passes']} | {r['writes']} | "
                      f"{r['per_s']:.1f} | {r['final_s']:.2f} s |", flush=True)
            return
        print("| nodes | topology | layout | claim | pods | bound | pods/s | sched CPU ms/pod | slice bytes/node "
              "| apiserver RSS MiB | creates/s | load |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        case = 0
        results: list[Result] = []
        for nodes in (int(x) for x in o.nodes.split(",")):
            for topology in o.topologies.split(","):
                for shape in o.shapes.split(","):
                    for _ in range(o.repeat):
                        # The layouts of one shape back to back: the machine's load drifts less between them.
                        for layout in o.layouts.split(","):
                            case += 1
                            r = await run_case(cp, case, topology, layout, shape, nodes, o.pods_per_node, o.max_pods)
                            if r is None:
                                continue
                            results.append(r)
                            print(f"| {r.nodes} | {r.topology} | {r.layout} | {SHAPE_TEXT[r.shape]} | {r.pods} "
                                  f"| {r.bound} | {r.pods_per_s:.1f} | {r.sched_cpu_ms_per_pod:.1f} | {r.slice_bytes} "
                                  f"| {r.apiserver_rss_mib:.0f} | {r.create_per_s:.0f} | {r.load:.1f} |", flush=True)
        print_ratios(results)
    finally:
        await cp.down()
        print(f"(work dir {work}: logs kept)", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
