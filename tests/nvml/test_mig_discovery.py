"""MIG discovery through NVML's MIG calls, against the fake NVML driven by the MIG node descriptions,
with generated sysfs and procfs (capability files) and device nodes.

The simulated node and the NVML path must agree device by device: what `discover --simulate` shows is
what the daemon finds on the real machine with the same layout.
"""

from __future__ import annotations

import json
import logging

import pynvml
import pytest
from click.testing import CliRunner

from allocator.topology import DeviceKind
from plugin.cli import cli
from plugin.sources.nvml_gpus import NvmlGpuSource
from plugin.sources.nvml_mig import cap_minors, memory_gb, profile_name
from plugin.sources.simulated import load_simulated
from topo_testkit.fake_nvml import CAPS_MAJOR, R470_MISSING, FakeNvml
from topo_testkit.with_fake_nvml import fake_for, installed

MIB = 1 << 20


def discover(node: str, tmp_path, **proc_kw):
    sim = load_simulated(node)
    fake = FakeNvml(sim.without(d.name for d in sim.nics))
    sysfs = fake.write_sysfs(str(tmp_path / "sys"))
    proc = fake.write_proc(str(tmp_path / "proc"), **proc_kw)
    return sim, fake, NvmlGpuSource(nvml=fake, sysfs_root=sysfs, proc_root=proc).load()


@pytest.mark.parametrize("node", ["dgx-a100-mig", "dgx-a100-mig-1g"])
@pytest.mark.parametrize("files", ["access files", "mig-minors only"])
def test_nvml_finds_the_simulated_mig_devices_field_by_field(node, files, tmp_path):
    kw = {"access_files": files == "access files"}
    sim, fake, found = discover(node, tmp_path, **kw)
    want = {d.name: d for d in sim.of_kind(DeviceKind.MIG)}
    got = {d.name: d for d in found.of_kind(DeviceKind.MIG)}
    assert list(got) == list(want) and got
    for name, w in want.items():
        g = got[name]
        attrs = dict(g.attributes)
        assert attrs.pop("caps_major") == str(CAPS_MAJOR)
        assert attrs == dict(w.attributes), name  # profile, GPU/compute instance, index, capability nodes
        assert (g.uuid, g.parent, g.numa, g.index, g.memory_mib, g.minor) == (
            w.uuid, w.parent, w.numa, w.index, w.memory_mib, w.minor), name
    modes = {d.name: d.attributes.get("mig_mode") for d in found.gpus}
    assert modes == {d.name: d.attributes.get("mig_mode") for d in sim.gpus}
    assert fake.init_count == 0


def test_without_procfs_mig_devices_have_no_caps_and_one_warning(tmp_path, caplog):
    sim = load_simulated("dgx-a100-mig")
    fake = FakeNvml(sim.without(d.name for d in sim.nics))
    with caplog.at_level(logging.WARNING):
        found = NvmlGpuSource(nvml=fake, sysfs_root=fake.write_sysfs(str(tmp_path / "sys")),
                              proc_root=str(tmp_path / "no-proc")).load()
    migs = found.of_kind(DeviceKind.MIG)
    assert len(migs) == 31 and not any("caps" in d.attributes for d in migs)
    assert caplog.text.count("MIG capability device minors not found") == 1


def test_gpus_without_mig_mode_report_no_mig_devices(tmp_path):
    sim, fake, found = discover("dgx-a100", tmp_path)
    assert not found.of_kind(DeviceKind.MIG) and fake.calls["nvmlDeviceGetMigDeviceHandleByIndex"] == 0
    assert all("mig_mode" not in d.attributes for d in found.gpus)


def test_a_lost_gpu_keeps_its_place_and_reports_no_mig_devices(tmp_path):
    sim = load_simulated("dgx-a100-mig-1g")
    fake = FakeNvml(sim.without(d.name for d in sim.nics))
    fake.lose("GPU2")
    # GPU_IS_LOST on the handle: the GPU is skipped (nvml_gpus), the others keep their MIG devices
    found = NvmlGpuSource(nvml=fake, sysfs_root=fake.write_sysfs(str(tmp_path / "sys")),
                          proc_root=fake.write_proc(str(tmp_path / "proc"))).load()
    parents = {d.parent for d in found.of_kind(DeviceKind.MIG)}
    assert parents == {f"GPU{i}" for i in range(8)} - {"GPU2"}


@pytest.mark.parametrize("gi, ci, mig_mib, gpu_mib, name", [
    # A100-SXM4-40GB (40536 MiB): NVIDIA's profiles with their real memory sizes
    (0, 0, 4864, 40536, "1g.5gb"),
    (1, 1, 9984, 40536, "2g.10gb"),
    (2, 2, 20096, 40536, "3g.20gb"),
    (4, 4, 40192, 40536, "7g.40gb"),
    (2, 0, 20096, 40536, "1c.3g.20gb"),
    (7, 0, 4864, 40536, "1g.5gb+me"),
    # A100-SXM4-80GB (81920 MiB)
    (0, 0, 9728, 81920, "1g.10gb"),
    (9, 0, 19968, 81920, "1g.20gb"),
    (2, 2, 40448, 81920, "3g.40gb"),
])
def test_profile_names_as_nvidia_writes_them(gi, ci, mig_mib, gpu_mib, name):
    assert profile_name(gi, ci, mig_mib, gpu_mib * MIB) == name


def test_memory_rounds_halves_up_as_go_does():
    # 1/8 of a 12 GiB GPU is 1.5 GiB -> 2; 5/8 of a 4 GiB GPU is 2.5 GiB -> 3 (Python's round() gives 2)
    assert memory_gb(1536, 12 << 30) == 2
    assert memory_gb(2560, 4 << 30) == 3


