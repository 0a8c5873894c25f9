"""DRA prepare names NVIDIA's toolkit's CDI device beside ours, checked against the spec the toolkit generated.

The toolkit's spec here is NVIDIA's own: `nvidia-ctk cdi generate` (v1.20.2, built from its
module) run on a simulated DGX H100's driver root whose NVML is our shim
(`topo_testkit.driver_root`), the way a node generates it. The driver runs with
`--dra-toolkit-cdi uuid` (or `index`) over real gRPC; what the kubelet is told per device is
what a user's container gets:

- a GPU: our claim device (its exact device node, our env) and `nvidia.com/gpu=<UUID>` (or
  `=<index>`), the toolkit's device whose spec brings the driver's libraries; a NIC: ours alone;
- no toolkit spec on the node, or one without the GPU's name (generated with the other
  strategy): the claim fails with the reason and the `nvidia-ctk cdi generate` command, and
  nothing is written or recorded, so no container starts without its libraries.

The device plugin's `--cdi-specs external` names get the same check in Allocate (last tests).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from kubelet_standin import register, registration_sockets
from topo_testkit import driver_root as dr
from topo_testkit import nvidia_toolkit as tk

from allocator import AllocationError
from allocator.topology import Device, DeviceKind
from plugin.dra import DraDriver, DraOptions, SliceOptions
from plugin.runtime.compose.dra import dra_driver
from plugin.model.cdi.toolkit import ToolkitSpecError, ToolkitSpecs, toolkit_name
from plugin.model.gpu_allocate import GpuAllocateBuilder, GpuAllocateOptions
from plugin.sources.simulated import load_simulated

NODE = "node-a"
DRIVER = "topo.dev"
SIMULATED = "dgx-h100"


@pytest.fixture(scope="module")
def toolkit_specs(tmp_path_factory) -> dict:
    """The toolkit's specs of the simulated node, one directory per strategy; and our discover report."""
    ctk, why = tk.build("nvidia-ctk")
    if ctk is None:
        tk.skip_or_fail(why)
    if os.geteuid() != 0:
        tk.skip_or_fail("the simulated driver root's /dev/nvidia* nodes are made with mknod, which needs root")
    report = dr.discover(SIMULATED)
    try:
        root = dr.build_driver_root(tmp_path_factory.mktemp("driver-root"), dr.gpus_from_discover(report))
    except dr.DriverRootError as e:
        tk.skip_or_fail(str(e))
    out = {"report": report, "root": root}
    for strategy in ("uuid", "index"):
        d = tmp_path_factory.mktemp(f"etc-cdi-{strategy}")
        tk.generate(str(ctk), root.path, d / "nvidia.yaml", [strategy])
        out[strategy] = d
    return out


@pytest.fixture
def roots():
    base = tempfile.mkdtemp(prefix="dra-tk-", dir="/tmp")  # unix socket paths are limited to 107 bytes
    yield os.path.join(base, "kubelet"), os.path.join(base, "cdi")
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def start_driver(roots, kube_api):
    started: list[DraDriver] = []

    async def start(toolkit: str, dirs: list[Path]) -> DraDriver:
        opts = DraOptions(slices=SliceOptions(node_name=NODE, driver_name=DRIVER), kubelet_root=roots[0],
                          cdi_root=roots[1], instance_id="pod-1", resync_s=3600, toolkit_cdi=toolkit,
                          toolkit_dirs=tuple(str(d) for d in dirs))
        drv = dra_driver(opts, kube_api)
        await drv.start(load_simulated(SIMULATED))
        started.append(drv)
        return drv

    yield start
    for d in started:
        await d.stop()


def result(device: str, request: str) -> dict:
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device}


CLAIM = [result("gpu-0", "gpus"), result("gpu-5", "gpus"), result("nic-mlx5-0", "nics")]


def gpu(report: dict, index: int) -> dict:
    (g,) = [d for d in report["devices"] if d["kind"] == "gpu" and d["index"] == index]
    return g


