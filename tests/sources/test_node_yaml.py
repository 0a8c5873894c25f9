"""Our YAML node format and the built-ins: schema errors name file, line and field."""

from __future__ import annotations

import pytest

from plugin.model.resources import ResourceOptions, build_resources, simulated_uuid
from plugin.sources import TopologyError, builtin_names, load_topology
from plugin.sources.simulated import load_node_yaml

REQUIRED_BUILTINS = {"dgx-1-v100", "dgx-a100", "dgx-h100", "pcie-2socket-4gpu-2nic"}


def test_required_builtins_exist_and_load():
    assert REQUIRED_BUILTINS <= set(builtin_names())
    for name in builtin_names():
        topo = load_topology(name)
        assert topo.gpus and all(d.numa is not None for d in topo.gpus), name


def test_dgx1_builtin_is_the_hybrid_cube_mesh():
    topo = load_topology("dgx-1-v100")
    nv2 = {(a.name, b.name) for a in topo.gpus for b in topo.gpus
           if a.index < b.index and topo.link(a.name, b.name).label == "NV2"}
    assert nv2 == {("GPU0", "GPU3"), ("GPU0", "GPU4"), ("GPU1", "GPU2"), ("GPU1", "GPU5"), ("GPU2", "GPU3"),
                   ("GPU4", "GPU7"), ("GPU5", "GPU6"), ("GPU6", "GPU7")}


GOOD = """\
apiVersion: topo-device-plugin/v1
kind: SimulatedNode
metadata: {name: lab}
numa: {nodes: [0, 1], distances: [[10, 32], [32, 10]]}
gpus:
  - {numa: 0}
  - {numa: 1, health: Unhealthy}
  - {numa: null}
nics:
  - {name: eth0, numa: 1}
links:
  - {devices: [GPU0, GPU2], link: NV4}
"""


def test_yaml_defaults_links_and_health():
    topo = load_node_yaml(GOOD, "lab.yaml")
    assert [d.name for d in topo.gpus] == ["GPU0", "GPU1", "GPU2"]
    assert topo.link("GPU0", "GPU1").label == "SYS"  # different NUMA nodes
    assert topo.link("GPU0", "GPU2").label == "NV4"
    assert topo.link("GPU1", "eth0").label == "NODE"  # same NUMA node
    assert topo.device("GPU1").health == "Unhealthy" and topo.device("GPU2").numa is None
    assert topo.numa_distance(0, 1) == 32


@pytest.mark.parametrize(
    "broken,where,field",
    [
        (GOOD.replace("{numa: 1, health: Unhealthy}", "{numa: 1, helth: Unhealthy}"), "lab.yaml:7", "gpus[1]"),
        (GOOD.replace("link: NV4", "link: NVLINK"), "lab.yaml:12", "links[0].link"),
        (GOOD.replace("[GPU0, GPU2]", "[GPU0, GPU9]"), "lab.yaml:12", "links[0].devices[1]"),
        (GOOD.replace("apiVersion: topo-device-plugin/v1", "apiVersion: v2"), "lab.yaml:1", "apiVersion"),
        (GOOD.replace("nodes: [0, 1]", "nodes: [0]"), "lab.yaml:4", "numa.distances"),
    ],
)
def test_schema_errors_name_file_line_and_field(broken, where, field):
    with pytest.raises(TopologyError) as e:
        load_node_yaml(broken, "lab.yaml")
    assert str(e.value).startswith(where + ":"), str(e.value)
    assert field in str(e.value) and "fix:" in str(e.value)


def test_nic_netdev_and_rdma_device_reach_the_dra_slice():
    """A simulated NIC can name its network interface and RDMA device; DRA publishes the netdev (what the
    pod-network side attaches) and a NIC without one has none."""
    from plugin.dra.slices.build import SliceOptions, build_resource_slices

    text = GOOD.replace("- {name: eth0, numa: 1}", "- {name: eth0, numa: 1, netdev: ens1f0, rdmaDevice: mlx5_0}\n"
                        "  - {name: eth1, numa: 0}")
    topo = load_node_yaml(text, "lab.yaml")
    assert topo.device("eth0").attributes == {"netdev": "ens1f0", "rdma_devices": "mlx5_0"}
    assert topo.device("eth1").attributes == {}
    devices = {d["name"]: d for s in build_resource_slices(topo, SliceOptions(node_name="n"))
               for d in s["spec"]["devices"]}
    nics = [d for d in devices.values() if d["attributes"]["type"]["string"] == "nic"]
    assert sorted(d["attributes"].get("netdev", {}).get("string", "-") for d in nics) == ["-", "ens1f0"]


@pytest.mark.parametrize("bad,field", [("netdev: ens1/0", "nics[0].netdev"),
                                       ("netdev: a-name-of-16chars", "nics[0].netdev"),
                                       ("rdmaDevice: 'mlx5 0'", "nics[0].rdmaDevice")])
def test_bad_netdev_names_are_refused_naming_the_field(bad, field):
    with pytest.raises(TopologyError) as e:
        load_node_yaml(GOOD.replace("{name: eth0, numa: 1}", "{name: eth0, numa: 1, " + bad + "}"), "lab.yaml")
    assert field in str(e.value) and "fix:" in str(e.value), str(e.value)


def test_uuid_ids_are_stable_and_index_ids_are_positions():
    topo = load_topology("dgx-a100")
    a = build_resources(topo, ResourceOptions())[0]
    b = build_resources(load_topology("dgx-a100"), ResourceOptions())[0]
    assert [d.id for d in a.devices] == [d.id for d in b.devices]
    assert a.devices[0].id == simulated_uuid("dgx-a100", "GPU0") and a.devices[0].id.startswith("GPU-")
    idx = build_resources(topo, ResourceOptions(device_id_strategy="index"))[0]
    assert [d.id for d in idx.devices] == [str(i) for i in range(8)]


def test_missing_file_names_builtins():
    with pytest.raises(TopologyError, match="dgx-a100"):
        load_topology("/nonexistent/node.yaml")