def test_capability_minors_follow_nvidias_numbering():
    assert cap_minors(0, 0, 0) == (3, 4)  # /proc/driver/nvidia-caps/mig-minors: gpu0/gi0/access 3, ci0 4
    assert cap_minors(0, 1, 0) == (12, 13)
    assert cap_minors(1, 0, 2) == (138, 141)


def test_discover_shows_mig_resources_through_the_cli(tmp_path):
    node = "dgx-a100-mig"
    fake = fake_for(node)
    sysfs, proc = fake.write_sysfs(str(tmp_path / "sys")), fake.write_proc(str(tmp_path / "proc"))
    with installed(fake):
        r = CliRunner().invoke(cli, ["discover", "--sysfs-root", sysfs, "--proc-root", proc, "--mig-strategy",
                                     "mixed", "--device-id-strategy", "index", "--format", "json"],
                               env={"TOPO_DP_FAIL_ON_INIT_ERROR": "true"})
    assert r.exit_code == 0, r.output
    data = json.loads(r.output[r.output.index("{"):])
    resources = {x["name"]: [d["id"] for d in x["devices"]] for x in data["resources"]}
    assert resources["nvidia.com/mig-7g.80gb"] == ["4:0"] and resources["nvidia.com/gpu"] == ["7"]
    assert len(resources["nvidia.com/mig-1g.10gb"]) == 24
    caps = {d["name"]: d["attributes"].get("caps") for d in data["devices"] if d["kind"] == "mig"}
    assert caps["GPU4-mig0"] == "/dev/nvidia-caps/nvidia-cap543,/dev/nvidia-caps/nvidia-cap544"


# -- drivers without the versioned profile-info calls (R450/R470; issue 18) ------------------------------
def test_the_fake_lacks_a_call_exactly_as_pynvml_does(monkeypatch):
    # pynvml itself, with a driver library that has only the unversioned symbol: what it raises
    class R470Library:
        def nvmlDeviceGetGpuInstanceProfileInfo(self, *args):  # noqa: N802 (NVML's name)  # pragma: no cover - never reached
            return 0

    monkeypatch.setattr(pynvml, "nvmlLib", R470Library())
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    with pytest.raises(pynvml.NVMLError) as real:
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(None, 0)
    fake = fake_for("dgx-a100-mig", missing_functions=R470_MISSING)
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError) as faked:
        fake.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0)
    assert type(faked.value) is type(real.value) is pynvml.NVMLError_FunctionNotFound
    assert faked.value.value == real.value.value and str(faked.value) == str(real.value)
    assert fake.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0, version=1).id == 19  # the unversioned call answers
    with pytest.raises(ValueError, match="does not implement nvmlDeviceGetGpuInstanceProfileInfoX"):
        fake_for("dgx-a100-mig", missing_functions={"nvmlDeviceGetGpuInstanceProfileInfoX"})


@pytest.mark.parametrize("node", ["dgx-a100-mig", "dgx-a100-mig-1g"])
def test_an_r470_driver_without_the_versioned_calls_finds_the_same_mig_devices(node, tmp_path):
    _, _, current = discover(node, tmp_path / "current")
    sim = load_simulated(node)
    fake = FakeNvml(sim.without(d.name for d in sim.nics), missing_functions=R470_MISSING)
    old = NvmlGpuSource(nvml=fake, sysfs_root=fake.write_sysfs(str(tmp_path / "sys")),
                        proc_root=fake.write_proc(str(tmp_path / "proc"))).load()
    assert old.of_kind(DeviceKind.MIG) and old.devices == current.devices
    # asked once whether the driver has each versioned call, then only the unversioned ones
    assert fake.calls["nvmlDeviceGetGpuInstanceProfileInfoV"] == 1
    assert fake.calls["nvmlGpuInstanceGetComputeInstanceProfileInfoV"] == 1
    assert fake.calls["nvmlDeviceGetGpuInstanceProfileInfo"] >= len(old.of_kind(DeviceKind.MIG))


def _discover_mixed(fake, tmp_path):
    sysfs, proc = fake.write_sysfs(str(tmp_path / "sys")), fake.write_proc(str(tmp_path / "proc"))
    with installed(fake):
        return CliRunner().invoke(cli, ["discover", "--sysfs-root", sysfs, "--proc-root", proc, "--mig-strategy",
                                        "mixed", "--format", "json"], env={"TOPO_DP_FAIL_ON_INIT_ERROR": "true"})


def test_discover_mixed_serves_the_mig_devices_of_an_r470_driver(tmp_path):
    current = _discover_mixed(fake_for("dgx-a100-mig"), tmp_path / "current")
    old = _discover_mixed(fake_for("dgx-a100-mig", missing_functions=R470_MISSING), tmp_path / "r470")
    assert current.exit_code == 0 and old.exit_code == 0, old.output
    resources = json.loads(old.output[old.output.index("{"):])["resources"]
    assert any(r["name"].startswith("nvidia.com/mig-") for r in resources)
    assert resources == json.loads(current.output[current.output.index("{"):])["resources"]
    assert "MIG device skipped" not in old.output


def test_a_driver_without_either_profile_call_is_refused_naming_the_call_and_the_driver(tmp_path):
    missing = R470_MISSING | {"nvmlGpuInstanceGetComputeInstanceProfileInfo"}
    r = _discover_mixed(fake_for("dgx-a100-mig", missing_functions=missing), tmp_path)
    assert r.exit_code == 1, r.output
    assert "nvmlGpuInstanceGetComputeInstanceProfileInfoV nor nvmlGpuInstanceGetComputeInstanceProfileInfo" in r.output
    assert "MIG needs NVIDIA driver R450 or later" in r.output
