"""What the kubelet would be served for time-slicing and MIG: resource names, device IDs, NUMA, health,
Allocate answers, and the refusals an operator sees (exit 2 at start-up)."""

from __future__ import annotations

import pytest

from allocator import AllocationError
from allocator.topology import DeviceKind
from plugin.config import parse_config
from plugin.config.sharing import SharingError
from plugin.errors import OptionError
from plugin.model.gpu_allocate import GpuAllocateOptions
from plugin.model.mig_strategy import MigStrategyError
from plugin.model.resources import Resource, ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated

HEAD = "version: v1\nsharing:\n  timeSlicing:\n"


def sharing(body: str, **top: bool) -> str:
    lines = [f"    {k}: {'true' if v else 'false'}" for k, v in top.items()]
    return HEAD + "\n".join(lines) + ("\n" if lines else "") + "    resources:\n" + body


def served(node: str = "dgx-a100", config: str | None = None, mig: str = "none", strategy: str = "index",
           **gpu_allocate) -> dict[str, Resource]:
    ts = parse_config(config, "config.yaml").time_slicing if config else None
    options = ResourceOptions(device_id_strategy=strategy, mig_strategy=mig, time_slicing=ts,
                              gpu_allocate=GpuAllocateOptions(**gpu_allocate))
    return {r.name: r for r in build_resources(load_simulated(node), options)}


def ids(r: Resource) -> list[str]:
    return [d.id for d in r.devices]


# -- time-slicing ----------------------------------------------------------------------------------------
def test_replicas_keep_the_name_by_default_and_carry_their_gpus_numa():
    r = served(config=sharing("    - {name: nvidia.com/gpu, replicas: 3}\n"))["nvidia.com/gpu"]
    assert ids(r) == [f"{g}::{k}" for g in range(8) for k in range(3)]
    assert [d.numa for d in r.devices] == [0] * 12 + [1] * 12
    assert r.policy == "replicas" and r.graph.parent_ids == tuple(str(g) for g in range(8))


@pytest.mark.parametrize("entry, top, name", [
    ("{name: nvidia.com/gpu, replicas: 2}", {"renameByDefault": True}, "nvidia.com/gpu.shared"),
    ("{name: gpu, replicas: 2, rename: gpu-small}", {}, "nvidia.com/gpu-small"),  # bare names get nvidia.com/
    ("{name: nvidia.com/gpu, replicas: 2, rename: example.com/tiny}", {"renameByDefault": True}, "example.com/tiny"),
])
def test_renamed_replicas_replace_the_gpu_resource(entry, top, name):
    res = served(config=sharing(f"    - {entry}\n", **top))
    assert set(res) == {name, "topo.dev/nic"}
    assert len(res[name].devices) == 16


def test_devices_subset_is_shared_and_the_rest_stays_whole():
    res = served(config=sharing("    - {name: nvidia.com/gpu, replicas: 4, devices: 2, rename: gpu-a}\n"
                                "    - {name: nvidia.com/gpu, replicas: 2, devices: [7, '6'], rename: gpu-b}\n"))
    assert ids(res["nvidia.com/gpu"]) == ["2", "3", "4", "5"]
    assert res["nvidia.com/gpu"].policy == "numa-first"
    assert ids(res["nvidia.com/gpu-a"]) == [f"{g}::{k}" for g in (0, 1) for k in range(4)]
    assert ids(res["nvidia.com/gpu-b"]) == ["6::0", "6::1", "7::0", "7::1"]
    # the whole GPUs' graph is the GPUs left (links between them intact)
    g = res["nvidia.com/gpu"].graph
    assert g.weights[0][1] == 1200 and len(g.ids) == 4


def test_devices_by_uuid_and_per_gpu_replica_counts_merge_into_one_resource():
    uuid_res = served(strategy="uuid")["nvidia.com/gpu"]
    u1, u5 = uuid_res.devices[1].id, uuid_res.devices[5].id
    res = served(strategy="uuid", config=sharing(
        f"    - {{name: nvidia.com/gpu, replicas: 2, devices: [{u1}], rename: shared}}\n"
        f"    - {{name: nvidia.com/gpu, replicas: 3, devices: [{u5}], rename: shared}}\n"))
    assert ids(res["nvidia.com/shared"]) == [f"{u1}::0", f"{u1}::1", f"{u5}::0", f"{u5}::1", f"{u5}::2"]