@pytest.mark.parametrize("strategy", ["uuid", "index"])
async def test_each_gpu_gets_the_toolkits_device_beside_ours_and_a_nic_ours_alone(
        toolkit_specs, start_driver, roots, apiserver, strategy) -> None:
    await start_driver(strategy, [toolkit_specs[strategy]])
    plugin = await register(registration_sockets(roots[0])[0])
    uid = apiserver.add_claim("team", "two-gpus", CLAIM)
    entry = (await plugin.prepare(("team", uid, "two-gpus"))).claims[uid]
    assert entry.error == ""
    report = toolkit_specs["report"]
    name = {0: gpu(report, 0)["uuid"], 5: gpu(report, 5)["uuid"]} if strategy == "uuid" else {0: "0", 5: "5"}
    got = {d.device_name: list(d.cdi_device_ids) for d in entry.devices}
    assert got == {
        "gpu-0": [f"{DRIVER}/claim={uid}-gpu-0", f"nvidia.com/gpu={name[0]}"],
        "gpu-5": [f"{DRIVER}/claim={uid}-gpu-5", f"nvidia.com/gpu={name[5]}"],
        "nic-mlx5-0": [f"{DRIVER}/claim={uid}-nic-mlx5-0"],
    }
    # Every toolkit name given is one the toolkit's own spec defines.
    spec_names = set(tk.device_names(tk.generate_loaded(toolkit_specs[strategy] / "nvidia.yaml")))
    assert {n.split("=", 1)[1] for ids in got.values() for n in ids if n.startswith("nvidia.com/")} <= spec_names


async def test_without_the_toolkits_spec_prepare_fails_with_the_fix_and_writes_nothing(
        start_driver, roots, apiserver, tmp_path) -> None:
    empty = tmp_path / "etc-cdi"
    empty.mkdir()
    (empty / "other-vendor.json").write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "example.com/fpga",
                                                         "devices": [{"name": "0", "containerEdits": {}}]}))
    await start_driver("uuid", [empty, tmp_path / "absent"])
    plugin = await register(registration_sockets(roots[0])[0])
    uid = apiserver.add_claim("team", "no-libs", CLAIM)
    error = (await plugin.prepare(("team", uid, "no-libs"))).claims[uid].error
    assert "no CDI spec of kind nvidia.com/gpu" in error and str(empty) in error
    assert "without the driver's libraries" in error
    assert "nvidia-ctk cdi generate --device-name-strategy uuid" in error
    assert not os.path.exists(os.path.join(roots[1], f"{DRIVER}-claim_{uid}.json"))
    recorded = Path(roots[0], "plugins", DRIVER, "checkpoint.json")
    assert not recorded.exists() or uid not in json.loads(recorded.read_text())["claims"]
    assert not error.startswith("internal error")


async def test_a_spec_without_the_gpus_name_fails_the_claim_naming_the_file_and_the_strategy(
        toolkit_specs, start_driver, roots, apiserver) -> None:
    await start_driver("uuid", [toolkit_specs["index"]])  # generated with index names only
    plugin = await register(registration_sockets(roots[0])[0])
    uid = apiserver.add_claim("team", "stale", CLAIM)
    error = (await plugin.prepare(("team", uid, "stale"))).claims[uid].error
    uuid0 = gpu(toolkit_specs["report"], 0)["uuid"]
    assert f"nvidia.com/gpu={uuid0} (GPU0) is not defined in {toolkit_specs['index'] / 'nvidia.yaml'}" in error
    assert "--device-name-strategy uuid" in error
    assert not os.path.exists(os.path.join(roots[1], f"{DRIVER}-claim_{uid}.json"))


def test_mig_devices_are_named_as_the_toolkit_names_them() -> None:
    mig = Device(name="GPU0-mig1", kind=DeviceKind.MIG, index=1, uuid="MIG-0c4b2a1e-1234-5678-9abc-def012345678",
                 parent="GPU0", attributes={"index": "0:1"})
    assert toolkit_name(mig, "uuid") == "MIG-0c4b2a1e-1234-5678-9abc-def012345678"
    assert toolkit_name(mig, "index") == "0:1"
    no_slot = Device(name="GPU0-mig1", kind=DeviceKind.MIG, index=1, uuid="MIG-x", parent="GPU0")
    with pytest.raises(ToolkitSpecError, match="use the uuid strategy"):
        toolkit_name(no_slot, "index")


# ---- the device plugin's --cdi-specs external -------------------------------------------------------------


def external_builder(dirs: list[Path], source: str | None = None) -> GpuAllocateBuilder:
    options = GpuAllocateOptions(device_list_strategy=("cdi-cri",), cdi_specs="external", pass_device_specs=False,
                                 toolkit_dirs=tuple(str(d) for d in dirs))
    return GpuAllocateBuilder(options, "nvidia.com/gpu", source)


def test_external_names_are_the_toolkits_uuid_names_and_resolve(toolkit_specs) -> None:
    """The daemon's builder on the simulated node (no UUIDs in its file): names by the UUIDs we serve."""
    topology = load_simulated(SIMULATED)
    report = toolkit_specs["report"]
    gpus = [g for g in topology.gpus if g.index in (0, 5)]
    assert all(g.uuid is None for g in gpus)  # the case: a simulated node names GPUs by made-up UUIDs
    out = external_builder([toolkit_specs["uuid"]], topology.source).build([str(g.index) for g in gpus], gpus)
    assert out.cdi_devices == [f"nvidia.com/gpu={gpu(report, i)['uuid']}" for i in (0, 5)]
    assert set(out.cdi_devices) <= {f"nvidia.com/gpu={n}" for n in tk.device_names(
        tk.generate_loaded(toolkit_specs["uuid"] / "nvidia.yaml"))}
    assert out.devices == []  # the toolkit's spec has the device nodes (passDeviceSpecs false)


