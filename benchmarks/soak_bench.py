"""Soak: 100,000 mixed RPCs against one real daemon process; does anything drift?

Printed table, not pass/fail. A daemon (`python -m plugin serve --simulate dgx-a100`)
registers with the kubelet stand-in over real unix sockets; 8 concurrent clients then send
GetPreferredAllocation, Allocate, PreStartContainer and GetDevicePluginOptions (valid
requests, and one in ten refused as invalid) in 10 batches. After each batch: the daemon's
RSS, threads and open fds (from /proc) and the batch's round-trip p50/p99. The last line is
the drift, last batch against the first: a leak shows as RSS or fds climbing batch after
batch, a slowdown as p50/p99 climbing.

Usage: python benchmarks/soak_bench.py [--rpcs N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time

import grpc

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "daemon"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from daemon_testlib import GPU, allocate_request, preferred_request
from topo_testkit.procfs import footprint

from plugin.api import api_pb2, api_pb2_grpc
from topo_testkit.kubelet_standin import KubeletStandin

BATCHES = 10
CLIENTS = 8


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


async def one(stub, rng: random.Random, ids: list[str]) -> float:
    kind = rng.random()
    t = time.perf_counter()
    try:
        if kind < 0.1:  # invalid: refused with INVALID_ARGUMENT
            await stub.Allocate(allocate_request(["no-such-device"]), timeout=60)
        elif kind < 0.5:
            size = rng.randint(1, len(ids))
            await stub.GetPreferredAllocation(preferred_request((rng.sample(ids, rng.randint(size, len(ids))), [],
                                                                 size)), timeout=60)
        elif kind < 0.85:
            await stub.Allocate(allocate_request(rng.sample(ids, rng.randint(1, 4))), timeout=60)
        elif kind < 0.95:
            await stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=rng.sample(ids, 1)), timeout=60)
        else:
            await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=60)
    except grpc.aio.AioRpcError as e:
        if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
            raise
    return (time.perf_counter() - t) * 1000


async def main(rpcs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tdp-soak-") as d:
        kubelet = KubeletStandin(d)
        await kubelet.start()
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, "-m", "plugin", "serve", "--simulate", "dgx-a100",
                                 "--device-plugin-path", d, "--device-id-strategy", "index"], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8, timeout=60)
            ids = sorted(kubelet.devices(GPU))
            path = f"{d}/{kubelet.registrations_of(GPU)[0].endpoint}"
            start = footprint(proc.pid)
            print(f"# soak: {rpcs} RPCs in {BATCHES} batches, {CLIENTS} clients, Python {sys.version.split()[0]}")
            print(f"start: {start}\n")
            print(f"{'batch':>5}  {'RPCs':>7}  {'RSS MiB':>7}  {'threads':>7}  {'fds':>4}  {'p50 ms':>6}  {'p99 ms':>6}")
            rows = []
            per_client = rpcs // BATCHES // CLIENTS
            async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)

                async def client(seed: int) -> list[float]:
                    rng = random.Random(seed)
                    return [await one(stub, rng, ids) for _ in range(per_client)]

                done = 0
                for b in range(BATCHES):
                    times = [t for ts in await asyncio.gather(*(client(b * 100 + c) for c in range(CLIENTS)))
                             for t in ts]
                    done += len(times)
                    fp = footprint(proc.pid)
                    row = (b + 1, done, fp.rss_mib, fp.threads, fp.fds, statistics.median(times), pct(times, 99))
                    rows.append(row)
                    print(f"{row[0]:>5}  {row[1]:>7}  {row[2]:>7.1f}  {row[3]:>7}  {row[4]:>4}  {row[5]:>6.2f}  {row[6]:>6.2f}")
            first, last = rows[0], rows[-1]
            print(f"\ndrift, batch {BATCHES} vs 1: RSS {last[2] - first[2]:+.1f} MiB, threads {last[3] - first[3]:+d}, "
                  f"fds {last[4] - first[4]:+d}, p50 {last[5] - first[5]:+.2f} ms, p99 {last[6] - first[6]:+.2f} ms")
        finally:
            proc.terminate()
            proc.wait(30)
            await kubelet.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rpcs", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true", help="10,000 RPCs")
    a = ap.parse_args()
    asyncio.run(main(10_000 if a.quick else a.rpcs))
