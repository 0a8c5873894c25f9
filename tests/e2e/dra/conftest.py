"""Fixtures of the DRA e2e: the local cluster of tests/e2e/cluster, on a containerd with CDI.

The cluster, its build inputs and the skip-or-fail rule (TOPO_DP_REQUIRE_KUBELET_E2E /
TOPO_DP_REQUIRE_CHART_TOOLS: a missing tool fails in CI) come from tests/e2e/cluster. The one
difference: containerd v2 built from its Go module (tests/e2e/dra/containerd, cached by
scripts/go_build_cached.sh) with CDI on for /var/run/cdi, because Debian's containerd 1.6.20
cannot inject CDI devices. Its runc shim of the same release (tests/e2e/dra/containerd-shim)
sits beside it, as `containerd` and `containerd-shim-runc-v2` in a directory of this session
(hard links, or copies) put first in containerd's PATH.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Any

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
for p in (HERE.parent / "cluster", ROOT / "tests" / "kubelet", ROOT / "scripts", ROOT):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import cluster_fixtures  # noqa: E402


def _go_build(program: str, name: str) -> str:
    cmd = ["bash", str(ROOT / "scripts" / "go_build_cached.sh"), str(HERE / program), name]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        cluster_fixtures.unavailable(f"cannot build {name} ({' '.join(cmd)} exited {proc.returncode}):\n{tail}")
    return proc.stdout.strip().splitlines()[-1]


def containerd_with_cdi(directory: pathlib.Path) -> str:
    """`directory`/containerd and `directory`/containerd-shim-runc-v2, built (cached) from containerd v2."""
    for program, name, as_name in (("containerd", "containerd-v2", "containerd"),
                                   ("containerd-shim", "containerd-shim-v2", "containerd-shim-runc-v2")):
        built = _go_build(program, name)
        try:
            os.link(built, directory / as_name)
        except OSError:  # another file system
            shutil.copy2(built, directory / as_name)
    return str(directory / "containerd")


@pytest.fixture(scope="session")
def cluster_inputs(tmp_path_factory) -> dict[str, Any]:
    inputs = cluster_fixtures.build_inputs()
    containerd = containerd_with_cdi(tmp_path_factory.mktemp("containerd-v2"))
    bins = dataclasses.replace(inputs["bins"], containerd=containerd, cdi=True)
    return {**inputs, "bins": bins}
