"""HTTP endpoint benchmark: probe latency and the daemon's footprint with 0 and N idle connections.

What an operator worries about: can a port scanner, a stuck scraper or a
slowloris on the pod network push the plugin into an OOM kill or out of file
descriptors, and do the kubelet's probes still answer meanwhile? This starts a
real daemon (simulated 8-GPU node, registered with the in-package kubelet
stand-in), then measures
- /healthz, /readyz and /metrics round trips (a new connection each, as the
  kubelet's probes do), p50/p99;
- the daemon's RSS, threads and open fds (from /proc);
first with no other client, then while N idle connections (each a half-sent
request) are held open by this script, and once more after the daemon's idle
timeout has passed. Printed table, not pass/fail.

Usage: python benchmarks/http_bench.py [--idle 1000] [--probes 200] [--node dgx-a100]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import pathlib
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))  # topo_testkit: test support, not in the wheel

from topo_testkit.kubelet_standin import KubeletStandin
from topo_testkit.idle_clients import closed_by_peer, open_half_requests
from topo_testkit.procfs import footprint

GPU = "nvidia.com/gpu"
PATHS = ("/healthz", "/readyz", "/metrics")


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[max(0, min(len(s) - 1, round(p / 100 * (len(s) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe(port: int, path: str) -> float:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise RuntimeError(f"{path} answered {r.status}")
    finally:
        conn.close()
    return time.perf_counter() - t0


def probe_latencies(port: int, n: int) -> dict[str, list[float]]:
    return {p: [probe(port, p) for _ in range(n)] for p in PATHS}


def still_open(socks: list[socket.socket]) -> int:
    """How many of these connections the server has not closed."""
    return sum(not closed_by_peer(s) for s in socks)


async def main(node: str, idle: int, probes: int, settle: float, after: float) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, idle + 512)), hard))
    port = free_port()
    rows: list[tuple[str, ...]] = []
    with tempfile.TemporaryDirectory(prefix="tdp-hbench-") as d:
        kubelet = KubeletStandin(d)
        await kubelet.start()
        proc = subprocess.Popen(
            [sys.executable, "-m", "plugin", "serve", "--simulate", node, "--device-plugin-path", d,
             "--device-id-strategy", "index", "--metrics-address", f"127.0.0.1:{port}",
             "--log-level", os.environ.get("BENCH_LOG", "warning")], cwd=ROOT)
        socks: list[socket.socket] = []
        try:
            await kubelet.wait_for(lambda: bool(kubelet.devices(GPU)), timeout=30)
            for _ in range(100):  # ready once Register has returned to the daemon
                try:
                    await asyncio.to_thread(probe, port, "/readyz")
                    break
                except (OSError, RuntimeError):
                    await asyncio.sleep(0.1)
            await asyncio.to_thread(probe_latencies, port, 10)  # warm-up

            def row(label: str, lat: dict[str, list[float]] | None, open_clients: str, fp=None) -> None:
                fp = fp or footprint(proc.pid)
                cells = [f"{pct(lat[p], 50) * 1000:.2f} / {pct(lat[p], 99) * 1000:.2f}" if lat else "-"
                         for p in PATHS]
                rows.append((label, *cells, f"{fp.rss_mib:.1f}", str(fp.threads), str(fp.fds), open_clients))

            row("no other client", await asyncio.to_thread(probe_latencies, port, probes), "-")
            t0 = time.monotonic()
            socks = await asyncio.to_thread(open_half_requests, port, idle)
            opened = time.monotonic() - t0
            await asyncio.sleep(settle)
            # footprint first, then the probes: both inside the idle timeout of a bounded server
            fp, held = footprint(proc.pid), still_open(socks)
            row(f"after opening {idle} idle connections", await asyncio.to_thread(probe_latencies, port, probes),
                str(held), fp)
            await asyncio.sleep(after)
            row(f"{after:.0f} s later, clients still silent", None, str(still_open(socks)))
            await kubelet.restart()
            await kubelet.wait_for(lambda: len(kubelet.registrations_of(GPU)) >= 2, timeout=30)
            alive = "alive" if proc.poll() is None else f"exited {proc.returncode}"
            row(f"after a kubelet restart (daemon {alive})", None, str(still_open(socks)))
        finally:
            proc.send_signal(signal.SIGTERM)  # with the idle clients still connected
            t0 = time.monotonic()
            try:
                proc.wait(timeout=20)
                exit_note = f"exit {proc.returncode} after {time.monotonic() - t0:.1f} s"
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                exit_note = "no exit within 20 s (killed)"
            for s in socks:
                s.close()
            await kubelet.stop()
    header = ("state", *(f"{p} p50 / p99 ms" for p in PATHS), "RSS MiB", "threads", "fds", "idle clients open")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\nHTTP endpoint benchmark: simulated {node}, {probes} probes per path per state, "
          f"{idle} idle connections opened in {opened:.2f} s\n")
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(f"{c:<{w}}" for c, w in zip(r, widths)))
    print(f"\nSIGTERM with the idle clients connected: {exit_note}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--node", default="dgx-a100")
    ap.add_argument("--idle", type=int, default=1000, help="idle connections to hold")
    ap.add_argument("--probes", type=int, default=200, help="probes per path and state")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds between opening and measuring")
    ap.add_argument("--after", type=float, default=10.0, help="seconds to wait for idle timeouts")
    args = ap.parse_args()
    asyncio.run(main(args.node, args.idle, args.probes, args.settle, args.after))
