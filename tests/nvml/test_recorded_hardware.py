"""What real NVML answered on lent GPUs (H100, H200: tests/nvml/recorded/), held against our code and our double.

The MIG tests run against the fake NVML; these pin the fake and the naming to what a real driver
said, so a double that drifts from the hardware (or a naming rule that disagrees with NVIDIA's own
names) fails here. docs/gpu-discovery.md ("Run on real hardware") says how the answers were taken.
"""

from __future__ import annotations

import json
import pathlib

import pynvml
import pytest

from plugin.sources.nvml_mig import CapsReader, cap_minors, profile_name
from plugin.sources.mig_profiles import table_for
from plugin.sources.simulated import load_simulated
from topo_testkit.fake_nvml import FakeNvml

RECORDED = sorted((pathlib.Path(__file__).parent / "recorded").glob("*.json"))


def full_ci(slices: int) -> int:
    """NVML's compute-instance profile index of a compute instance as large as its GPU instance."""
    return getattr(pynvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE")


def _profiles(real: dict) -> dict[int, object]:
    return {int(i): p for i, p in real["gpu_instance_profiles"].items()}


@pytest.fixture(params=RECORDED, ids=[p.stem for p in RECORDED])
def real(request) -> dict:
    return json.loads(request.param.read_text())


def test_a_recording_is_there():
    assert RECORDED, "tests/nvml/recorded/ holds at least one recording of real NVML"


def test_our_profile_names_are_the_ones_real_nvml_gives(real):
    offered = {i: p for i, p in _profiles(real).items() if isinstance(p, dict)}
    assert offered, "the recording has MIG profiles"
    for index, p in offered.items():
        ours = profile_name(index, full_ci(p["sliceCount"]), p["memorySizeMB"], real["memory_total_bytes"])
        assert f"MIG {ours}" == p["name"], index


def test_the_fake_nvml_offers_the_profiles_real_nvml_offers_under_the_same_ids(real):
    fake = FakeNvml(load_simulated("dgx-h100"))
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    for index, answer in _profiles(real).items():
        if isinstance(answer, dict):
            assert fake.nvmlDeviceGetGpuInstanceProfileInfo(handle, index).id == answer["id"], index
        else:
            # Real NVML refused it (NOT_SUPPORTED, or INVALID_ARGUMENT past the driver's table):
            # discovery skips both codes, and the double must refuse with one of them too.
            with pytest.raises(pynvml.NVMLError) as refused:
                fake.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
            assert refused.value.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)


def test_capability_minors_read_from_the_real_procfs_format(real, tmp_path):
    caps = tmp_path / "driver" / "nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_text("\n".join(real["mig_minors_head"]) + "\n")
    (tmp_path / "devices").write_text("Character devices:\n" + "\n".join(real["proc_devices"]) + "\n")
    reader = CapsReader(str(tmp_path))
    assert reader.major == next(line.split()[0] for line in real["proc_devices"] if line.endswith(" nvidia-caps"))
    checked = 0
    for line in real["mig_minors_head"]:
        name, minor = line.split()
        parts = name.split("/")
        if len(parts) < 3:
            continue  # config, monitor
        gpu, gi = int(parts[0][3:]), int(parts[1][2:])
        ci = int(parts[2][2:]) if parts[2].startswith("ci") else None
        assert reader.minor(gpu, gi, ci) == int(minor), name
        # NVIDIA's numbering, which our CDI specs and the fake's procfs use, is the real one.
        assert cap_minors(gpu, gi, ci or 0)[0 if ci is None else 1] == int(minor), name
        checked += 1
    assert checked, "the recording lists GPU-instance capability minors"


def test_our_mig_table_is_the_one_the_recorded_gpu_offers(real):
    """The profiles and placements partitionable DRA devices are published from (plugin/sources/mig_profiles)
    against what the GPU itself answered: a wrong start slice would publish a device prepare cannot create."""
    table = table_for(real["name"], real["memory_total_bytes"] // 2**20)
    assert table is not None, f"no MIG table for {real['name']} with {real['memory_total_bytes'] // 2**20} MiB"
    offered = _profiles(real)
    for p in table.profiles:
        answer = offered[p.gi_profile]
        assert isinstance(answer, dict), f"{p.name}: the GPU refused profile index {p.gi_profile}: {answer}"
        assert answer["name"] == f"MIG {p.name}"
        assert (answer["sliceCount"], answer["instanceCount"]) == (p.compute_slices, len(p.starts)), p.name
        if "multiprocessorCount" in answer:  # recordings from 2026-11-26 on
            assert answer["multiprocessorCount"] == p.multiprocessors, p.name
    # Recordings from 2026-11-26 on hold NVML's possible placements (answered with MIG mode off too).
    for index, placements in real.get("gpu_instance_placements", {}).items():
        ours = table.by_gi_profile(int(index))
        if ours is None:
            assert "+me" in offered[int(index)]["name"], f"profile index {index} is offered but not in our table"
            continue
        assert placements == [[s, ours.memory_slices] for s in ours.starts], ours.name
