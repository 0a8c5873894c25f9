"""DRA prepare benchmark: a big NodePrepareResources call and what it does to everything else (issue 19).

Starts a real `serve` process (simulated DGX H100: GPUs through DRA, NICs through the device-plugin API)
against the stand-in API server and kubelet of tests/dra, then measures
- one NodePrepareResources call with N one-GPU claims: its duration;
- a one-claim call sent once the big call has read 100 claims: its latency, and whether it finished
  before the big one;
- the device-plugin side meanwhile: the slowest of back-to-back Allocate calls (a stalled event loop
  shows here);
- SIGTERM sent while a big call is under way (the last claim's read hangs): time until the process exits;
- a one-claim call against a hung API server (accepts, never answers): time until its error comes back;
and, with the driver in this process, how often the checkpoint file is rewritten (and fsynced) for one
N-claim call. Printed table, not pass/fail.

`--parts latency` (issue 24): NodePrepareResources p50/p99 for a 1-GPU claim and a 2 GPU + 2 NIC claim
(CDI spec written, checkpoint synced), each call a fresh claim (unprepared after, untimed), against an
empty call (zero claims) on the same socket; the driver runs in this process (simulated DGX H100, all
devices through DRA). `--profile` adds a cProfile of the 1-GPU calls: the driver's functions by own time.

`--parts idle` (issue 24): claim reads over TLS (the stand-in with tests/dra/tls) sent `--idle-s` apart, as
the kubelet's calls come on a quiet node, against reads back to back: their latency, and how many
connections the server saw.

`--code DIR` runs the driver of another checkout (e.g. `git archive <commit> | tar -x -C DIR`), for
before/after figures; the stand-ins always come from this checkout.

Usage: python benchmarks/dra_prepare_bench.py [--claims 1500] [--code DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument("--claims", type=int, default=1500)
ARGS.add_argument("--code", default=str(ROOT), help="checkout whose driver is measured")
ARGS.add_argument("--parts", default="writes,backlog,sigterm,hung",
                  help="which measurements, comma-separated (also: latency)")
ARGS.add_argument("--calls", type=int, default=300, help="calls per kind for --parts latency")
ARGS.add_argument("--profile", action="store_true", help="with latency: cProfile the 1-GPU calls")
ARGS.add_argument("--idle-s", type=float, default=6.0, help="with idle: seconds between reads (httpx keeps "
                  "an idle connection 5 s by default)")
ARGS.add_argument("--idle-reads", type=int, default=5, help="with idle: how many spaced reads")
ARGS.add_argument("--dir", default="/tmp", help="with latency: where the kubelet and CDI dirs live "
                  "(/dev/shm: a tmpfs, where fsync costs nothing, to see the disk's share)")
OPTS = ARGS.parse_args()
CODE = os.path.abspath(OPTS.code)
sys.path[:0] = [CODE, str(ROOT / "tests" / "support"), str(ROOT / "tests" / "dra")]

import grpc
from apiserver_standin import ApiServerStandIn, write_kubeconfig
from kubelet_standin import register, registration_sockets

from plugin.api.dra.v1 import api_pb2 as dra_pb2
from plugin.api.dra.v1 import api_pb2_grpc as dra_grpc
from topo_testkit.kubelet_standin import KubeletStandin

NODE, DRIVER, NIC = "node-a", "topo.dev", "topo.dev/nic"


def add_claims(api: ApiServerStandIn, prefix: str, n: int) -> list[tuple[str, str, str]]:
    return [("team", api.add_claim("team", f"{prefix}-{i}", [{"request": "gpu", "driver": DRIVER, "pool": NODE,
                                                              "device": f"gpu-{i % 8}"}]), f"{prefix}-{i}")
            for i in range(n)]


async def prepare(endpoint: str, claims, timeout: float = 600):
    async with grpc.aio.insecure_channel(f"unix:{endpoint}") as ch:
        req = dra_pb2.NodePrepareResourcesRequest(claims=[dra_pb2.Claim(namespace=n, uid=u, name=m)
                                                          for n, u, m in claims])
        return await dra_grpc.DRAPluginStub(ch).NodePrepareResources(req, timeout=timeout)


async def until(predicate, timeout: float = 120):
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError
        await asyncio.sleep(0.01)


class Daemon:
    def __init__(self, base: str, api: ApiServerStandIn):
        self.kubelet_root, self.cdi = os.path.join(base, "k"), os.path.join(base, "cdi")
        self.plugin_dir = os.path.join(self.kubelet_root, "device-plugins")
        os.makedirs(self.plugin_dir)
        env = dict(os.environ, NODE_NAME=NODE, POD_UID="bench", PYTHONPATH=CODE,
                   KUBECONFIG=write_kubeconfig(pathlib.Path(base) / "kubeconfig", api.url))
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.log = open(os.path.join(base, "daemon.log"), "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "plugin", "serve", "--simulate", "dgx-h100",
                                      "--kubelet-root-dir", self.kubelet_root, "--cdi-spec-dir", self.cdi,
                                      "--dra-resources", "nvidia.com/gpu", "--log-level", "warning"],
                                     cwd=CODE, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    async def dra(self):
        reg = os.path.join(self.kubelet_root, "plugins_registry")
        await until(lambda: os.path.isdir(reg) and registration_sockets(self.kubelet_root))
        return await register(registration_sockets(self.kubelet_root)[0])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


async def backlog_run(n: int) -> dict[str, float]:
    """Big call, a one-claim call behind it, Allocate latency on the device-plugin side."""
    api = ApiServerStandIn(NODE)
    await api.start()
    base = tempfile.mkdtemp(prefix="drb-", dir="/tmp")
    d = Daemon(base, api)
    kubelet = KubeletStandin(d.plugin_dir)
    await kubelet.start()
    try:
        await kubelet.wait_for(lambda: len(kubelet.devices(NIC)) == 8, timeout=60)
        nic = sorted(kubelet.devices(NIC))[0]
        plugin = await d.dra()
        big_claims, [one] = add_claims(api, "big", n), add_claims(api, "one", 1)

        async def allocations(until_done: asyncio.Future | None, count: int = 200) -> list[float]:
            took = []
            while (until_done is not None and not until_done.done()) or (until_done is None and len(took) < count):
                a = time.monotonic()
                await kubelet.allocate(NIC, [nic])
                took.append(time.monotonic() - a)
            return took

        idle = await allocations(None)
        t0 = time.monotonic()
        big = asyncio.create_task(prepare(plugin.endpoint, big_claims))
        during = asyncio.create_task(allocations(big))
        await until(lambda: api.claim_reads >= 100)
        t1 = time.monotonic()
        await prepare(plugin.endpoint, [one])
        small_s, small_first = time.monotonic() - t1, not big.done()
        resp = await big
        big_s = time.monotonic() - t0
        busy = await during
        failed = sum(1 for c in resp.claims.values() if c.error)
        return {"big_s": big_s, "big_failed": failed, "small_s": small_s, "small_first": small_first,
                "allocate_idle_worst_s": max(idle), "allocate_worst_s": max(busy), "allocations": len(busy)}
    finally:
        d.stop()
        await kubelet.stop()
        await api.stop()
        shutil.rmtree(base, ignore_errors=True)


async def sigterm_run(n: int) -> float:
    api = ApiServerStandIn(NODE)
    await api.start()
    base = tempfile.mkdtemp(prefix="drb-", dir="/tmp")
    d = Daemon(base, api)
    try:
        plugin = await d.dra()
        claims = add_claims(api, "big", n)
        last = claims[-1][2]
        api.hold(lambda ns, name: name == last)
        big = asyncio.create_task(prepare(plugin.endpoint, claims))
        await until(lambda: api.claim_reads >= n // 2)
        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        await until(lambda: d.proc.poll() is not None, timeout=300)
        took = time.monotonic() - t0
        big.cancel()
        return took
    finally:
        d.stop()
        await api.stop()
        shutil.rmtree(base, ignore_errors=True)


async def hung_run() -> float:
    api = ApiServerStandIn(NODE)
    await api.start()
    base = tempfile.mkdtemp(prefix="drb-", dir="/tmp")
    d = Daemon(base, api)
    try:
        plugin = await d.dra()
        [one] = add_claims(api, "one", 1)
        api.hold()
        t0 = time.monotonic()
        resp = await prepare(plugin.endpoint, [one])
        assert resp.claims[one[1]].error, "a hung API server cannot have prepared a claim"
        return time.monotonic() - t0
    finally:
        d.stop()
        await api.stop()
        shutil.rmtree(base, ignore_errors=True)


async def checkpoint_writes(n: int) -> int:
    """The driver in this process, its checkpoint's file writes counted for one n-claim call."""
    from plugin.dra import DraOptions, SliceOptions
    from plugin.dra.kubelet.checkpoint import ClaimCheckpoint
    from plugin.kube.client import kubeconfig_api
    from plugin.runtime.compose.dra import dra_driver
    from plugin.sources.simulated import load_simulated

    writes = 0
    original = ClaimCheckpoint._write

    def counted(self, claims):
        nonlocal writes
        writes += 1
        return original(self, claims)

    ClaimCheckpoint._write = counted
    api = ApiServerStandIn(NODE)
    await api.start()
    base = tempfile.mkdtemp(prefix="drb-", dir="/tmp")
    kube = await kubeconfig_api(write_kubeconfig(pathlib.Path(base) / "kubeconfig", api.url))
    drv = dra_driver(DraOptions(SliceOptions(node_name=NODE), kubelet_root=os.path.join(base, "k"),
                               cdi_root=os.path.join(base, "cdi"), instance_id="bench", resync_s=3600), kube)
    try:
        await drv.start(load_simulated("dgx-h100"))
        plugin = await register(registration_sockets(os.path.join(base, "k"))[0])
        claims = add_claims(api, "c", n)
        before = writes
        await prepare(plugin.endpoint, claims)
        return writes - before
    finally:
        await drv.stop()
        await kube.close()
        await api.stop()
        ClaimCheckpoint._write = original
        shutil.rmtree(base, ignore_errors=True)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def _phases(drv, kube, api: ApiServerStandIn, calls: int) -> dict[str, list[float]]:
    """The steps of a one-claim prepare, each timed alone: where the time of a call goes."""
    from plugin.dra.claims.prepared import PreparedClaim
    from plugin.dra.slices.build import device_table

    table = device_table(drv.topology, drv.options.slices)
    out: dict[str, list[float]] = {}

    async def timed(label: str, fn) -> None:
        t = time.perf_counter()
        await fn()
        out.setdefault(label, []).append(time.perf_counter() - t)

    for i in range(calls):
        uid = api.add_claim("team", f"phase-{i}", [{"request": "r", "driver": DRIVER, "pool": NODE,
                                                    "device": "gpu-0"}])
        await timed("phase: worker-thread hop", lambda: asyncio.to_thread(lambda: None))
        await timed("phase: checkpoint read (before the claim reads)", drv.checkpoint.read)
        await timed("phase: claim read from the API (stand-in, HTTP)", lambda: kube.get_claim("team", f"phase-{i}"))
        await timed("phase: CDI spec write (fsync, rename, dir fsync)", lambda: asyncio.to_thread(
            drv.cdi.write_claim_spec, uid, [("gpu-0", table["gpu-0"])]))
        await timed("phase: checkpoint write of one claim (2 fsyncs)", lambda: drv.checkpoint.update(
            lambda c: c.__setitem__(uid, PreparedClaim(uid=uid, namespace="team", name=f"phase-{i}"))))
        await drv.checkpoint.update(lambda c: c.pop(uid))
        drv.cdi.remove_claim_spec(uid)
    return out


