"""NodeResourceTopology at cluster scale (issue 32): object bytes, scheduling rate, writes under churn.

A private control plane (etcd, kube-apiserver and the default kube-scheduler of
benchmarks/dra_scale_bench.py's `ControlPlane`, from tests/e2e/cluster/cluster_build.py's build) plus
kubernetes-sigs/scheduler-plugins' scheduler with NodeResourceTopologyMatch as a second scheduler
(tests/e2e/cluster/topo_scheduler.py: the same binary, configuration and RBAC as the e2e tests), with
the chart's NRT CRD. No kubelet: the nodes are fake Node objects (Ready, allocatable GPUs and NICs in
their status), each with the NodeResourceTopology object our publisher would write for a built-in
simulated topology (plugin/nrt/build.py, policy `single-numa-node`, scope `container`).

Scheduling, per topology and scheduler, same nodes: the default kube-scheduler; the topology-aware binary's
second profile with the default plugins only (a control: same build, no NRT plugin); its
`topo-aware-scheduler` profile with NodeResourceTopologyMatch (LeastNUMANodes). Pods
asking one NUMA zone's worth of GPUs and NICs (dgx-h100: 4 GPUs + 4 NICs; pcie-2socket-4gpu-2nic:
2 GPUs + 1 NIC), as many as the *aligned* capacity of the nodes. A share of the nodes (`--fragmented`)
publish one GPU held in every zone (a pod the API server does not know holds it, or a stale count): by
count they still fit two such pods, but no zone can give one aligned, so the kubelet would reject a pod
bound there with TopologyAffinityError (they are every 4th node by name at 0.25, not the last ones: a
scheduler that walks nodes in order meets them as often as the others). Printed per case: pods bound, how many on a fragmented node,
pods/s (first to last binding seen on a watch; the pods are created while that scheduler is stopped with
SIGSTOP, so the bench's own create rate caps nothing), and the scheduler's CPU per pod
(utime+stime from /proc/<pid>/stat, from its resume to the last binding). Pods stay bound (no kubelet).

Churn (`--churn-nodes`, default 100): one NrtWriter (plugin/nrt/writer.py, the daemon's own) per node
against the real API server, through one shared client, each node's held GPUs changing in bursts
(1-8 changes 0-50 ms apart, then 0-1.5 s quiet, as benchmarks/nrt_writer_bench.py does for one node);
printed: changes and writes per node per second, the API server's own PUT count for the resource,
its CPU, and how long after the last change every node's final state was in the API server.

A table to read, not a test: nothing here passes or fails.

    python benchmarks/nrt_scale_bench.py --nodes 100
    python benchmarks/nrt_scale_bench.py --nodes 1000 --topologies dgx-h100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE), str(ROOT / "tests" / "e2e" / "cluster")]

import aiohttp
import dra_scale_bench as drb
import topo_scheduler as ts
from pki import PKI

from allocator.topology import DeviceKind
from plugin.kube.client import KubeApi, kubeconfig_api
from plugin.model.resources import ResourceOptions, build_resources
from plugin.nrt.api import PLURAL, LightkubeNrtApi
from plugin.nrt.build import API_VERSION, PublishedResource, TopologyManagerSettings, build_nrt, published_resources
from plugin.nrt.writer import NrtWriter
from plugin.sources.simulated import load_simulated

NRT_PATH = f"/apis/{API_VERSION}/{PLURAL}"
SETTINGS = TopologyManagerSettings("single-numa-node", "container", "bench")
LABEL = "nrt-scale"
#: The topology-aware binary's second profile: default plugins only (the control).
CONTROL = "topo-binary-default-plugins"


@dataclass(frozen=True)
class Fleet:
    """One topology's node shape: its published resources and the pod shape that fills one zone."""

    topology: str
    resources: tuple[PublishedResource, ...]
    #: resource -> per-pod count (one NUMA zone's worth)
    pod: dict[str, int]
    #: aligned pods one clean node holds (its zones)
    per_node: int
    #: resource -> the node's total (its status.allocatable)
    totals: dict[str, int]


def fleet_shape(topology: str) -> Fleet:
    topo = load_simulated(topology)
    resources = published_resources(build_resources(topo, ResourceOptions()))
    served = [r for r in resources if r.kind in (DeviceKind.GPU, DeviceKind.NIC)]
    zones = sorted({d.numa for r in served for d in r.devices if d.numa is not None})
    per_zone = {r.name: min(sum(1 for d in r.devices if d.numa == z) for z in zones) for r in served}
    return Fleet(topology, resources, {k: v for k, v in per_zone.items() if v}, len(zones),
                 {r.name: len(r.devices) for r in resources})


