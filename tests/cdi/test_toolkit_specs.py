"""NVIDIA's own `nvidia-ctk cdi generate` (v1.20.2, built here) on a simulated node's driver root.

What a node with the toolkit in CDI mode has, made the way the node makes it: a driver root
(`topo_testkit.driver_root`: versioned driver libraries, `nvidia-smi`, GSP firmware, `/dev/nvidia*`
made with mknod) whose `libnvidia-ml.so.1` is our NVML shim answering for the GPUs of our own
`discover --format json` of a simulated DGX H100, and the toolkit's spec generated from it for
both device-name strategies and for its default. Checked as a user of the spec would:

- the spec names every GPU our daemon serves (`nvidia.com/gpu=<index>` / `=<UUID>`), each with
  its own device node (195:<minor>), and nothing else but `all`;
- it mounts every driver library, `nvidia-smi` and the firmware at the paths a container expects,
  from files under the driver root, and links the sonames (`libnvidia-ml.so.1`) through its hook;
- the CDI project's own library (tests/cdi/validate) accepts it and, in one directory with our
  device-plugin specs, loads both without a conflict and injects `nvidia.com/gpu=<n>` beside
  our names;
- the `nvidia-smi` of that root, run as a container would, lists the GPUs by the UUIDs we serve.

DRA prepare and the device plugin's `--cdi-specs external` use these names: tests/dra/test_toolkit_names.py.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from topo_testkit import driver_root as dr
from topo_testkit import nvidia_toolkit as tk

from plugin.cdi_files.writer import CdiSpecWriter
from plugin.model.cdi import CdiOptions, spec_for_resource

from cdi_nodes import resources_of

NODE = "dgx-h100"


@pytest.fixture(scope="module")
def ctk() -> str:
    path, why = tk.build("nvidia-ctk")
    if path is None:
        tk.skip_or_fail(why)
    return str(path)


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> tuple[dict, dr.DriverRoot]:
    if os.geteuid() != 0:
        tk.skip_or_fail("the simulated driver root's /dev/nvidia* nodes are made with mknod, which needs root")
    report = dr.discover(NODE)
    try:
        root = dr.build_driver_root(tmp_path_factory.mktemp("driver-root"), dr.gpus_from_discover(report))
    except dr.DriverRootError as e:
        tk.skip_or_fail(str(e))
    return report, root


def our_gpus(report: dict) -> list[dict]:
    return sorted((d for d in report["devices"] if d["kind"] == "gpu"), key=lambda d: d["index"])


@pytest.mark.parametrize("strategy", ["index", "uuid"])
def test_the_toolkit_names_each_gpu_we_serve_with_its_own_device_node(ctk, node, tmp_path, strategy) -> None:
    report, root = node
    spec = tk.generate(ctk, root.path, tmp_path / "nvidia.yaml", [strategy])
    assert spec["kind"] == "nvidia.com/gpu"
    gpus = our_gpus(report)
    assert len(gpus) == 8
    want = [str(g["index"]) for g in gpus] if strategy == "index" else [g["uuid"] for g in gpus]
    assert sorted(tk.device_names(spec)) == sorted([*want, "all"])
    for name, gpu in zip(want, root.gpus):
        (device,) = [d for d in spec["devices"] if d["name"] == name]
        nodes = device["containerEdits"]["deviceNodes"]
        assert [(n["path"], n["hostPath"], n["major"], n.get("minor", 0)) for n in nodes] == [
            (f"/dev/nvidia{gpu.minor}", str(root.host(f"/dev/nvidia{gpu.minor}")), 195, gpu.minor)]


def test_the_spec_mounts_the_driver_libraries_binaries_and_firmware_from_the_driver_root(ctk, node, tmp_path) -> None:
    _, root = node
    spec = tk.generate(ctk, root.path, tmp_path / "nvidia.yaml", ["uuid"])
    mounts = tk.mounted_paths(spec)
    for inside in [*root.libraries, *root.binaries, *root.firmware]:
        assert mounts.get(inside) == str(root.host(inside)), (inside, sorted(mounts))
        assert Path(mounts[inside]).is_file()
    common = spec["containerEdits"]
    assert {n["path"] for n in common["deviceNodes"]} == {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    # The sonames a program loads by are links the toolkit's hook makes in the container.
    links = [a for h in common["hooks"] if "create-symlinks" in h["args"] for a in h["args"]]
    assert f"libnvidia-ml.so.{root.version}::/{dr.LIB_DIR}/libnvidia-ml.so.1" in links
    assert f"libcuda.so.{root.version}::/{dr.LIB_DIR}/libcuda.so.1" in links
    # NVIDIA's runtime hook, where installed, must add nothing more: the spec says so itself.
    assert "NVIDIA_VISIBLE_DEVICES=void" in common["env"]


def test_the_toolkits_default_names_every_gpu_both_by_index_and_by_uuid(ctk, node, tmp_path) -> None:
    """What `--toolkit-cdi-names` relies on by default: a spec generated with no strategy has the UUID names."""
    report, root = node
    spec = tk.generate(ctk, root.path, tmp_path / "nvidia.yaml")
    gpus = our_gpus(report)
    want = [str(g["index"]) for g in gpus] + [g["uuid"] for g in gpus] + ["all"]
    assert sorted(tk.device_names(spec)) == sorted(want)


def test_the_cdi_library_loads_the_toolkit_spec_beside_ours_and_injects_both(cdi_validator, ctk, node,
                                                                             tmp_path) -> None:
    report, root = node
    tk.generate(ctk, root.path, tmp_path / "nvidia.yaml", ["index", "uuid"])
    (gpu_resource, *_) = resources_of(NODE, "uuid")
    ours = spec_for_resource(gpu_resource, CdiOptions())
    assert ours is not None
    CdiSpecWriter(str(tmp_path)).sync([ours])
    first = our_gpus(report)[0]["uuid"]
    result = cdi_validator.run(tmp_path, inject=[[ours.qualified(first), f"nvidia.com/gpu={first}"],
                                                 ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]])
    assert result.ok, (result.report, result.stderr)
    assert result.file("nvidia.yaml")["error"] is None
    assert not result.report["cacheErrors"]
    both, two = result.report["injections"]
    assert {n["path"] for n in both["deviceNodes"]} >= {"/dev/nvidia0", "/dev/nvidiactl"}
    assert {n["path"] for n in two["deviceNodes"]} & {f"/dev/nvidia{i}" for i in range(8)} == {"/dev/nvidia0",
                                                                                                "/dev/nvidia1"}


def test_the_driver_roots_nvidia_smi_lists_the_gpus_we_serve(node) -> None:
    report, root = node
    smi = subprocess.run([str(root.host("/usr/bin/nvidia-smi")), "-L"], capture_output=True, text=True, timeout=60,
                         env={"NVML_PROBE_LIBRARY": str(root.host(f"/{dr.LIB_DIR}/libnvidia-ml.so.1"))})
    assert smi.returncode == 0, smi.stderr
    assert smi.stdout.splitlines() == [f"GPU {g['index']}: {g['model']} (UUID: {g['uuid']})" for g in our_gpus(report)]


def test_in_a_container_with_two_gpu_nodes_the_shim_lists_exactly_those_two(node, tmp_path) -> None:
    """What makes the cluster checks mean something: NVML in a container sees the GPUs whose nodes it got."""
    report, root = node
    rootfs = tmp_path / "rootfs"
    libdir = rootfs / dr.LIB_DIR
    libdir.mkdir(parents=True)
    # What the toolkit's spec gives a container: the versioned library, the soname link its hook makes.
    lib = f"libnvidia-ml.so.{root.version}"
    shutil.copyfile(root.host(f"/{dr.LIB_DIR}/{lib}"), libdir / lib)
    os.symlink(lib, libdir / "libnvidia-ml.so.1")
    (rootfs / "dev").mkdir()
    for minor in (3, 6):
        os.mknod(rootfs / "dev" / f"nvidia{minor}", 0o666 | stat.S_IFCHR, os.makedev(195, minor))
    shutil.copyfile(root.host("/usr/bin/nvidia-smi"), rootfs / "nvml-probe")
    os.chmod(rootfs / "nvml-probe", 0o755)
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    probe = subprocess.run([chroot, str(rootfs), "/nvml-probe"], capture_output=True, text=True, timeout=60, env={})
    assert probe.returncode == 0, probe.stderr
    gpus = our_gpus(report)
    assert probe.stdout.splitlines() == [f"nvml: 2 GPUs, driver {root.version}",
                                         f"GPU 0: {gpus[3]['model']} (UUID: {gpus[3]['uuid']})",
                                         f"GPU 1: {gpus[6]['model']} (UUID: {gpus[6]['uuid']})"]