async def latency_run(calls: int, profile: bool) -> tuple[list[tuple[str, str]], str]:
    """p50/p99 of NodePrepareResources: zero claims, one GPU, 2 GPUs + 2 NICs (fresh claims each time)."""
    import cProfile
    import io
    import pstats

    from plugin.dra import DraOptions, SliceOptions
    from plugin.kube.client import kubeconfig_api
    from plugin.runtime.compose.dra import dra_driver
    from plugin.sources.simulated import load_simulated

    api = ApiServerStandIn(NODE)
    await api.start()
    base = tempfile.mkdtemp(prefix="drb-", dir=OPTS.dir)
    kube = await kubeconfig_api(write_kubeconfig(pathlib.Path(base) / "kubeconfig", api.url))
    drv = dra_driver(DraOptions(SliceOptions(node_name=NODE), kubelet_root=os.path.join(base, "k"),
                               cdi_root=os.path.join(base, "cdi"), instance_id="bench", resync_s=3600), kube)
    shapes = {"empty call (0 claims)": [], "1 GPU": ["gpu-0"],
              "2 GPUs + 2 NICs": ["gpu-0", "gpu-1", "nic-mlx5-0", "nic-mlx5-1"]}
    rows, prof_text = [], ""
    try:
        await drv.start(load_simulated("dgx-h100"))
        plugin = await register(registration_sockets(os.path.join(base, "k"))[0])
        async with grpc.aio.insecure_channel(f"unix:{plugin.endpoint}") as ch:
            stub = dra_grpc.DRAPluginStub(ch)
            timings: dict[str, list[float]] = {}
            prof = cProfile.Profile() if profile else None
            for i in range(calls + 20):  # the first 20 rounds warm up and are not counted
                for label, devs in shapes.items():
                    claims = []
                    if devs:
                        name = f"c-{i}-{len(devs)}"
                        uid = api.add_claim("team", name, [{"request": "r", "driver": DRIVER, "pool": NODE,
                                                            "device": d} for d in devs])
                        claims = [dra_pb2.Claim(namespace="team", uid=uid, name=name)]
                    req = dra_pb2.NodePrepareResourcesRequest(claims=claims)
                    on = prof is not None and label == "1 GPU" and i >= 20
                    if on:
                        prof.enable()
                    t = time.perf_counter()
                    resp = await stub.NodePrepareResources(req, timeout=60)
                    took = time.perf_counter() - t
                    if on:
                        prof.disable()
                    assert not any(c.error for c in resp.claims.values()), resp
                    if i >= 20:
                        timings.setdefault(label, []).append(took)
                    if claims:
                        await stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=claims),
                                                          timeout=60)
            timings.update(await _phases(drv, kube, api, calls))
            empty = _pct(timings["empty call (0 claims)"], 0.5)
            for label, xs in timings.items():
                p50, p99 = _pct(xs, 0.5), _pct(xs, 0.99)
                what = label if label.startswith("phase") else f"NodePrepareResources, {label}"
                rows.append((f"{what}: p50 / p99",
                             f"{p50 * 1000:.2f} / {p99 * 1000:.2f} ms ({p50 / empty:.1f}x the empty call's p50)"))
            if prof is not None:
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
                prof_text = out.getvalue()
    finally:
        await drv.stop()
        await kube.close()
        await api.stop()
        shutil.rmtree(base, ignore_errors=True)
    return rows, prof_text