def held_fragmented(f: Fleet) -> set[tuple[str, str]]:
    """One GPU held in every zone: count still fits, no zone aligns a pod of a zone's worth."""
    gpu = next(r for r in f.resources if r.kind == DeviceKind.GPU)
    out, seen = set(), set()
    for d in gpu.devices:
        if d.numa not in seen:
            seen.add(d.numa)
            out.add((gpu.name, d.id))
    return out


def node_obj(name: str, f: Fleet) -> dict[str, Any]:
    obj = drb.node_obj(name)
    obj["metadata"]["labels"]["bench"] = LABEL
    for key in ("capacity", "allocatable"):
        obj["status"][key].update({k: str(v) for k, v in f.totals.items()})
    return obj


def pod(name: str, f: Fleet, scheduler: str) -> dict[str, Any]:
    limits = {k: str(v) for k, v in f.pod.items()}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"limits": limits}}]}}


class NrtControlPlane(drb.ControlPlane):
    """dra_scale_bench's control plane, plus the NRT CRD and the topology-aware scheduler."""

    def __init__(self, bins: pathlib.Path, work: pathlib.Path, qps: int, topo_binary: pathlib.Path):
        super().__init__(bins, work, qps)
        self.topo_binary = topo_binary
        self.topo_options = ts.TopoSchedulerOptions(qps=qps, port=drb.free_port(), verbosity=0)
        self.fleet_of: tuple[str, int, float] | None = None
        self.uids: dict[str, str] = {}

    async def up(self) -> None:
        await super().up()
        await self.req("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", ts.crd())
        await self.wait("the NRT CRD served", lambda: self.ok(NRT_PATH), "kube-apiserver", 120)
        for obj in ts.rbac_objects():
            kind = obj["kind"].lower() + "s"
            ns = obj["metadata"].get("namespace")
            path = f"/apis/rbac.authorization.k8s.io/v1/{'namespaces/' + ns + '/' if ns else ''}{kind}"
            await self.req("POST", path, obj)
        p = PKI(self.w / "pki")
        kubeconfig = p.kubeconfig(p.issue("topo-scheduler", ts.USER), self.url)
        cfg = self.w / "topo-scheduler.json"
        config = json.loads(ts.scheduler_config(kubeconfig, self.topo_options))
        # A control: the same binary with kube-scheduler's default plugins only, so the table separates
        # what the plugin costs from what the build (its version, its flags) costs.
        config["profiles"].append({"schedulerName": CONTROL})
        cfg.write_text(json.dumps(config, indent=1))
        self.spawn("topo-scheduler", ts.argv(self.topo_binary, cfg, kubeconfig, self.topo_options))

        async def healthy() -> bool:
            try:
                async with self.session.get(f"https://127.0.0.1:{self.topo_options.port}/healthz", ssl=False) as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await self.wait("the topology-aware scheduler's /healthz", healthy, "topo-scheduler", 120)

    async def down(self) -> None:
        proc = self.procs.get("topo-scheduler")
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        await super().down()

    async def make_fleet(self, f: Fleet, nodes: int, fragmented: float) -> tuple[list[str], set[str]]:
        """`nodes` nodes of `f`'s topology with their NRT objects, a share `fragmented` of them fragmented."""
        names = [f"n{i:04d}" for i in range(nodes)]
        # Spread over the names (every 4th at 0.25): a scheduler that walks nodes in name order meets them as
        # often as the others.
        frag = {n for i, n in enumerate(names) if int((i + 1) * fragmented) > int(i * fragmented)}
        if self.fleet_of == (f.topology, nodes, fragmented):
            return names, frag
        if self.fleet_of is not None:
            await self.req("DELETE", f"{NRT_PATH}?labelSelector=app.kubernetes.io%2Fmanaged-by%3Dtopo-device-plugin")
            await self.req("DELETE", f"/api/v1/nodes?labelSelector=bench%3D{LABEL}")
            await self.wait("the old nodes gone", lambda: self.none_left(), "kube-apiserver", 300)
        sem = asyncio.Semaphore(32)

        async def one(n: str) -> None:
            async with sem:
                created = await self.req("POST", "/api/v1/nodes", node_obj(n, f))
                if not (created.get("status", {}).get("allocatable") or {}).get("nvidia.com/gpu"):
                    # An API server that drops status on create: the status subresource takes it.
                    await self.req("PATCH", f"/api/v1/nodes/{n}/status", {"status": node_obj(n, f)["status"]},
                                   ctype="application/merge-patch+json")
                self.uids[n] = created["metadata"]["uid"]
                held = held_fragmented(f) if n in frag else set()
                await self.req("POST", NRT_PATH, build_nrt(n, load_topology(f.topology), f.resources, held,
                                                           SETTINGS, self.uids[n]))

        await asyncio.gather(*(one(n) for n in names))
        self.fleet_of = (f.topology, nodes, fragmented)
        await asyncio.sleep(3 + nodes / 250)  # the schedulers' informers take in the nodes and objects
        return names, frag

    async def none_left(self) -> bool:
        listed = await self.req("GET", f"/api/v1/nodes?labelSelector=bench%3D{LABEL}&limit=1")
        return not listed.get("items")