def test_external_names_missing_from_the_toolkits_spec_refuse_the_allocate_with_the_fix(toolkit_specs,
                                                                                         tmp_path) -> None:
    report = toolkit_specs["report"]
    g0 = Device(name="GPU0", kind=DeviceKind.GPU, index=0, uuid=gpu(report, 0)["uuid"], minor=0)
    with pytest.raises(AllocationError, match="generated before this device existed or without the uuid"):
        external_builder([toolkit_specs["index"]]).build(["0"], [g0])
    # No spec of the kind readable here (the directory not mounted into the daemon): passed unchecked, as before.
    out = external_builder([tmp_path / "not-mounted"]).build(["0"], [g0])
    assert out.cdi_devices == [f"nvidia.com/gpu={g0.uuid}"]


def test_toolkit_specs_are_reread_when_the_file_changes(toolkit_specs, tmp_path) -> None:
    d = tmp_path / "cdi"
    d.mkdir()
    specs = ToolkitSpecs([str(d)])
    assert specs.names() == ([], frozenset())
    shutil.copyfile(toolkit_specs["uuid"] / "nvidia.yaml", d / "nvidia.yaml")
    files, names = specs.names()
    assert files == [str(d / "nvidia.yaml")] and gpu(toolkit_specs["report"], 3)["uuid"] in names
    shutil.copyfile(toolkit_specs["index"] / "nvidia.yaml", d / "nvidia.yaml")
    os.utime(d / "nvidia.yaml", ns=(1, 1))  # a different mtime even on a coarse clock
    assert "3" in specs.names()[1]


# ---- the daemon's flags ----------------------------------------------------------------------------------


async def test_serve_with_dra_toolkit_cdi_names_the_toolkits_device_and_refuses_without_its_spec(
        toolkit_specs, apiserver, tmp_path) -> None:
    """`serve --dra-toolkit-cdi uuid --toolkit-cdi-dirs DIR` as the chart runs it (a real child process)."""
    import signal
    import subprocess
    import sys

    from apiserver_standin import write_kubeconfig
    from topo_testkit import pythonpath_env

    base = tempfile.mkdtemp(prefix="dra-tks-", dir="/tmp")
    kubelet_root, cdi, specs = os.path.join(base, "k"), os.path.join(base, "cdi"), os.path.join(base, "etc-cdi")
    os.makedirs(specs)
    for d in ("plugins_registry", "device-plugins"):  # the kubelet's, which exist on a node
        os.makedirs(os.path.join(kubelet_root, d))
    shutil.copyfile(toolkit_specs["uuid"] / "nvidia.yaml", os.path.join(specs, "nvidia.yaml"))
    env = pythonpath_env(dict(os.environ, PYTHONUNBUFFERED="1", NODE_NAME=NODE, POD_UID="pod-1",
                              KUBECONFIG=write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "plugin", "serve", "--simulate", SIMULATED,
                                 "--kubelet-root-dir", kubelet_root, "--cdi-spec-dir", cdi,
                                 "--dra-resources", "nvidia.com/gpu", "--dra-toolkit-cdi", "uuid",
                                 "--toolkit-cdi-dirs", specs], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while not registration_sockets(kubelet_root):
            assert proc.poll() is None and asyncio.get_running_loop().time() < deadline, log.read_text()[-3000:]
            await asyncio.sleep(0.1)
        plugin = await register(registration_sockets(kubelet_root)[0])
        uid = apiserver.add_claim("team", "one", [result("gpu-2", "gpu")])
        entry = (await plugin.prepare(("team", uid, "one"))).claims[uid]
        assert entry.error == ""
        assert list(entry.devices[0].cdi_device_ids) == [f"{DRIVER}/claim={uid}-gpu-2",
                                                         f"nvidia.com/gpu={gpu(toolkit_specs['report'], 2)['uuid']}"]
        os.unlink(os.path.join(specs, "nvidia.yaml"))  # the node's spec removed: the next claim is refused
        uid2 = apiserver.add_claim("team", "two", [result("gpu-3", "gpu")])
        error = (await plugin.prepare(("team", uid2, "two"))).claims[uid2].error
        assert f"no CDI spec of kind nvidia.com/gpu (NVIDIA's container toolkit) in {specs}" in error
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)
