"""GPU–NIC complexes and NVLink fabric in our YAML node format, and the built-in platforms that use them.

What a user writes (`complex`, `complexKind`, `fabric`) must reach the model exactly, and a mistake
(half a complex, a complex with no NIC, two kinds for one complex, a bad fabric) must be refused
with the file, the line, the field and a fix: a wrong complex would silently pair a GPU with the
wrong NIC.
"""

from __future__ import annotations

import pytest

from allocator.topology import ComplexKind, DeviceKind, FabricInfo, NodeTopology
from plugin.sources import TopologyError, load_topology
from plugin.sources.simulated import load_node_yaml

GOOD = """\
apiVersion: topo-device-plugin/v1
kind: SimulatedNode
metadata: {name: tray}
gpus:
  - {numa: 0, complex: c0, complexKind: data-direct, fabric: {clusterUuid: 8A3E5C71-2D4F-4B96-A0E8-5F7C1B9D2E43, cliqueId: 7}}
  - {numa: 0, complex: c1, complexKind: data-direct, fabric: {clusterUuid: 8a3e5c71-2d4f-4b96-a0e8-5f7c1b9d2e43, cliqueId: 7, state: in-progress}}
  - {numa: 0}
nics:
  - {name: mlx5_0, numa: 0, complex: c1, complexKind: data-direct}
  - {name: mlx5_1, numa: 0, complex: c0, complexKind: data-direct}
  - {name: mlx5_2, numa: 0}
"""


def test_complexes_and_fabric_reach_the_model():
    t = load_node_yaml(GOOD, "tray.yaml")
    d = {x.name: x for x in t.devices}
    assert (d["GPU0"].complex, d["GPU0"].complex_kind) == ("c0", ComplexKind.DATA_DIRECT)
    assert (d["mlx5_1"].complex, d["mlx5_1"].complex_kind) == ("c0", ComplexKind.DATA_DIRECT)
    assert d["mlx5_0"].complex == "c1" and d["GPU2"].complex is None and d["mlx5_2"].complex_kind is None
    # The UUID is kept in one spelling (lower case), so the clique of two GPUs compares equal.
    assert d["GPU0"].fabric == FabricInfo("8a3e5c71-2d4f-4b96-a0e8-5f7c1b9d2e43", 7, "completed")
    assert d["GPU1"].fabric is not None and d["GPU1"].fabric.state == "in-progress"
    assert d["GPU0"].fabric.clique == d["GPU1"].fabric.clique == "8a3e5c71-2d4f-4b96-a0e8-5f7c1b9d2e43.7"
    assert d["GPU2"].fabric is None and d["mlx5_0"].fabric is None


def test_topo_matrix_devices_take_complexes_too():
    text = """\
apiVersion: topo-device-plugin/v1
kind: SimulatedNode
topoMatrix: |
  \tGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity
  GPU0\t X \tNV18\tNODE\tNODE\t0-71\t0
  GPU1\tNV18\t X \tNODE\tNODE\t0-71\t0
  NIC0\tNODE\tNODE\t X \tNODE
  NIC1\tNODE\tNODE\tNODE\t X
  NIC Legend:
    NIC0: mlx5_0
    NIC1: mlx5_1
gpus:
  - {name: GPU0, complex: a, complexKind: cpu-root}
  - {name: GPU1, complex: b, complexKind: cpu-root}
nics:
  - {name: mlx5_0, complex: b, complexKind: cpu-root}
  - {name: mlx5_1, complex: a, complexKind: cpu-root}
"""
    t = load_node_yaml(text, "m.yaml")
    assert {(d.name, d.complex) for d in t.devices} == {("GPU0", "a"), ("GPU1", "b"), ("mlx5_0", "b"),
                                                       ("mlx5_1", "a")}


@pytest.mark.parametrize(
    "broken,line,field,fix",
    [
        # half a complex, either half
        (GOOD.replace("complex: c0, complexKind: data-direct, fabric", "complex: c0, fabric"),
         5, "gpus[0].complex", "add `complexKind`"),
        (GOOD.replace("{name: mlx5_0, numa: 0, complex: c1, complexKind", "{name: mlx5_0, numa: 0, complexKind"),
         9, "nics[0].complexKind", "add `complex`"),
        # an unknown kind, named by the schema
        (GOOD.replace("{name: mlx5_1, numa: 0, complex: c0, complexKind: data-direct}",
                      "{name: mlx5_1, numa: 0, complex: c0, complexKind: dd}"), 10, "nics[1].complexKind", "docs/"),
        # one complex, two kinds
        (GOOD.replace("{name: mlx5_1, numa: 0, complex: c0, complexKind: data-direct}",
                      "{name: mlx5_1, numa: 0, complex: c0, complexKind: inline}"), 10, "nics[1].complexKind",
         "same complexKind"),
        # a complex without a NIC (a typo in the NIC's ID)
        (GOOD.replace("{name: mlx5_1, numa: 0, complex: c0,", "{name: mlx5_1, numa: 0, complex: c9,"),
         5, "gpus[0].complex", "typo"),
        # fabric without a clique, and a clusterUuid that is not a UUID
        (GOOD.replace(", cliqueId: 7}}\n  - {numa: 0, complex: c1", "}}\n  - {numa: 0, complex: c1"),
         5, "gpus[0].fabric", "docs/"),
        (GOOD.replace("clusterUuid: 8A3E5C71-2D4F-4B96-A0E8-5F7C1B9D2E43", "clusterUuid: rack-1"),
         5, "gpus[0].fabric.clusterUuid", "docs/"),
        # NICs have no fabric
        (GOOD.replace("{name: mlx5_2, numa: 0}", "{name: mlx5_2, numa: 0, fabric: {clusterUuid: x, cliqueId: 1}}"),
         11, "nics[2]", "unknown field"),
    ],
)
def test_complex_and_fabric_errors_name_file_line_field_and_fix(broken, line, field, fix):
    with pytest.raises(TopologyError) as e:
        load_node_yaml(broken, "tray.yaml")
    msg = str(e.value)
    assert msg.startswith(f"tray.yaml:{line}:"), msg
    assert f"field {field}" in msg and "fix:" in msg and fix in msg.split("fix:", 1)[1], msg


