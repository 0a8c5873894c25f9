"""Daemon benchmark on one simulated 8-GPU node (printed tables, not pass/fail).

Measures, against the in-package kubelet stand-in over real unix sockets and a
real daemon process:
- time from process start to registered (and first device list received);
- re-registration latency after kubelet.sock is recreated (kubelet restart), p50/p95;
- round-trip latency of each RPC, p50/p99;
- the daemon's resident memory (RSS) and CPU time.

Usage: python benchmarks/daemon_bench.py [--node dgx-a100] [--restarts 50] [--calls 500]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import grpc

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plugin.api import api_pb2, api_pb2_grpc  # noqa: E402
from plugin.demo.kubelet_standin import KubeletStandin  # noqa: E402

GPU = "nvidia.com/gpu"


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(p / 100 * (len(s) - 1))))
    return s[k]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def hwm_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main(node: str, restarts: int, calls: int, idle: float) -> None:
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="tdp-bench-") as d:
        kubelet = KubeletStandin(d)
        await kubelet.start()
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "plugin", "serve", "--simulate", node, "--device-plugin-path", d,
             "--device-id-strategy", "index", "--log-level", os.environ.get("BENCH_LOG", "warning")], cwd=ROOT)
        try:
            await kubelet.wait_for(lambda: bool(kubelet.registrations_of(GPU)), timeout=30)
            t_reg = time.monotonic() - started
            await kubelet.wait_for(lambda: bool(kubelet.devices(GPU)), timeout=30)
            t_list = time.monotonic() - started
            rows.append(("start -> registered (process start included)", f"{t_reg * 1000:.0f} ms"))
            rows.append(("start -> first device list", f"{t_list * 1000:.0f} ms"))

            rss_start = rss_mib(proc.pid)
            cpu0 = cpu_s(proc.pid)
            await asyncio.sleep(idle)
            idle_mcpu = (cpu_s(proc.pid) - cpu0) / idle * 1000
            rows.append(("daemon RSS once registered", f"{rss_start:.1f} MiB"))
            rows.append((f"idle CPU while registered (over {idle:.0f} s)", f"{idle_mcpu:.1f} millicores"))
            await kubelet.wait_for(lambda: len(kubelet.clients) >= 1 and all(
                kubelet.clients[r].devices for r in kubelet.clients), timeout=30)
            resources = sorted(kubelet.clients)
            latencies = []
            for n in range(restarts):
                await kubelet.restart()
                t0 = time.monotonic()
                # every resource registered again (the GPU and the NIC pool)
                await kubelet.wait_for(lambda: all(len(kubelet.registrations_of(r)) >= n + 2 for r in resources),
                                       timeout=30)
                latencies.append(time.monotonic() - t0)
            await kubelet.wait_for(lambda: bool(kubelet.devices(GPU)), timeout=30)
            rows.append((f"re-registration after kubelet.sock recreated, p50 (n={restarts})",
                         f"{statistics.median(latencies) * 1000:.1f} ms"))
            rows.append((f"re-registration after kubelet.sock recreated, p95 (n={restarts})",
                         f"{pct(latencies, 95) * 1000:.1f} ms"))

            endpoint = kubelet.registrations_of(GPU)[-1].endpoint
            ids = [str(i) for i in range(8)]
            async with grpc.aio.insecure_channel(f"unix:{d}/{endpoint}") as ch:
                stub = api_pb2_grpc.DevicePluginStub(ch)
                pref = api_pb2.PreferredAllocationRequest()
                pref.container_requests.add(available_deviceIDs=ids, allocation_size=4)
                alloc = api_pb2.AllocateRequest()
                alloc.container_requests.add(devices_ids=["0", "1"])
                cases = {
                    "GetDevicePluginOptions": lambda: stub.GetDevicePluginOptions(api_pb2.Empty()),
                    "GetPreferredAllocation (8 free, size 4)": lambda: stub.GetPreferredAllocation(pref),
                    "Allocate (2 GPUs)": lambda: stub.Allocate(alloc),
                    "PreStartContainer": lambda: stub.PreStartContainer(
                        api_pb2.PreStartContainerRequest(devices_ids=["0"])),
                }

                async def first_list():
                    call = stub.ListAndWatch(api_pb2.Empty())
                    await call.read()
                    call.cancel()

                cases["ListAndWatch (open + first list)"] = first_list
                for name, fn in cases.items():
                    for _ in range(20):
                        await fn()
                    samples = []
                    for _ in range(calls):
                        t0 = time.perf_counter()
                        await fn()
                        samples.append(time.perf_counter() - t0)
                    rows.append((f"{name} round trip p50 / p99",
                                 f"{statistics.median(samples) * 1000:.2f} / {pct(samples, 99) * 1000:.2f} ms"))
            rows.append(("daemon RSS after the run (peak of the run: VmHWM)", f"{rss_mib(proc.pid):.1f} MiB "
                         f"({hwm_mib(proc.pid):.1f} MiB)"))
            rows.append(("daemon CPU time for the whole run", f"{cpu_s(proc.pid):.2f} s"))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
            await kubelet.stop()
    width = max(len(r[0]) for r in rows)
    print(f"\nDaemon benchmark: simulated {node}, {restarts} kubelet restarts, {calls} calls per RPC\n")
    print(f"{'measure':<{width}}  value")
    print(f"{'-' * width}  {'-' * 20}")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--node", default="dgx-a100")
    ap.add_argument("--restarts", type=int, default=50)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--idle", type=float, default=20.0, help="seconds of idle CPU measurement")
    args = ap.parse_args()
    asyncio.run(main(args.node, args.restarts, args.calls, args.idle))
