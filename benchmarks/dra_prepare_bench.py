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
ARGS.add_argument("--parts", default="writes,backlog,sigterm,hung", help="which measurements, comma-separated")
OPTS = ARGS.parse_args()
CODE = os.path.abspath(OPTS.code)
sys.path[:0] = [CODE, str(ROOT / "tests" / "support"), str(ROOT / "tests" / "dra")]

import grpc  # noqa: E402
from apiserver_standin import ApiServerStandIn, write_kubeconfig  # noqa: E402
from kubelet_standin import register, registration_sockets  # noqa: E402

from plugin.api.dra.v1 import api_pb2 as dra_pb2  # noqa: E402
from plugin.api.dra.v1 import api_pb2_grpc as dra_grpc  # noqa: E402
from topo_testkit.kubelet_standin import KubeletStandin  # noqa: E402

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
    from plugin.dra import DraDriver, DraOptions, SliceOptions
    from plugin.dra.checkpoint import ClaimCheckpoint
    from plugin.dra.kubeapi import kubeconfig_api
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
    drv = DraDriver(DraOptions(SliceOptions(node_name=NODE), kubelet_root=os.path.join(base, "k"),
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


async def main() -> None:
    n = OPTS.claims
    print(f"driver code: {CODE}; {n} claims per big call; {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")
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
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    asyncio.run(main())