async def idle_run(gap_s: float, n: int) -> list[tuple[str, str]]:
    """Claim reads `gap_s` apart over TLS, then back to back: latency and connections opened."""
    import ssl

    from plugin.kube.client import kubeconfig_api

    tls = ROOT / "tests" / "dra" / "tls"
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tls / "server.crt", tls / "server.key")
    api = ApiServerStandIn(NODE)
    url = await api.start(ssl_context=ctx)
    base = tempfile.mkdtemp(prefix="drb-", dir="/tmp")
    kube = await kubeconfig_api(write_kubeconfig(pathlib.Path(base) / "kubeconfig", url, ca=str(tls / "ca.crt")))
    add_claims(api, "idle", 1)
    rows = []
    try:
        await kube.get_claim("team", "idle-0")
        for label, gap, count in ((f"{gap_s:g} s apart", gap_s, n), ("back to back", 0.0, 50)):
            before, took = len(api.connections), []
            for _ in range(count):
                await asyncio.sleep(gap)
                t = time.perf_counter()
                await kube.get_claim("team", "idle-0")
                took.append(time.perf_counter() - t)
            rows.append((f"claim read over TLS, {label}: p50 / max; new connections",
                         f"{_pct(took, 0.5) * 1000:.2f} / {max(took) * 1000:.2f} ms; "
                         f"{len(api.connections) - before} for {count} reads"))
    finally:
        await kube.close()
        await api.stop()
        shutil.rmtree(base, ignore_errors=True)
    return rows


