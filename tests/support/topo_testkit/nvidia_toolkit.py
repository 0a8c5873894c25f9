"""NVIDIA's container toolkit, built from its Go module, run the way a node runs it.

`build(program)` builds `nvidia-ctk` or `nvidia-cdi-hook` (tests/support/nvidia_ctk, v1.20.2,
cached by scripts/go_build_cached.sh); `generate(...)` runs `nvidia-ctk cdi generate` against a
driver root (`topo_testkit.driver_root`) as an operator or the toolkit's CDI refresh service
would, and returns the spec it wrote. `require(...)` is the skip-or-fail rule of the CDI tools:
without a Go toolchain or gcc a test skips and says why, except under CI
(TOPO_DP_REQUIRE_CDI_TOOLS=1), where that is a failure.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "tests" / "support" / "nvidia_ctk" / "build.sh"
#: The pinned release (tests/support/nvidia_ctk/go.mod).
VERSION = "v1.20.2"


def build(program: str = "nvidia-ctk") -> tuple[str | None, str]:
    """(path of the binary, "") or (None, why it could not be built)."""
    proc = subprocess.run(["bash", str(BUILD), program], capture_output=True, text=True, timeout=1800)
    if proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.strip().splitlines()[-1], ""
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
    return None, f"cannot build {program} ({BUILD} exited {proc.returncode}):\n{tail}"


def required() -> bool:
    return os.environ.get("TOPO_DP_REQUIRE_CDI_TOOLS") == "1"


def skip_or_fail(reason: str) -> NoReturn:
    """Skip where the toolkit cannot exist here; a failure under CI's TOPO_DP_REQUIRE_CDI_TOOLS=1."""
    import pytest  # here: only tests call this; scripts import the module too

    if required():
        pytest.fail(reason)
    pytest.skip(reason)


def generate(ctk: str, driver_root: Path, output: Path, strategies: Sequence[str] = (),
             hook_path: str | None = None, extra: Sequence[str] = ()) -> dict[str, Any]:
    """`nvidia-ctk cdi generate --driver-root R --dev-root R --output OUTPUT` (strategies as given, else the
    toolkit's default); returns the spec. Raises CalledProcessError with the toolkit's log on failure."""
    cmd = [ctk, "cdi", "generate", "--driver-root", str(driver_root), "--dev-root", str(driver_root),
           "--output", str(output)]
    for s in strategies:
        cmd += ["--device-name-strategy", s]
    if hook_path:
        cmd += ["--nvidia-cdi-hook-path", hook_path]
    cmd += list(extra)
    # NVML is found under the driver root (its ld cache or library dirs); nothing of this machine's is used.
    subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300)
    loaded = yaml.safe_load(output.read_text())
    assert isinstance(loaded, dict), f"{output}: not a CDI spec"
    return loaded


def mounted_paths(spec: dict[str, Any]) -> dict[str, str]:
    """containerPath -> hostPath of the spec's common mounts (what any of its devices brings)."""
    return {m["containerPath"]: m["hostPath"] for m in (spec.get("containerEdits") or {}).get("mounts") or []}


def device_names(spec: dict[str, Any]) -> list[str]:
    return [d["name"] for d in spec.get("devices") or []]


def generate_loaded(path: Path) -> dict[str, Any]:
    """A spec file the toolkit wrote, loaded (YAML or JSON)."""
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict), f"{path}: not a CDI spec"
    return loaded
