"""Fixtures of the Multus e2e: the local cluster of tests/e2e/cluster with Multus and host-device.

The cluster, its build inputs and the skip-or-fail rule (TOPO_DP_REQUIRE_*: a missing piece
fails in CI) come from tests/e2e/cluster. On top: Multus (thin plugin) and host-device, built
from their pinned Go modules (./multus, ./host-device) by scripts/go_build_cached.sh, in a CNI
binary directory of this session that also links every plugin of Debian's set (the cluster's
bridge, host-local, loopback). Debian's containerd runs them: no CDI needed.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
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

import cluster_fixtures
import kubelet_build

#: (directory here, cache name, Go package built at the version the directory's go.mod pins)
PROGRAMS = (
    ("multus", "multus", "gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus"),
    ("host-device", "host-device", "github.com/containernetworking/plugins/plugins/main/host-device"),
)


def go_build(program: str, name: str, package: str) -> str:
    cmd = ["bash", str(ROOT / "scripts" / "go_build_cached.sh"), str(HERE / program), name, package]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        cluster_fixtures.unavailable(f"cannot build {name} ({' '.join(cmd)} exited {proc.returncode}):\n{tail}")
    return proc.stdout.strip().splitlines()[-1]


def multus_module_dir() -> pathlib.Path:
    """Multus's module source as the build downloaded it (its deployments/ hold the NAD CRD)."""
    m = re.search(r"gopkg\.in/k8snetworkplumbingwg/multus-cni\.v4 (v\S+)", (HERE / "multus" / "go.mod").read_text())
    assert m, "tests/e2e/multus/multus/go.mod requires no Multus version"
    d = kubelet_build.cache_dir() / "gomod" / "gopkg.in" / "k8snetworkplumbingwg" / f"multus-cni.v4@{m.group(1)}"
    if not d.is_dir():
        cluster_fixtures.unavailable(f"the Multus build left no module source at {d}")
    return d


def cni_bin_dir(directory: pathlib.Path, debian: pathlib.Path, built: dict[str, str]) -> pathlib.Path:
    """Debian's CNI plugins (symlinks) plus the built ones (hard links, or copies) in one directory."""
    for plugin in debian.iterdir():
        if plugin.name not in built:
            (directory / plugin.name).symlink_to(plugin)
    for name, path in built.items():
        try:
            os.link(path, directory / name)
        except OSError:  # another file system
            shutil.copy2(path, directory / name)
    return directory


@pytest.fixture(scope="session")
def cluster_inputs(tmp_path_factory) -> dict[str, Any]:
    inputs = cluster_fixtures.build_inputs()
    built = {name: go_build(program, name, package) for program, name, package in PROGRAMS}
    cni = cni_bin_dir(tmp_path_factory.mktemp("cni-bin"), inputs["bins"].cni_bin, built)
    bins = dataclasses.replace(inputs["bins"], cni_bin=cni)
    return {**inputs, "bins": bins, "multus_module": multus_module_dir()}
