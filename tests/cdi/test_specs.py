"""The CDI spec model and builders: kinds, names, versions, device nodes, env (no Go needed)."""

from __future__ import annotations

import os
import pathlib

import pytest

from plugin.model.cdi import CDI_VERSION, CdiDevice, CdiError, CdiOptions, CdiSpec, DeviceNode, Edits, \
    kind_for_resource, names_for, spec_for_resource
from plugin.model.cdi.builders import nic_nodes
from plugin.model.cdi.nodes import NodeResolver
from plugin.model.cdi.spec import device_name

from cdi_nodes import mig_resource, nic_resource, resources_of, time_sliced

OPTS = CdiOptions()


@pytest.mark.parametrize("resource,kind", [
    ("nvidia.com/gpu", "topo-dp.nvidia.com/gpu"),
    ("nvidia.com/gpu.shared", "topo-dp.nvidia.com/gpu_shared"),
    ("nvidia.com/mig-1g.10gb", "topo-dp.nvidia.com/mig-1g_10gb"),
    ("topo.dev/nic", "topo-dp.topo.dev/nic"),
    ("example.com/3g", "topo-dp.example.com/r-3g"),
    ("example.com/x", "topo-dp.example.com/r-x"),
])
def test_one_kind_of_our_own_per_resource(resource: str, kind: str) -> None:
    assert kind_for_resource(resource) == kind
    assert kind_for_resource(resource, "acme") == "acme." + kind.split(".", 1)[1]


def test_kind_of_a_bad_resource_name_is_refused() -> None:
    with pytest.raises(CdiError, match="gpu"):
        kind_for_resource("gpu")


def test_model_refuses_what_a_runtime_would_refuse() -> None:
    node = Edits((DeviceNode("/dev/nvidia0", major=195, minor=0),))
    with pytest.raises(CdiError, match="no devices"):
        CdiSpec("topo-dp.x/gpu", ())
    with pytest.raises(CdiError, match="twice: a"):
        CdiSpec("topo-dp.x/gpu", (CdiDevice("a", node), CdiDevice("a", node)))
    for kind in ("gpu", "topo-dp.x/g", "t/gpu"):
        with pytest.raises(CdiError, match="vendor/class"):
            CdiSpec(kind, (CdiDevice("a", node),))
    with pytest.raises(CdiError, match="nothing to inject"):
        CdiDevice("a", Edits())
    with pytest.raises(CdiError, match="MIG-GPU-1/2/3"):
        CdiDevice("MIG-GPU-1/2/3", node)
    with pytest.raises(CdiError, match="KEY=VALUE"):
        Edits(env=("=x",))
    with pytest.raises(CdiError, match="absolute"):
        Edits((DeviceNode("dev/nvidia0"),))


def test_version_file_name_and_json() -> None:
    node = Edits((DeviceNode("/dev/nvidia0", major=195, minor=0),))
    spec = CdiSpec("topo-dp.nvidia.com/gpu", (CdiDevice("0", node),))
    assert CDI_VERSION == "0.5.0" and spec.version == "0.5.0"
    assert spec.file_name == "topo-dp.nvidia.com-gpu.json"
    assert spec.to_dict() == {
        "cdiVersion": "0.5.0", "kind": "topo-dp.nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [
            {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "permissions": "rw"}]}}],
    }
    # A class with a dot needs 0.6.0 (we never make one, but the model says so).
    assert CdiSpec("topo-dp.nvidia.com/gpu.shared", (CdiDevice("0", node),)).version == "0.6.0"


def test_gpus_by_uuid_and_by_index_with_nodes_and_env() -> None:
    gpu = resources_of("dgx-a100")[0]
    spec = spec_for_resource(gpu, OPTS)
    assert spec is not None and spec.kind == "topo-dp.nvidia.com/gpu"
    by_name = {d.name: d for d in spec.devices}
    for i, rd in enumerate(gpu.devices):
        assert by_name[rd.id].edits == by_name[str(rd.device.index)].edits
        node = by_name[rd.id].edits.device_nodes[0]
        assert (node.path, node.type, node.major, node.minor) == (f"/dev/nvidia{i}", "c", 195, i)
    assert len(spec.devices) == 2 * len(gpu.devices)
    assert spec.edits.env == ()  # NVIDIA_VISIBLE_DEVICES is Allocate's business (plugin.model.gpu_allocate)
    assert spec.edits.device_nodes[0].path == "/dev/nvidiactl"


def test_index_strategy_names_the_index() -> None:
    gpu = resources_of("dgx-h100", "index")[0]
    spec = spec_for_resource(gpu, OPTS)
    assert spec is not None and spec.device_names() == tuple(str(i) for i in range(8))
    assert names_for(spec, ["3", "1"]) == ["topo-dp.nvidia.com/gpu=3", "topo-dp.nvidia.com/gpu=1"]


