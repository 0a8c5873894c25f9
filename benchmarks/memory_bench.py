"""Resident memory of the daemon per serving mode (printed table, not pass/fail).

Each mode is the real CLI (`python -m plugin serve ...`) as a child process, registered with the
in-package kubelet stand-in over real unix sockets; NVML is the double in
`tests/support/topo_testkit/fake_nvml.py`, launched through `topo_testkit.with_fake_nvml` (the
hardware boundary is the only thing replaced). Once every resource has sent its device list, and
again after `--calls` GetPreferredAllocation round trips, the table shows the daemon's VmRSS (and
its peak, VmHWM) and how many modules it imported, and whether the parts a mode does not use were
left out (jsonschema, the HTTP server's h11, the DRA client lightkube), as the daemon's own
`sys.modules` at exit (`topo_testkit.with_module_log`).

Usage: python benchmarks/memory_bench.py [--node dgx-a100] [--calls 200] [--hardware]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import signal
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from plugin.demo.kubelet_standin import KubeletStandin
from topo_testkit import pythonpath_env

GPU = "nvidia.com/gpu"
#: Modules a device-plugin daemon should not import unless its mode needs them.
OPTIONAL = ("jsonschema", "h11", "lightkube")
#: A 4-GPU node as `nvidia-smi topo -m` prints it.
TEXT_NODE = "older-driver-4gpu-tab-aligned.txt"


def status_mib(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def anon_file_mib(pid: int) -> str:
    """The RSS split into anonymous memory and file-backed pages (libraries: shared with other processes,
    reclaimable), from /proc/PID/smaps_rollup: real NVML's cost is mostly the second."""
    kb: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[-1] == "kB":
                    kb[parts[0].rstrip(":")] = int(parts[1])
    except OSError:
        return "-"
    anon = kb.get("Anonymous", 0)
    return f"{anon / 1024:.1f} / {(kb.get('Rss', 0) - anon) / 1024:.1f}"


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hardware_modes(node: str) -> list[tuple[str, list[str], list[str]]]:
    """On a GPU machine: this node's own devices (real NVML, sysfs NICs) beside the simulated node and the
    NVML double, all on the same machine, so the price of real NVML is a difference of one run."""
    return [
        ("device plugin, real NVML (this node)", ["plugin"], []),
        ("device plugin, NVML double", ["topo_testkit.with_fake_nvml", node], []),
        (f"device plugin, --simulate {node}", ["plugin"], ["--simulate", node]),
    ]


def modes(node: str, tmp: str) -> list[tuple[str, list[str], list[str]]]:
    """(label, launcher, serve arguments) per mode."""
    config = os.path.join(tmp, "config.yaml")
    with open(config, "w") as f:
        f.write("version: v1\nflags:\n  deviceIdStrategy: index\n")
    nvml = ["topo_testkit.with_fake_nvml", node]
    # The double reads a YAML node through the product's loader, which validates it (jsonschema in the
    # process, though the daemon itself never validates anything); `nvidia-smi topo -m` text is not.
    text = ["topo_testkit.with_fake_nvml", str(ROOT / "tests" / "sources" / "topo_outputs" / TEXT_NODE)]
    return [
        ("device plugin, NVML (4-GPU topo -m node)", text, []),
        ("device plugin, NVML", nvml, []),
        ("device plugin, NVML, --config", nvml, ["--config", config]),
        ("device plugin, NVML, --metrics-address", nvml, ["--metrics-address", f"127.0.0.1:{free_port()}"]),
        (f"device plugin, --simulate {node}", ["plugin"], ["--simulate", node]),
    ]


async def measure(label: str, launcher: list[str], args: list[str], calls: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="tdp-mem-") as d:
        kubelet = KubeletStandin(d)
        await kubelet.start()
        probe = os.path.join(d, "modules.txt")
        env = pythonpath_env(dict(os.environ))
        proc = subprocess.Popen([sys.executable, "-m", "topo_testkit.with_module_log", probe, *launcher, "serve", "--device-plugin-path", d,
                                 "--device-id-strategy", "index", "--log-level", "warning", *args],
                                cwd=ROOT, env=env)
        try:
            await kubelet.wait_for(lambda: bool(kubelet.clients) and all(c.devices for c in kubelet.clients.values()),
                                   timeout=60)
            await asyncio.sleep(1.0)
            registered = status_mib(proc.pid, "VmRSS")
            split = anon_file_mib(proc.pid)
            ids = sorted(kubelet.devices(GPU))
            for n in range(calls):
                await kubelet.preferred(GPU, ids, [], 1 + n % max(1, len(ids)))
            after = status_mib(proc.pid, "VmRSS")
            peak = status_mib(proc.pid, "VmHWM")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            await kubelet.stop()
        with open(probe) as f:
            modules = f.read().split()
    top = {m.split(".")[0] for m in modules}
    left_out = ", ".join(m for m in OPTIONAL if m not in top) or "-"
    return [label, f"{registered:.1f}", split, f"{after:.1f}", f"{peak:.1f}", str(len(modules)), left_out]


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731 (a one-line shorthand)
    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


async def main(node: str, calls: int, hardware: bool) -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="tdp-memcfg-") as tmp:
        for label, launcher, args in (hardware_modes(node) if hardware else modes(node, tmp)):
            rows.append(await measure(label, launcher, args, calls))
    print(f"\nDaemon resident memory per mode: node {node}, {calls} GetPreferredAllocation calls; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print(table(["mode", "RSS registered (MiB)", "anon / file", f"RSS after {calls} calls", "peak (VmHWM)",
                 "modules", "not imported"], rows))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--node", default="dgx-a100")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--hardware", action="store_true",
                    help="on a GPU machine: measure the daemon on this node's NVML GPUs beside the double")
    a = ap.parse_args()
    asyncio.run(main(a.node, a.calls, a.hardware))