@pytest.mark.parametrize("body, top, words", [
    ("    - {name: nvidia.com/gpu, replicas: 2, devices: 3}\n", {},
     "field sharing.timeSlicing.resources[0].devices: selects 3 of the 8 nvidia.com/gpu devices, but the replicas "
     "keep the name nvidia.com/gpu"),
    ("    - {name: nvidia.com/gpu, replicas: 2, devices: 9, rename: x}\n", {},
     "9 devices requested but nvidia.com/gpu has only 8 on this node"),
    ("    - {name: nvidia.com/gpu, replicas: 2, devices: ['3:1'], rename: x}\n", {},
     "no nvidia.com/gpu device on this node is '3:1'"),
    ("    - {name: topo.dev/nic, replicas: 2}\n", {}, "'topo.dev/nic' cannot be time-sliced"),
    ("    - {name: nvidia.com/gpu, replicas: 2, devices: [1], rename: a}\n"
     "    - {name: nvidia.com/gpu, replicas: 2, devices: [1], rename: b}\n", {},
     "resources[1].devices: 1 is already shared by"),
])
def test_what_cannot_be_served_names_the_entry_and_the_fix(body, top, words):
    with pytest.raises(SharingError) as e:
        served(config=sharing(body, **top))
    msg = str(e.value)
    assert words in msg and "config.yaml:" in msg and "(fix: " in msg, msg


def test_replicas_named_like_another_resource_are_refused():
    with pytest.raises(OptionError, match=r"topo.dev/nic would be served twice .* \(fix: rename one"):
        served(config=sharing("    - {name: nvidia.com/gpu, replicas: 2, rename: topo.dev/nic}\n"))


def test_an_entry_for_a_resource_this_node_lacks_changes_nothing():
    res = served(config=sharing("    - {name: nvidia.com/mig-1g.10gb, replicas: 4}\n"))
    assert ids(res["nvidia.com/gpu"]) == [str(i) for i in range(8)]


def test_allocate_lists_each_gpu_once_and_fail_requests_greater_than_one():
    body = "    - {name: nvidia.com/gpu, replicas: 4}\n"
    r = served(config=sharing(body))["nvidia.com/gpu"]
    assert r.allocate(["3::0", "3::3", "5::1"]).envs["NVIDIA_VISIBLE_DEVICES"] == "3,5"
    strict = served(config=sharing(body, failRequestsGreaterThanOne=True))["nvidia.com/gpu"]
    with pytest.raises(AllocationError, match="failRequestsGreaterThanOne is set: maximum request size for shared "
                                              "resources is 1; a container asked for 2 nvidia.com/gpu replicas"):
        strict.allocate(["3::0", "4::0"])
    assert strict.allocate(["3::0"]).envs["NVIDIA_VISIBLE_DEVICES"] == "3"


def test_allocate_device_nodes_once_per_gpu(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia3", "nvidia5", "nvidiactl"):
        (dev / name).write_text("")
    node = tmp_path / "node.yaml"
    node.write_text("apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\ngpus:\n"
                    + "".join(f"  - {{numa: 0, minor: {i}}}\n" for i in range(8)))
    r = served(str(node), sharing("    - {name: nvidia.com/gpu, replicas: 4}\n"), dev_root=str(dev))
    out = r["nvidia.com/gpu"].allocate(["3::0", "3::3", "5::1"])
    assert [d.container_path for d in out.devices] == ["/dev/nvidia3", "/dev/nvidia5", "/dev/nvidiactl"]


# -- MIG strategies -----------------------------------------------------------------------------------------
def test_mixed_resources_per_profile_and_nvidias_name_for_attributed_profiles(tmp_path):
    node = tmp_path / "node.yaml"
    node.write_text("apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\ngpus:\n"
                    "  - {numa: 1, mig: [{profile: 1g.10gb+me}, {profile: 1g.10gb}, {profile: 3g.40gb, gi: 5}]}\n"
                    "  - {numa: 0}\n")
    res = served(str(node), mig="mixed")
    assert sorted(res) == ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.10gb.me",
                           "nvidia.com/mig-3g.40gb"]
    mig = res["nvidia.com/mig-3g.40gb"]
    assert mig.kind is DeviceKind.MIG and mig.policy == "mig" and ids(mig) == ["0:2"]
    assert mig.devices[0].numa == 1 and mig.devices[0].device.attributes["gi"] == "5"


@pytest.mark.parametrize("gpus, words", [
    ("  - {numa: 0, mig: [{profile: 1g.10gb}]}\n  - {numa: 0, mig: []}\n",
     "GPU1 has MIG enabled but no MIG devices"),
    ("  - {numa: 0, mig: [{profile: 1g.10gb}]}\n  - {numa: 0}\n",
     "all GPUs must have MIG enabled, but GPU1 has it disabled"),
    ("  - {numa: 0, mig: [{profile: 1g.10gb}]}\n  - {numa: 0, mig: [{profile: 2g.20gb}]}\n",
     "more than one MIG profile on the node (1g.10gb on GPU0; 2g.20gb on GPU1)"),
])
def test_single_refuses_what_nvidia_refuses(tmp_path, gpus, words):
    node = tmp_path / "node.yaml"
    node.write_text("apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\ngpus:\n" + gpus)
    with pytest.raises(MigStrategyError) as e:
        served(str(node), mig="single")
    assert words in str(e.value) and "(fix: " in str(e.value)