async def main() -> None:
    n = OPTS.claims
    print(f"driver code: {CODE}; {n} claims per big call; {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}; latency files under {OPTS.dir}")
    parts = set(OPTS.parts.split(","))
    rows = []
    if "writes" in parts:
        rows.append(("checkpoint writes for one call", f"{await checkpoint_writes(n)}"))
    if "backlog" in parts:
        r = await backlog_run(n)
        rows += [("big call: duration", f"{r['big_s']:.1f} s ({r['big_failed']} claims failed)"),
                 ("one-claim call behind it: latency", f"{r['small_s']:.2f} s"),
                 ("one-claim call finished first", "yes" if r["small_first"] else "no"),
                 ("device-plugin Allocate, idle: slowest of 200", f"{r['allocate_idle_worst_s'] * 1000:.0f} ms"),
                 (f"device-plugin Allocate meanwhile: slowest of {r['allocations']}",
                  f"{r['allocate_worst_s'] * 1000:.0f} ms")]
    if "sigterm" in parts:
        rows.append(("SIGTERM during a big call: exit after", f"{await sigterm_run(n):.2f} s"))
    if "hung" in parts:
        rows.append(("one claim, hung API server: error after", f"{await hung_run():.1f} s"))
    if "idle" in parts:
        rows += await idle_run(OPTS.idle_s, OPTS.idle_reads)
    prof_text = ""
    if "latency" in parts:
        more, prof_text = await latency_run(OPTS.calls, OPTS.profile)
        rows += more
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if prof_text:
        print(prof_text)


if __name__ == "__main__":
    asyncio.run(main())
