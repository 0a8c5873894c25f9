"""Test support for topo-device-plugin: the doubles at the hardware boundary and test-only glue.

Why a package under tests/ and not in `plugin/`: none of this is something an
operator runs, and the wheel (so the container image) must not ship a fake
NVML. pytest finds it through the `pythonpath` ini option in pyproject.toml;
subprocesses and benchmarks put `tests/support` on PYTHONPATH (`SUPPORT_DIR`).

- `fake_nvml`: `FakeNvml`, NVML answered from a node description;
- `sysfs_fixture`: generated sysfs, /dev and /proc trees of a GPU+NIC node;
- `with_fake_nvml`: run the real CLI with the fake NVML as its `pynvml`;
- `nvidia_configs`: NVIDIA device plugin config files, verbatim, for the compatibility tests;
- `tm_cases`: the Topology Manager model's JSON case evaluators for the
  differential test against the real kubelet;
- `kubelet_standin`, `device_manager`: the demo's kubelet stand-in and
  admission walk (plugin/demo/) with the test hooks on top (kubelet restarts,
  a held `Register`, stream counters, the call log, pod release).
"""

from __future__ import annotations

import os
import pathlib

#: The directory to put on PYTHONPATH so a child process can import `topo_testkit`.
SUPPORT_DIR = str(pathlib.Path(__file__).resolve().parent.parent)
#: The project checkout.
ROOT = pathlib.Path(SUPPORT_DIR).parent.parent


def _shared_dir() -> pathlib.Path:
    """The read-only `shared/` folder (specs, real topologies): `$TOPO_DP_SHARED_DIR`, else the nearest
    `shared/` beside the checkout or one of its parents (a worktree may sit a level deeper)."""
    if os.environ.get("TOPO_DP_SHARED_DIR"):
        return pathlib.Path(os.environ["TOPO_DP_SHARED_DIR"])
    for parent in ROOT.parents:
        if (parent / "shared" / "topologies").is_dir():
            return parent / "shared"
    return ROOT.parent / "shared"


SHARED_DIR = _shared_dir()


def pythonpath_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) with `tests/support` prepended to PYTHONPATH."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (SUPPORT_DIR, out.get("PYTHONPATH", "")) if p)
    return out