def test_mixed_refuses_a_profile_without_a_resource_and_skips_an_empty_gpu(tmp_path, caplog):
    node = tmp_path / "node.yaml"
    node.write_text("apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\ngpus:\n"
                    "  - {numa: 0, mig: [{profile: 1c.3g.40gb}]}\n")
    with pytest.raises(MigStrategyError, match="'1c.3g.40gb' of GPU0-mig0 has no resource"):
        served(str(node), mig="mixed")
    node.write_text("apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\ngpus:\n"
                    "  - {numa: 0, mig: [{profile: 2g.20gb}]}\n  - {numa: 0, mig: []}\n")
    assert sorted(served(str(node), mig="mixed")) == ["nvidia.com/mig-2g.20gb"]
    assert "GPU has MIG enabled but no MIG devices" in caplog.text


def test_mig_devices_follow_their_parents_health():
    topology = load_simulated("dgx-a100-mig").with_health({"GPU3": "Unhealthy"})
    res = {r.name: r for r in build_resources(topology, ResourceOptions(device_id_strategy="index",
                                                                         mig_strategy="mixed"))}
    health = {d.id: d.health for d in res["nvidia.com/mig-3g.40gb"].devices}
    assert health == {"0:0": "Healthy", "3:0": "Unhealthy", "3:1": "Unhealthy", "6:0": "Healthy"}


def test_mig_allocate_env_by_strategy():
    mig = served("dgx-a100-mig", mig="mixed", strategy="uuid")["nvidia.com/mig-2g.20gb"]
    out = mig.allocate(ids(mig))
    assert out.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids(mig)) and ids(mig)[0].startswith("MIG-")
    cdi_only = served("dgx-a100-mig", mig="mixed", device_list_strategy=("cdi-cri",))["nvidia.com/mig-2g.20gb"]
    out = cdi_only.allocate(["6:1"])
    assert out.envs == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert out.cdi_devices == ["topo-dp.nvidia.com/mig-2g_20gb=6:1"]


def test_time_sliced_mig_profile():
    config = sharing("    - {name: nvidia.com/mig-3g.40gb, replicas: 2}\n")
    res = served("dgx-a100-mig", config, mig="mixed")
    r = res["nvidia.com/mig-3g.40gb"]
    assert ids(r) == ["0:0::0", "0:0::1", "3:0::0", "3:0::1", "3:1::0", "3:1::1", "6:0::0", "6:0::1"]
    assert r.policy == "replicas" and r.kind is DeviceKind.MIG
    assert r.allocate(["3:1::0", "3:1::1"]).envs["NVIDIA_VISIBLE_DEVICES"] == "3:1"


# -- MPS -------------------------------------------------------------------------------------------------
MPS_HEAD = "version: v1\nsharing:\n  mps:\n"


def test_mps_replicas_are_served_like_time_slicing_with_the_share_in_each_allocate():
    config = MPS_HEAD + "    renameByDefault: true\n    resources:\n    - {name: nvidia.com/gpu, replicas: 3}\n"
    r = served(config=config)["nvidia.com/gpu.shared"]
    assert ids(r)[:3] == ["0::0", "0::1", "0::2"] and len(r.devices) == 24
    a = r.allocate(["5::2"])
    memory = load_simulated("dgx-a100").gpus[5].memory_mib
    assert a.envs["NVIDIA_VISIBLE_DEVICES"] == "5"
    assert a.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com_gpu.shared/pipe"
    assert a.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "33"
    assert memory and a.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={memory // 3}M"
    assert [(m.container_path, m.host_path, m.read_only) for m in a.mounts] == [
        ("/mps/nvidia.com_gpu.shared/pipe", "/run/nvidia/mps/nvidia.com_gpu.shared/pipe", False),
        ("/dev/shm", "/run/nvidia/mps/shm", False)]
    with pytest.raises(AllocationError, match="sharing.mps shares a GPU one replica per container"):
        r.allocate(["0::0", "1::0"])


def test_mps_on_mig_devices_is_refused_naming_the_entry():
    config = MPS_HEAD + "    resources:\n    - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n"
    with pytest.raises(SharingError) as e:
        served("dgx-a100-mig", config, mig="mixed")
    msg = str(e.value)
    assert "field sharing.mps.resources[0].name" in msg and "cannot be shared with MPS: only whole GPUs" in msg