# -- the built-in platforms ----------------------------------------------------------------------
def _pairs(t: NodeTopology) -> dict[str, str]:
    """GPU name -> the NIC of its complex (one each on these platforms)."""
    out: dict[str, str] = {}
    for g in t.gpus:
        nics = [n.name for n in t.nics if g.complex is not None and n.complex == g.complex]
        assert len(nics) == 1, (g.name, nics)
        out[g.name] = nics[0]
    return out


def _physical_order(devices) -> list[str]:
    return [d.name for d in sorted(devices, key=lambda d: d.pci_bus_id)]


def test_gb200_nics_on_cpu_root_ports_pair_by_physical_order_within_a_numa_node():
    t = load_topology("gb200-cx7")
    assert (len(t.gpus), len(t.nics)) == (4, 4)
    assert {d.complex_kind for d in (*t.gpus, *t.nics)} == {ComplexKind.CPU_ROOT}
    pairs = _pairs(t)
    assert len(set(pairs.values())) == 4  # one NIC per GPU
    for numa in (0, 1):
        gpus = _physical_order(g for g in t.gpus if g.numa == numa)
        nics = _physical_order(n for n in t.nics if n.numa == numa)
        assert len(gpus) == len(nics) == 2
        assert [pairs[g] for g in gpus] == nics  # the i-th GPU of a socket with its i-th NIC
    for g in t.gpus:
        for n in t.nics:
            # Each on its own root port: the PCIe path never says PIX/PXB/PHB.
            assert t.link(g.name, n.name).label == ("NODE" if g.numa == n.numa else "SYS")
    # Grace's GPU memory NUMA nodes exist, but a GPU's TopologyInfo NUMA node is its CPU's.
    assert {g.numa for g in t.gpus} == {0, 1} and set(t.numa_nodes) > {0, 1}
    assert all(t.link(a.name, b.name).label == "NV18" for a in t.gpus for b in t.gpus if a is not b)
    assert len({g.fabric.clique for g in t.gpus if g.fabric}) == 1 and all(g.fabric for g in t.gpus)


def test_gb300_data_direct_complexes_override_a_pcie_path_that_cannot_tell():
    t = load_topology("gb300-cx8-dd")
    assert (len(t.gpus), len(t.nics)) == (4, 4)
    assert {d.complex_kind for d in (*t.gpus, *t.nics)} == {ComplexKind.DATA_DIRECT}
    assert all(n.model == "ConnectX-8" for n in t.nics)
    pairs = _pairs(t)
    assert len(set(pairs.values())) == 4
    for g, n in pairs.items():
        # The NIC's PF sits on a Grace root port: the PCIe path to its own GPU is no closer than to the
        # other NIC of the socket, so only the complex names the pair.
        own = t.link(g, n).label
        assert own == "NODE"
        assert all(t.link(g, o.name).label in ("NODE", "SYS") for o in t.nics)
    # Names do not give the pairs away: at least one GPU's NIC is not the one of the same number.
    assert any(g.removeprefix("GPU") != n.removeprefix("mlx5_") for g, n in pairs.items())
    assert len({g.fabric.clique for g in t.gpus if g.fabric}) == 1 and all(g.fabric for g in t.gpus)
    assert all(t.link(a.name, b.name).label == "NV18" for a in t.gpus for b in t.gpus if a is not b)


def test_hgx_b200_pairs_by_pcie_switch_alone():
    t = load_topology("hgx-b200")
    assert (len(t.gpus), len(t.nics)) == (8, 8)
    assert all(d.complex is None and d.complex_kind is None for d in t.devices)
    for g in t.gpus:
        pix = [n.name for n in t.nics if t.link(g.name, n.name).label == "PIX"]
        assert len(pix) == 1 and t.device(pix[0]).numa == g.numa
    assert all(t.link(a.name, b.name).label == "NV18" for a in t.gpus for b in t.gpus if a is not b)
    assert {d.kind for d in t.devices} == {DeviceKind.GPU, DeviceKind.NIC}
