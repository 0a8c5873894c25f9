"""Fixtures of the Multus e2e: the local cluster of tests/e2e/cluster with Multus and host-device.

The cluster, its build inputs and the skip-or-fail rule (TOPO_DP_REQUIRE_*: a missing piece
fails in CI) come from tests/e2e/cluster. On top: Multus (thin plugin) and host-device, built
from their pinned Go modules (./multus, ./host-device) by scripts/go_build_cached.sh, in a CNI
binary directory of this session that also links every plugin of Debian's set (the cluster's
bridge, host-local, loopback). Debian's containerd runs them: no CDI needed.

Multus is v4.3.0 with multus-cni PR #1492 applied (./multus/tools.go says why and how): the
module is downloaded, copied with the patch applied into a build directory keyed by the
patch and go.mod/go.sum, and built there (`replace` of the module by that ./src).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
for p in (HERE.parent / "cluster", ROOT / "tests" / "kubelet", ROOT / "scripts", ROOT):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import build_cache
import cluster_fixtures
import kubelet_build

MULTUS_MODULE = "gopkg.in/k8snetworkplumbingwg/multus-cni.v4"
MULTUS_PATCH = HERE / "multus" / "multus-pr1492.patch"
HOST_DEVICE = "github.com/containernetworking/plugins/plugins/main/host-device"


def go_build(directory: pathlib.Path, name: str, package: str) -> str:
    cmd = ["bash", str(ROOT / "scripts" / "go_build_cached.sh"), str(directory), name, package]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        cluster_fixtures.unavailable(f"cannot build {name} ({' '.join(cmd)} exited {proc.returncode}):\n{tail}")
    return proc.stdout.strip().splitlines()[-1]


def multus_version() -> str:
    m = re.search(r"^require gopkg\.in/k8snetworkplumbingwg/multus-cni\.v4 (v\S+)$",
                  (HERE / "multus" / "go.mod").read_text(), re.M)
    assert m, "tests/e2e/multus/multus/go.mod requires no Multus version"
    return m.group(1)


def multus_module_dir() -> pathlib.Path:
    """Multus's released module source, as the Go module proxy serves it (its deployments/ hold the NAD CRD)."""
    version = multus_version()
    with tempfile.TemporaryDirectory() as empty:  # outside any module: download names module@version alone
        env = {**kubelet_build.go_env(), "GOFLAGS": "-mod=mod", "GO111MODULE": "on"}
        proc = subprocess.run([kubelet_build.find_go(), "mod", "download", "-json", f"{MULTUS_MODULE}@{version}"],
                              cwd=empty, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        cluster_fixtures.unavailable(f"cannot download {MULTUS_MODULE}@{version}:\n{proc.stdout}{proc.stderr}")
    d = pathlib.Path(json.loads(proc.stdout)["Dir"])
    if not d.is_dir():
        cluster_fixtures.unavailable(f"the Multus download left no module source at {d}")
    return d


def patched_multus_dir(base: pathlib.Path) -> pathlib.Path:
    """A build directory: this directory's go.mod, go.sum, tools.go, and ./src = the release with the patch.

    Keyed by those files and the patch, so an edit of either makes a new one; made under a temporary
    name and renamed, so an interrupted copy or patch is never taken for a finished one.
    """
    files = [HERE / "multus" / n for n in ("go.mod", "go.sum", "tools.go")] + [MULTUS_PATCH]
    key = build_cache.content_key(*(p.name.encode() + p.read_bytes() for p in files))
    out = build_cache.subdir("src") / f"multus-{key}"
    if (out / "src").is_dir():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base, tmp / "src")
    for d, _, names in os.walk(tmp):  # the module cache's files are read-only
        os.chmod(d, 0o755)
        for n in names:
            os.chmod(os.path.join(d, n), 0o644)
    proc = subprocess.run(["patch", "-p1", "--batch", "--forward", "-i", str(MULTUS_PATCH)], cwd=tmp / "src",
                          capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"{MULTUS_PATCH.name} does not apply to {base.name}:\n{proc.stdout}{proc.stderr}")
    for p in files[:3]:
        shutil.copy2(p, tmp / p.name)
    try:
        os.replace(tmp, out)
    except OSError:  # another worker finished first
        shutil.rmtree(tmp, ignore_errors=True)
    for old in out.parent.glob("multus-*"):  # copies of an older patch or go.mod
        if old != out and ".tmp" not in old.name:
            shutil.rmtree(old, ignore_errors=True)
    return out


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
    release = multus_module_dir()
    patched = patched_multus_dir(release)
    built = {"multus": go_build(patched, f"multus-{patched.name.split('-')[-1][:8]}", f"{MULTUS_MODULE}/cmd/multus"),
             "host-device": go_build(HERE / "host-device", "host-device", HOST_DEVICE)}
    cni = cni_bin_dir(tmp_path_factory.mktemp("cni-bin"), inputs["bins"].cni_bin, built)
    bins = dataclasses.replace(inputs["bins"], cni_bin=cni)
    return {**inputs, "bins": bins, "multus_module": release}
