"""Daemon benchmark on one simulated 8-GPU node (printed tables, not pass/fail).

Measures, against the in-package kubelet stand-in over real unix sockets and a
real daemon process:
- time from process start to registered (and first device list received);
- re-registration latency after kubelet.sock is recreated (kubelet restart), p50/p95;
- round-trip latency of each RPC, p50/p99;
- the daemon's resident memory (RSS) and CPU time;
- on a 64-GPU node whose searches no budget proves (tests/daemon/daemon_testlib.py), the same
  daemon idle and while a maximal GetPreferredAllocation (64 container requests x 64 GPUs, size
  32) runs again and again: small GetPreferredAllocation and GetDevicePluginOptions round trips;
  node-file edit -> ListAndWatch update latency (this includes the file watcher's 100 ms debounce
  and the YAML parse of the 64-GPU file, which competes with the search for the GIL); and the
  part the event loop owns, publish -> update: from the daemon's "simulated node changed" log
  line (written just before it publishes the new topology) to the update arriving on the stream.
  And how fast an absurd request (20,000 container requests) is refused.

Usage: python benchmarks/daemon_bench.py [--node dgx-a100] [--restarts 50] [--calls 500] [--edits 10]
       [--no-search | --search-only] [--idle 20]

The RPC round trips are measured interleaved (one call of each RPC per round) and each is
given as a ratio to the empty RPC, GetDevicePluginOptions: on a loaded machine the ratios
hold where the absolute times do not.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import grpc

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "daemon"))
sys.path.insert(0, str(ROOT / "tests" / "support"))  # topo_testkit: test support, not in the wheel

import yaml
from daemon_testlib import hard_node_yaml

from plugin.api import api_pb2, api_pb2_grpc
from topo_testkit.kubelet_standin import KubeletStandin

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
            rows.append(("re-registration: the first restart / the slowest later one",
                         f"{latencies[0] * 1000:.1f} / {max(latencies[1:] or [0.0]) * 1000:.1f} ms"))

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
                # Interleaved (one call of each RPC per round): a load that comes and goes on the machine
                # hits every RPC alike, so the ratios to the empty RPC hold on a busy box.
                for fn in cases.values():
                    for _ in range(20):
                        await fn()
                samples: dict[str, list[float]] = {name: [] for name in cases}
                for _ in range(calls):
                    for name, fn in cases.items():
                        t0 = time.perf_counter()
                        await fn()
                        samples[name].append(time.perf_counter() - t0)
                empty = samples["GetDevicePluginOptions"]
                for name, got in samples.items():
                    ratio = "" if got is empty else (
                        f"  ({statistics.median(got) / statistics.median(empty):.2f}x / "
                        f"{pct(got, 99) / pct(empty, 99):.2f}x the empty RPC)")
                    rows.append((f"{name} round trip p50 / p99",
                                 f"{statistics.median(got) * 1000:.2f} / {pct(got, 99) * 1000:.2f} ms{ratio}"))
            rows.append(("daemon RSS after the run (peak of the run: VmHWM)", f"{rss_mib(proc.pid):.1f} MiB "
                         f"({hwm_mib(proc.pid):.1f} MiB)"))
            rows.append(("daemon CPU time for the whole run", f"{cpu_s(proc.pid):.2f} s"))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
            await kubelet.stop()
    print_table(f"Daemon benchmark: simulated {node}, {restarts} kubelet restarts, {calls} calls per RPC", rows)


def print_table(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(r[0]) for r in rows)
    print(f"\n{title}\n")
    print(f"{'measure':<{width}}  value")
    print(f"{'-' * width}  {'-' * 20}")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def p50_p99(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.1f} / {pct(samples, 99) * 1000:.1f} ms"


async def under_search(calls: int, edits: int) -> None:
    """The daemon idle, then while a maximal search runs without pause (see the module docstring)."""
    rows: list[tuple[str, str]] = []
    ids = [str(i) for i in range(64)]
    maximal = api_pb2.PreferredAllocationRequest()
    for _ in range(64):
        maximal.container_requests.add(available_deviceIDs=ids, allocation_size=32)
    small = api_pb2.PreferredAllocationRequest()
    small.container_requests.add(available_deviceIDs=ids[:8], allocation_size=4)
    absurd = api_pb2.PreferredAllocationRequest()
    for _ in range(20000):
        absurd.container_requests.add(available_deviceIDs=ids[:8], allocation_size=4)
    with tempfile.TemporaryDirectory(prefix="tdp-bench-") as d:
        node = pathlib.Path(d) / "node.yaml"
        node.write_text(hard_node_yaml())
        kubelet = KubeletStandin(d)
        await kubelet.start()
        log_path = pathlib.Path(d) / "daemon.log"
        log_file = open(log_path, "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "plugin", "serve", "--simulate", str(node), "--device-plugin-path", d,
             "--device-id-strategy", "index", "--log-level", "info"], cwd=ROOT, stdout=log_file,
            stderr=subprocess.STDOUT)
        received: list[float] = []  # wall-clock time each edit reached the stream
        try:
            await kubelet.wait_for(lambda: len(kubelet.devices("nvidia.com/gpu")) == 64, timeout=60)
            client = kubelet.client("nvidia.com/gpu")
            endpoint = kubelet.registrations_of("nvidia.com/gpu")[0].endpoint
            data = yaml.safe_load(node.read_text())

            async def edit_latency(n: int) -> float:
                """Flip one GPU's health in the node file; seconds until the stream carries it."""
                gpu = data["gpus"][n % 64]
                gpu["health"] = "Unhealthy" if gpu.get("health", "Healthy") == "Healthy" else "Healthy"
                tmp = node.with_suffix(".tmp")
                tmp.write_text(yaml.safe_dump(data, sort_keys=False))
                t0 = time.perf_counter()
                os.replace(tmp, node)
                want = gpu["health"]
                await kubelet.wait_for(lambda: client.devices[str(n % 64)].health == want, timeout=60)
                received.append(time.time())
                return time.perf_counter() - t0

            def publish_latencies(first: int) -> list[float]:
                """Receipt minus the daemon's publish log time (ms resolution) for edits from `first` on."""
                stamps = re.findall(r"^(\S+)Z info \S+ simulated node changed", log_path.read_text(), re.M)
                published = [datetime.datetime.fromisoformat(t).replace(tzinfo=datetime.timezone.utc).timestamp()
                             for t in stamps]
                return [r - p for r, p in zip(received[first:], published[first:])]

            async with grpc.aio.insecure_channel(f"unix:{d}/{endpoint}") as ch:
                stub = api_pb2_grpc.DevicePluginStub(ch)

                async def measure(label: str) -> None:
                    cases = (("GetDevicePluginOptions", lambda: stub.GetDevicePluginOptions(api_pb2.Empty())),
                             ("GetPreferredAllocation (8 free, size 4)", lambda: stub.GetPreferredAllocation(small)))
                    for name, fn in cases:
                        samples = []
                        for _ in range(calls):
                            t0 = time.perf_counter()
                            await fn()
                            samples.append(time.perf_counter() - t0)
                        rows.append((f"{name} round trip p50 / p99, {label}", p50_p99(samples)))
                    first = len(received)
                    lat = [await edit_latency(first + n) for n in range(edits)]
                    rows.append((f"node edit -> ListAndWatch update p50 / max, {label} (n={edits})",
                                 f"{statistics.median(lat) * 1000:.0f} / {max(lat) * 1000:.0f} ms"))
                    pub = publish_latencies(first)
                    rows.append((f"publish -> ListAndWatch update p50 / max, {label} (n={len(pub)})",
                                 f"{statistics.median(pub) * 1000:.0f} / {max(pub) * 1000:.0f} ms"))

                await measure("idle")
                durations: list[float] = []
                running = True

                async def search_forever() -> None:
                    while running:
                        t0 = time.perf_counter()
                        await stub.GetPreferredAllocation(maximal)
                        durations.append(time.perf_counter() - t0)

                searcher = asyncio.ensure_future(search_forever())
                await asyncio.sleep(0.5)
                await measure("during a maximal search")
                running = False
                await searcher
                rows.append((f"maximal GetPreferredAllocation (64 x 64 GPUs, size 32) p50 (n={len(durations)})",
                             f"{statistics.median(durations) * 1000:.0f} ms"))

                t0 = time.perf_counter()
                try:
                    await stub.GetPreferredAllocation(absurd)
                    outcome = "answered"
                except grpc.aio.AioRpcError as e:
                    outcome = e.code().name
                rows.append(("20,000 container requests in one call", f"{outcome} after "
                             f"{(time.perf_counter() - t0) * 1000:.0f} ms"))
            rows.append(("daemon RSS after the run (peak of the run: VmHWM)", f"{rss_mib(proc.pid):.1f} MiB "
                         f"({hwm_mib(proc.pid):.1f} MiB)"))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            log_file.close()
            await kubelet.stop()
    print_table(f"Daemon under a maximal search: simulated 64-GPU node, {calls} calls per RPC", rows)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--node", default="dgx-a100")
    ap.add_argument("--restarts", type=int, default=50)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--edits", type=int, default=10, help="node-file edits per phase of the search benchmark")
    ap.add_argument("--idle", type=float, default=20.0, help="seconds of idle CPU measurement")
    ap.add_argument("--search-only", action="store_true", help="only the maximal-search table")
    ap.add_argument("--no-search", action="store_true", help="leave out the maximal-search table")
    args = ap.parse_args()
    print(f"# load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    if not args.search_only:
        asyncio.run(main(args.node, args.restarts, args.calls, args.idle))
    if not args.no_search:
        asyncio.run(under_search(min(args.calls, 200), args.edits))
    print(f"# load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
