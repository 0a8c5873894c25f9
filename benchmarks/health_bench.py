"""GPU health monitor (plugin/health): how fast an XID reaches the servers, how fast stop joins, storms.

Printed tables, not pass/fail (the timings tests/nvml/test_health.py used to assert live here).
The monitor thread runs on the NVML double (tests/support/topo_testkit/fake_nvml.py), a simulated
DGX A100: real threads and a real blocking wait, no GPU.

1. XID → `on_change`: the time from `inject_xid` (a RESET_GPU XID on a Healthy GPU) to the
   monitor's callback, N times (each GPU reset in between).
2. `stop()`: the time to join the thread, with the wait timeout at 200 ms.
3. Storm: 10,000 mixed XIDs across 8 GPUs (tests/reliability/test_xid_storm.py's mix): events
   per second, log lines written, heap growth.

Usage: python benchmarks/health_bench.py [--events N]
"""

from __future__ import annotations

import argparse
import logging
import queue
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from topo_testkit.fake_nvml import FakeNvml

from plugin.health.monitor import GpuHealthMonitor
from plugin.health.options import GpuHealthOptions
from plugin.sources import load_simulated
from plugin.sources.nvml_gpus import NvmlGpuSource


def rig(tmp: str, **kw):
    fake = FakeNvml(load_simulated("dgx-a100"))
    gpus = NvmlGpuSource(nvml=fake, sysfs_root=f"{tmp}/sys").load().gpus
    q: queue.Queue = queue.Queue()
    mon = GpuHealthMonitor(fake, gpus, GpuHealthOptions(**kw), lambda h: q.put((time.perf_counter(), h)))
    mon.start()
    assert fake.wait_registered(timeout=10.0)
    return fake, mon, q


def latency(n: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        fake, mon, q = rig(tmp, quiet_period_s=0.0, wait_timeout_ms=50, probe_interval_s=0.01)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fake.inject_xid("GPU3", 95, recovery_action=1)
            while True:
                t, h = q.get(timeout=10)
                if h["GPU3"].health == "Unhealthy":
                    out.append((t - t0) * 1000)
                    break
            fake.reset_gpu("GPU3")
            while q.get(timeout=10)[1]["GPU3"].health != "Healthy":
                pass
        mon.stop(timeout=10)
        return out


def stop_time(n: int) -> list[float]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(n):
            _fake, mon, _q = rig(tmp, wait_timeout_ms=200)
            t0 = time.perf_counter()
            mon.stop(timeout=10)
            out.append((time.perf_counter() - t0) * 1000)
    return out


def storm(events: int) -> tuple[float, int, int]:
    app = [13, 31, 43, 8, 94, 45, 63]
    faults = {2: [48, 95], 3: [109, 119, 120], 4: [79, 46], 5: [79], 6: [57, 48], 7: [61, 79, 62]}
    rng = random.Random(29)
    plan = [(f"GPU{i % 8}", rng.choice(app + faults.get(i % 8, []))) for i in range(events)]
    lines: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = lines.append  # type: ignore[method-assign]  # a counting handler, no formatting
    logger = logging.getLogger("plugin.health")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    with tempfile.TemporaryDirectory() as tmp:
        fake, mon, _q = rig(tmp, quiet_period_s=3600, wait_timeout_ms=50, state_directory=f"{tmp}/state")
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        for gpu, xid in plan:
            fake.inject_xid(gpu, xid)
        while mon.stats.events < len(plan):
            time.sleep(0.01)
        took = time.perf_counter() - t0
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        mon.stop(timeout=10)
    logger.removeHandler(handler)
    return len(plan) / took, len(lines), grown


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--samples", type=int, default=50)
    a = ap.parse_args()
    lat = latency(a.samples)
    stops = stop_time(5)
    rate, lines, grown = storm(a.events)
    print("| measure | value |")
    print("|---|---|")
    print(f"| XID -> on_change, median / max over {len(lat)} | {statistics.median(lat):.2f} ms / {max(lat):.2f} ms |")
    print(f"| stop() join (wait timeout 200 ms), median / max over {len(stops)} | "
          f"{statistics.median(stops):.0f} ms / {max(stops):.0f} ms |")
    print(f"| storm of {a.events} XIDs, 8 GPUs: events handled per second | {rate:,.0f} |")
    print(f"| storm: log lines written | {lines} |")
    print(f"| storm: Python heap growth (tracemalloc) | {grown / 1024:.0f} KiB |")


if __name__ == "__main__":
    main()
