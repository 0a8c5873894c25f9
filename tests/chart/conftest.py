"""The chart tests' tools: a real `helm` and the chart-decode program, built once per session.

Both come from scripts that build them from their Go modules and cache them under
~/.cache/topo-device-plugin/bin (cold builds take minutes, warm ones reuse the binary).
Where no Go toolchain (or no module proxy) is available the tests skip and say why; set
TOPO_DP_REQUIRE_CHART_TOOLS=1 to make that a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DECODE_DIR = Path(__file__).resolve().parent / "decode"


def _build(cmd: list[str], what: str) -> str:
    """Run a build script that prints a binary path; skip (or fail) with the reason."""
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.strip().splitlines()[-1]
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
    reason = f"cannot build {what} ({' '.join(cmd)} exited {proc.returncode}):\n{tail}"
    print(reason, file=sys.stderr)
    if os.environ.get("TOPO_DP_REQUIRE_CHART_TOOLS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def helm() -> str:
    return _build(["bash", str(ROOT / "scripts" / "install_helm.sh")], "helm")


@pytest.fixture(scope="session")
def decoder() -> str:
    return _build(["bash", str(DECODE_DIR / "build.sh")], "chart-decode")
