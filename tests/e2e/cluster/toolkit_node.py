"""NVIDIA's toolkit on a cluster node: its spec for a simulated node's driver root, and a pod that checks it.

For tests/e2e/cluster and tests/e2e/dra: `make_toolkit_spec` builds the simulated driver root of the
node's GPUs (topo_testkit.driver_root: our NVML shim, driver library files, the static `nvidia-smi`,
/dev/nvidia* by mknod) and runs NVIDIA's `nvidia-ctk cdi generate` on it with `nvidia-cdi-hook`
(both v1.20.2, built from their module) as the hook, the way a node's operator does.
`PROBE` is the container's side: which /dev/nvidia* it has, whether each file the spec mounts is
there, where `libnvidia-ml.so.1` points (the toolkit's hook makes that link), and what
`nvidia-smi -L` (the probe, loading `libnvidia-ml.so.1` from those mounts) prints.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
from dataclasses import dataclass
from typing import Any

import pytest
from topo_testkit import driver_root as dr
from topo_testkit import nvidia_toolkit as tk
from workloads import REPORT_MARK

from plugin.model.cdi.toolkit import DEFAULT_TOOLKIT_DIRS

ROOT = pathlib.Path(__file__).resolve().parents[3]
DIRS = DEFAULT_TOOLKIT_DIRS

PROBE = f"""
import json, os, subprocess, sys, time
paths = json.loads(sys.argv[1])
devices = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit())
smi = subprocess.run(["/usr/bin/nvidia-smi", "-L"], capture_output=True, text=True)
lib = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
print({REPORT_MARK!r} + json.dumps({{"devices": devices, "files": {{p: os.path.isfile(p) for p in paths}},
      "nvml_link": os.readlink(lib) if os.path.islink(lib) else None, "smi_rc": smi.returncode,
      "smi": smi.stdout.splitlines(), "smi_err": smi.stderr[-500:]}}), flush=True)
time.sleep(10**9)
"""


@dataclass
class ToolkitSpec:
    """A spec the toolkit generated for the node, and what the tests compare against."""

    path: pathlib.Path
    spec: dict[str, Any]
    root: dr.DriverRoot
    uuids: dict[int, str]  # GPU index -> UUID, as our discover reports it

    @property
    def mounted(self) -> list[str]:
        """Container paths of the driver's files the spec mounts (from the driver root; not its /dev/null marker)."""
        return sorted(inside for inside, host in tk.mounted_paths(self.spec).items()
                      if host.startswith(str(self.root.path) + "/"))


def tools() -> tuple[str, str]:
    ctk, why = tk.build("nvidia-ctk")
    hook, why_hook = tk.build("nvidia-cdi-hook")
    if ctk is None or hook is None:
        reason = why or why_hook
        if tk.required():
            pytest.fail(reason)
        pytest.skip(reason)
    return str(ctk), str(hook)


def make_toolkit_spec(w: pathlib.Path, node_file: pathlib.Path, strategies: tuple[str, ...] = ("uuid",),
                      name: str = "nvidia.yaml") -> ToolkitSpec:
    ctk, hook = tools()
    w.mkdir(parents=True, exist_ok=True)
    report = json.loads(subprocess.run([str(ROOT / ".venv" / "bin" / "topo-device-plugin"), "discover", "--simulate",
                                        str(node_file), "--format", "json"], capture_output=True, text=True,
                                       check=True, timeout=120).stdout)
    root_dir = w / "driver-root"
    root = dr.build_driver_root(root_dir, dr.gpus_from_discover(report)) if not root_dir.exists() else None
    if root is None:
        root = dr.DriverRoot(root_dir, dr.DRIVER_VERSION, dr.gpus_from_discover(report))
    out = w / f"{'-'.join(strategies)}-{name}"
    spec = tk.generate(ctk, root.path, out, strategies, hook_path=hook)
    uuids = {d["index"]: d["uuid"] for d in report["devices"] if d["kind"] == "gpu"}
    return ToolkitSpec(out, spec, root, uuids)