def test_replicas_map_to_their_gpu_once() -> None:
    gpu = resources_of("dgx-a100")[0]
    shared = time_sliced(gpu, 4)
    spec = spec_for_resource(shared, OPTS)
    assert spec is not None and spec.kind == "topo-dp.nvidia.com/gpu_shared"
    assert len(spec.devices) == 2 * len(gpu.devices)  # GPUs, not replicas
    g0, g5 = gpu.devices[0].id, gpu.devices[5].id
    names = names_for(spec, [f"{g0}::1", f"{g0}::3", f"{g5}::0"])
    assert names == [f"topo-dp.nvidia.com/gpu_shared={g0}", f"topo-dp.nvidia.com/gpu_shared={g5}"]
    assert names_for(spec, ["GPU-unknown::0"]) == [] and names_for(None, [g0]) == []


def test_mig_devices_get_parent_and_caps_nodes() -> None:
    spec = spec_for_resource(mig_resource(), OPTS)
    assert spec is not None and spec.kind == "topo-dp.nvidia.com/mig-1g_10gb"
    first = {d.name: d for d in spec.devices}["0:1"]
    nodes = [(n.path, n.major, n.minor) for n in first.edits.device_nodes]
    assert nodes == [("/dev/nvidia0", 195, 0), ("/dev/nvidia-caps/nvidia-cap19", 237, 19),
                     ("/dev/nvidia-caps/nvidia-cap20", 237, 20)]


def test_nic_nodes_rdma_vfio_and_nothing_for_a_plain_vf() -> None:
    nics = nic_resource()
    spec = spec_for_resource(nics, OPTS)
    assert spec is not None
    assert spec.device_names() == ("0000:3b:00.2", "0000:3b:00.3")  # vfio nodes have dynamic numbers
    paths = [n.path for n in spec.devices[0].edits.device_nodes]
    assert paths == ["/dev/infiniband/issm2", "/dev/infiniband/umad2", "/dev/infiniband/uverbs2"]
    assert [(n.major, n.minor) for n in spec.devices[0].edits.device_nodes] == [(231, 66), (231, 2), (231, 194)]
    assert names_for(spec, ["0000:5e:02.2", "0000:3b:00.3"]) == ["topo-dp.topo.dev/rdma_vfs=0000:3b:00.3"]


def _fake_dev(tmp_path: pathlib.Path, *names: str) -> pathlib.Path:
    """A dev root whose nodes are symlinks to /dev/null (a real char device, 1:3)."""
    for n in names:
        p = tmp_path / n
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink("/dev/null", p)
    return tmp_path


def test_numbers_come_from_the_host_node_when_it_exists(tmp_path: pathlib.Path) -> None:
    dev = _fake_dev(tmp_path, "nvidia0", "nvidia-uvm", "vfio/vfio", "vfio/noiommu-43", "infiniband/rdma_cm")
    opts = CdiOptions(dev_root=str(dev))
    gpu = resources_of("pcie-2socket-4gpu-2nic")[0]
    spec = spec_for_resource(gpu, opts)
    assert spec is not None
    assert spec.devices[0].edits.device_nodes[0].major == 1  # the host's node wins over the table
    control = [n.path for n in spec.edits.device_nodes]
    assert control == ["/dev/nvidiactl", "/dev/nvidia-uvm"]  # optional nodes only where present
    nics = spec_for_resource(nic_resource(), opts)
    assert nics is not None
    by_name = {d.name: d for d in nics.devices}
    vfio = by_name["0000:5e:02.1"].edits.device_nodes
    assert [(n.path, n.host_path) for n in vfio] == [("/dev/vfio/vfio", None), ("/dev/vfio/43", "/dev/vfio/noiommu-43")]
    assert "0000:5e:02.0" not in by_name  # group 42 has no node here, and no fixed numbers
    assert by_name["0000:3b:00.3"].edits.device_nodes[-1].path == "/dev/infiniband/rdma_cm"


def test_host_dev_root_becomes_host_path() -> None:
    r = NodeResolver(dev_root="/nonexistent", host_dev_root="/run/nvidia/driver/dev")
    node = r.node("/dev/nvidia3")
    assert node == DeviceNode("/dev/nvidia3", "/run/nvidia/driver/dev/nvidia3", "c", 195, 3)
    assert node.to_dict()["hostPath"] == "/run/nvidia/driver/dev/nvidia3"
    assert r.node("/dev/nvidia-uvm") is None  # dynamic major, not on this host
    with pytest.raises(ValueError, match="under /dev"):
        r.node("/tmp/x")


def test_device_names_of_old_style_mig_ids_are_made_valid() -> None:
    assert device_name("MIG-GPU-5a1b/1/0") == "MIG-GPU-5a1b_1_0"
    assert device_name("GPU-1c2e") == "GPU-1c2e"


def test_nic_nodes_helper_reads_discovery_attributes() -> None:
    d = nic_resource().devices[1].device
    assert [n.path for n in nic_nodes(d, NodeResolver())] == ["/dev/infiniband/uverbs3"]
