"""Memory and start-up of the daemon per time-slicing replica count (printed table, not pass/fail).

For each count: a real daemon process (`python -m plugin serve --simulate dgx-a100`, 8 GPUs, UUID
IDs, every GPU time-sliced `replicas` times) registers with the kubelet stand-in over real unix
sockets; the table shows the seconds from launch to the first full device list, the resident
memory then (VmRSS) and the peak (VmHWM), read from /proc. The numbers in docs/sharing.md come
from this script.

Usage: python benchmarks/replica_memory_bench.py [--replicas 100,300,600,1000,3125]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from topo_testkit import pythonpath_env

from topo_testkit.kubelet_standin import KubeletStandin

GPU = "nvidia.com/gpu"
GPUS = 8
CONFIG = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: {replicas}
"""


def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


async def measure(replicas: int) -> tuple[float, float, float]:
    """(seconds to the full list, RSS MiB, peak RSS MiB) of one daemon at `replicas` per GPU."""
    with tempfile.TemporaryDirectory(prefix="tdp-") as plugin_dir, tempfile.TemporaryDirectory() as work:
        config = os.path.join(work, "config.yaml")
        with open(config, "w") as f:
            f.write(CONFIG.format(replicas=replicas))
        kubelet = KubeletStandin(plugin_dir)
        await kubelet.start()
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "plugin", "serve", "--simulate", "dgx-a100", "--device-plugin-path", plugin_dir,
             "--device-id-strategy", "uuid", "--config", config],
            cwd=ROOT, env=pythonpath_env(dict(os.environ)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == GPUS * replicas, timeout=300)
            took = time.perf_counter() - started
            return took, status_kib(proc.pid, "VmRSS") / 1024, status_kib(proc.pid, "VmHWM") / 1024
        finally:
            proc.terminate()
            proc.wait(30)
            await kubelet.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", default="100,300,600,1000,3125", help="comma-separated replicas per GPU")
    args = ap.parse_args()
    print(f"{'replicas/GPU':>12} {'devices':>8} {'start s':>8} {'RSS MiB':>8} {'peak MiB':>9}")
    for n in (int(x) for x in args.replicas.split(",")):
        took, rss, peak = asyncio.run(measure(n))
        print(f"{n:>12} {GPUS * n:>8} {took:>8.1f} {rss:>8.1f} {peak:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