_topologies: dict[str, Any] = {}


def load_topology(name: str) -> Any:
    if name not in _topologies:
        _topologies[name] = load_simulated(name)
    return _topologies[name]


@dataclass
class Case:
    topology: str
    scheduler: str
    nodes: int
    fragmented_nodes: int
    pods: int
    bound: int
    on_fragmented: int
    pods_per_s: float
    cpu_ms_per_pod: float
    load: float


async def run_case(cp: NrtControlPlane, case: int, f: Fleet, nodes: int, fragmented: float,
                   scheduler: str, max_pods: int) -> Case:
    names, frag = await cp.make_fleet(f, nodes, fragmented)
    n_pods = (nodes - len(frag)) * f.per_node
    if max_pods:
        n_pods = min(n_pods, max_pods)
    ns = f"bench-{case}"
    await cp.req("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    pid = cp.pid("kube-scheduler" if scheduler == "default-scheduler" else "topo-scheduler")
    bound: dict[str, tuple[float, str]] = {}
    done = asyncio.Event()

    def record(obj: dict[str, Any]) -> None:
        name, node = obj.get("metadata", {}).get("name"), obj.get("spec", {}).get("nodeName")
        if node and name not in bound:
            bound[name] = (time.monotonic(), node)
            if len(bound) == n_pods:
                done.set()

    async def watch() -> None:
        """Bindings as they happen; a watch that ends or breaks is resumed from a fresh list (its
        bindings counted at that moment), so no binding goes uncounted."""
        while not done.is_set():
            listed = await cp.req("GET", f"/api/v1/namespaces/{ns}/pods")
            for obj in listed.get("items", ()):
                record(obj)
            url = (f"{cp.url}/api/v1/namespaces/{ns}/pods?watch=1&allowWatchBookmarks=false"
                   f"&resourceVersion={listed['metadata']['resourceVersion']}&timeoutSeconds=900")
            try:
                async with cp.session.get(url, timeout=aiohttp.ClientTimeout(total=None)) as r:
                    while not done.is_set():
                        line = await r.content.readline()
                        if not line:
                            break
                        record(json.loads(line).get("object", {}))
            except (aiohttp.ClientError, ValueError) as e:
                print(f"(case {case}: the watch broke, {type(e).__name__}: {e}; resumed)", file=sys.stderr, flush=True)

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.2)
    os.kill(pid, signal.SIGSTOP)  # the pods are created while this scheduler is stopped
    try:
        await cp.many([("POST", f"/api/v1/namespaces/{ns}/pods", pod(f"p-{i}", f, scheduler)) for i in range(n_pods)])
    finally:
        cpu0 = drb.cpu_s(pid)
        os.kill(pid, signal.SIGCONT)
    last, seen = time.monotonic(), 0
    while not done.is_set():  # until all bound, or no binding for 30 s
        await asyncio.sleep(0.25)
        if len(bound) != seen:
            seen, last = len(bound), time.monotonic()
        elif time.monotonic() - last > 30:
            break
    cpu1 = drb.cpu_s(pid)
    watcher.cancel()
    times = sorted(t for t, _ in bound.values())
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    result = Case(f.topology, scheduler, nodes, len(frag), n_pods, len(bound),
                  sum(1 for _, n in bound.values() if n in frag), (len(times) - 1) / span if span else 0.0,
                  (cpu1 - cpu0) / max(1, len(bound)) * 1000, os.getloadavg()[0])
    if len(bound) < n_pods:  # say why, from one pending pod's PodScheduled condition
        for p in (await cp.req("GET", f"/api/v1/namespaces/{ns}/pods"))["items"]:
            if not p["spec"].get("nodeName"):
                why = [c.get("message") for c in p.get("status", {}).get("conditions") or ()
                       if c.get("type") == "PodScheduled"]
                print(f"(case {case}: {n_pods - len(bound)} pods not bound; {p['metadata']['name']}: {why})",
                      file=sys.stderr, flush=True)
                break
    # No kubelet: with grace 0 the pods are gone at once; wait until they are, so the next case's
    # schedulers see the nodes empty again.
    await cp.req("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")

    async def empty() -> bool:
        return not (await cp.req("GET", f"/api/v1/namespaces/{ns}/pods?limit=1")).get("items")

    await cp.wait("the case's pods deleted", empty, "kube-apiserver", 300)
    await asyncio.sleep(5)  # and the schedulers' caches have let them go
    return result


# -- churn -------------------------------------------------------------------------------------------
class SharedNrtApi(LightkubeNrtApi):
    """One client for every writer of the bench (a real daemon has its own; here the process would
    otherwise spend its 2 cores on TLS handshakes). `close` leaves the shared client open."""

    async def close(self) -> None:
        return None


async def update_count(cp: NrtControlPlane) -> float:
    """The API server's own count of PUT (replace) requests on NRT objects (its /metrics)."""
    async with cp.session.get(cp.url + "/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and f'resource="{PLURAL}"' in line and 'verb="PUT"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def churn(cp: NrtControlPlane, f: Fleet, names: list[str], seconds: float, seed: int) -> dict[str, float]:
    topo = load_topology(f.topology)
    gpu = next(r for r in f.resources if r.kind == DeviceKind.GPU)
    api: KubeApi = await kubeconfig_api(str(cp.admin_kubeconfig))
    shared = SharedNrtApi(api)

    async def connect() -> SharedNrtApi:
        return shared

    writers = {n: NrtWriter(n, connect) for n in names}
    tasks = [asyncio.create_task(w.run()) for w in writers.values()]
    last_obj: dict[str, dict[str, Any]] = {}
    changes = 0
    try:
        # Each writer adopts its node's object (ours: our label) before the clock starts.
        for n, w in writers.items():
            w.want(build_nrt(n, topo, f.resources, set(), SETTINGS))
        await cp.wait("every writer started", lambda: _all_written(writers), "kube-apiserver", 300)
        writes0 = {n: w.writes for n, w in writers.items()}
        updates0, api_cpu0 = await update_count(cp), drb.cpu_s(cp.pid("kube-apiserver"))
        t0 = time.monotonic()
        end = t0 + seconds

        async def node_churn(n: str, rng: random.Random) -> None:
            nonlocal changes
            while time.monotonic() < end:
                for _ in range(rng.randint(1, 8)):
                    held = {(gpu.name, d.id) for d in rng.sample(gpu.devices, rng.randint(0, len(gpu.devices)))}
                    last_obj[n] = build_nrt(n, topo, f.resources, held, SETTINGS)
                    writers[n].want(last_obj[n])
                    changes += 1
                    await asyncio.sleep(rng.uniform(0.0, 0.05))
                await asyncio.sleep(rng.uniform(0.0, 1.5))

        base = random.Random(seed)
        await asyncio.gather(*(node_churn(n, random.Random(base.random())) for n in names))
        last_change = time.monotonic()
        elapsed = last_change - t0

        async def all_landed() -> bool:
            listed = await cp.req("GET", f"{NRT_PATH}?labelSelector=app.kubernetes.io%2Fmanaged-by%3Dtopo-device-plugin")
            stored = {o["metadata"]["name"]: o["zones"] for o in listed.get("items", ())}
            return all(stored.get(n) == last_obj[n]["zones"] for n in names if n in last_obj)

        await cp.wait("every node's final state stored", all_landed, "kube-apiserver", 120)
        landed = time.monotonic() - last_change
        writes = {n: w.writes - writes0[n] for n, w in writers.items()}
        updates = await update_count(cp) - updates0
        api_cpu = drb.cpu_s(cp.pid("kube-apiserver")) - api_cpu0
        return {"nodes": len(names), "seconds": elapsed, "changes": changes / len(names) / elapsed,
                "writes": sum(writes.values()) / len(names) / elapsed,
                "max_node": max(writes.values()) / elapsed, "updates": updates / len(names) / elapsed,
                "api_cpu": api_cpu / elapsed * 100, "landed": landed, "load": os.getloadavg()[0]}
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await api.close()


async def _all_written(writers: dict[str, NrtWriter]) -> bool:
    return all(w.applied is not None and w.applied == w.wanted for w in writers.values())


# -- main --------------------------------------------------------------------------------------------
async def stored_bytes(cp: NrtControlPlane, name: str) -> int:
    obj = await cp.req("GET", f"{NRT_PATH}/{name}")
    return len(json.dumps(obj, separators=(",", ":")))


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="100", help="node counts, comma-separated (the issue's: 100,1000)")
    ap.add_argument("--topologies", default="dgx-h100,pcie-2socket-4gpu-2nic")
    ap.add_argument("--fragmented", type=float, default=0.25,
                    help="share of nodes publishing one held GPU per zone (count fits, alignment does not)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per case")
    ap.add_argument("--max-pods", type=int, default=0,
                    help="at most this many pods per case (0: the aligned capacity of the clean nodes)")
    ap.add_argument("--scheduler-qps", type=int, default=5000,
                    help="both schedulers' client rate limit (kube-scheduler's default is 50)")
    ap.add_argument("--churn-nodes", type=int, default=100, help="nodes whose writers churn (0: no churn part)")
    ap.add_argument("--churn-seconds", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bins", default=None, help="control-plane binaries (default: the newest cached build)")
    o = ap.parse_args()
    if not 0 <= o.fragmented < 1:
        raise SystemExit("--fragmented: a share in [0, 1)")
    bins = pathlib.Path(o.bins) if o.bins else drb.controlplane_bins()
    try:
        topo_binary = ts.build()
    except ts.BuildUnavailable as e:
        raise SystemExit(str(e)) from None
    work = pathlib.Path(tempfile.mkdtemp(prefix="nrt-scale-"))
    cp = NrtControlPlane(bins, work, o.scheduler_qps, topo_binary)
    print(f"control plane: {bins.name}; topology-aware scheduler: {topo_binary.name}; scheduler QPS "
          f"{o.scheduler_qps}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    try:
        await cp.up()
        shapes = {t: fleet_shape(t) for t in o.topologies.split(",")}
        counts = [int(x) for x in o.nodes.split(",")]
        sizes: dict[str, str] = {}
        churned: list[str] = []
        print("\n| nodes | topology | scheduler | fragmented nodes | pods | bound | bound on a fragmented node "
              "| pods/s | sched CPU ms/pod | load |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        case = 0
        for nodes in counts:
            for t, f in shapes.items():
                for _ in range(o.repeat):
                    for scheduler in ("default-scheduler", CONTROL, ts.SCHEDULER_NAME):
                        case += 1
                        r = await run_case(cp, case, f, nodes, o.fragmented, scheduler, o.max_pods)
                        print(f"| {r.nodes} | {r.topology} | {r.scheduler} | {r.fragmented_nodes} | {r.pods} "
                              f"| {r.bound} | {r.on_fragmented} | {r.pods_per_s:.1f} | {r.cpu_ms_per_pod:.2f} "
                              f"| {r.load:.1f} |", flush=True)
                names, _ = await cp.make_fleet(f, nodes, o.fragmented)  # the nodes of the cases just run
                if t not in sizes:
                    built = len(json.dumps(build_nrt(names[0], load_topology(t), f.resources, set(), SETTINGS,
                                                     cp.uids[names[0]]), separators=(",", ":")))
                    asks = " + ".join(f"{v} {k}" for k, v in f.pod.items())
                    sizes[t] = f"| {t} | {built} | {await stored_bytes(cp, names[0])} | {asks} |"
                if o.churn_nodes and nodes == counts[-1]:
                    # The writers overwrite the objects: the fleet is rebuilt for whatever comes next.
                    c = await churn(cp, f, names[:o.churn_nodes], o.churn_seconds, o.seed)
                    cp.fleet_of = (t, nodes, -1.0)  # matches no case: the next make_fleet() starts afresh
                    churned.append(f"| {t} | {nodes} | {c['nodes']:.0f} | {c['seconds']:.1f} | {c['changes']:.2f} "
                                   f"| {c['writes']:.2f} | {c['max_node']:.2f} | {c['updates']:.2f} "
                                   f"| {c['api_cpu']:.0f} | {c['landed']:.2f} s | {c['load']:.1f} |")
        print("\n| topology | NRT bytes/node (built, JSON) | as the API server returns it | a pod asks |")
        print("|---|---|---|---|")
        print("\n".join(sizes.values()))
        if churned:
            print("\n| topology | nodes | churning nodes | seconds | changes/node/s | writes/node/s (writers) "
                  "| busiest node writes/s | API server PUTs/node/s | API server CPU % "
                  "| all final states stored after | load |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            print("\n".join(churned), flush=True)
    finally:
        await cp.down()
        print(f"(work dir {work}: logs kept)", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
