"""ResourceSlices built from topologies: the attributes a claim's constraints rely on, and the API limits."""

from __future__ import annotations

import pathlib

import re
from itertools import combinations

import pytest

from allocator.topology import Device, DeviceKind, Link, LinkLevel, NodeTopology
from plugin.dra.slices.build import (ATTR_NUMA_NODE, ATTR_PCI_BUS_ID, ATTR_PCIE_ROOT, SliceOptions,
                               build_resource_slices, device_table)
from plugin.sources.simulated import builtin_names, load_simulated
from tests.conftest import TOPOLOGIES

OPTS = SliceOptions(node_name="node-a")
_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def devices_of(topology: NodeTopology, opts: SliceOptions = OPTS) -> dict[str, dict]:
    out = {}
    for s in build_resource_slices(topology, opts):
        for d in s["spec"].get("devices", ()):
            out[d["name"]] = d
    return out


def attr(d: dict, name: str):
    v = d["attributes"].get(name)
    return None if v is None else next(iter(v.values()))


def by_topology_name(topology: NodeTopology, opts: SliceOptions = OPTS) -> dict[str, dict]:
    table = device_table(topology, opts)
    return {table[n].name: d for n, d in devices_of(topology, opts).items()}


# ---- the simulated built-ins ------------------------------------------------------------------


def test_dgx_h100_each_gpu_shares_a_pcie_switch_with_exactly_its_pix_nic():
    t = load_simulated("dgx-h100")
    devs = by_topology_name(t)
    for i in range(8):
        sw = attr(devs[f"GPU{i}"], "pcieSwitch")
        assert sw is not None
        sharing = sorted(n for n, d in devs.items() if attr(d, "pcieSwitch") == sw)
        assert sharing == sorted([f"GPU{i}", f"mlx5_{i}"])
        assert t.link(f"GPU{i}", f"mlx5_{i}").level == LinkLevel.PIX
        # pcieRoot pairs them too (the standard attribute a claim may match on instead).
        roots = sorted(n for n, d in devs.items() if attr(d, ATTR_PCIE_ROOT) == attr(devs[f"GPU{i}"], ATTR_PCIE_ROOT))
        assert roots == sharing


def test_dgx_h100_all_eight_gpus_share_one_nvlink_domain_and_nics_have_none():
    devs = by_topology_name(load_simulated("dgx-h100"))
    domains = {attr(devs[f"GPU{i}"], "nvlinkDomain") for i in range(8)}
    assert len(domains) == 1 and None not in domains
    assert all(attr(devs[f"mlx5_{i}"], "nvlinkDomain") is None for i in range(8))


def test_dgx_a100_nic_pairs_share_a_switch_gpus_share_the_root_complex():
    devs = by_topology_name(load_simulated("dgx-a100"))
    # mlx5_0/1 are PIX; GPU0/1 reach them through PXB: same root complex, no common switch attribute.
    assert attr(devs["mlx5_0"], "pcieSwitch") == attr(devs["mlx5_1"], "pcieSwitch") is not None
    assert attr(devs["GPU0"], "pcieSwitch") is None
    root = attr(devs["GPU0"], ATTR_PCIE_ROOT)
    assert sorted(n for n, d in devs.items() if attr(d, ATTR_PCIE_ROOT) == root) == ["GPU0", "GPU1", "mlx5_0", "mlx5_1"]
    assert len({attr(devs[f"GPU{i}"], "nvlinkDomain") for i in range(8)}) == 1


def test_pcie_2socket_gpu_pairs_and_numa():
    devs = by_topology_name(load_simulated("pcie-2socket-4gpu-2nic"))
    assert attr(devs["GPU0"], "pcieSwitch") == attr(devs["GPU1"], "pcieSwitch") is not None
    assert attr(devs["GPU2"], "pcieSwitch") == attr(devs["GPU3"], "pcieSwitch") is not None
    assert attr(devs["GPU0"], "pcieSwitch") != attr(devs["GPU2"], "pcieSwitch")
    assert attr(devs["mlx5_0"], "pcieSwitch") is None  # PXB to its GPUs: no switch to match on
    assert all(attr(devs[f"GPU{i}"], "nvlinkDomain") is None for i in range(4))
    assert [attr(devs[n], ATTR_NUMA_NODE) for n in ("GPU0", "GPU1", "GPU2", "GPU3", "mlx5_0", "mlx5_1")] == [0, 0, 1, 1, 0, 1]
    assert attr(devs["GPU0"], ATTR_PCIE_ROOT) == attr(devs["mlx5_0"], ATTR_PCIE_ROOT) != attr(devs["GPU2"], ATTR_PCIE_ROOT)


def test_gpu_attributes_and_memory_capacity():
    t = load_simulated("dgx-h100")
    g = devices_of(t)["gpu-3"]
    assert attr(g, "type") == "gpu" and attr(g, "index") == 3
    assert attr(g, "model") == "NVIDIA H100 80GB HBM3"
    assert attr(g, "uuid").startswith("GPU-")
    assert g["capacity"] == {"memory": {"value": "81559Mi"}}
    # Simulated devices have no PCI address: no pciBusID rather than a made-up one.
    assert ATTR_PCI_BUS_ID not in g["attributes"]


# ---- properties over every built-in and every recorded topology --------------------------------

ALL = [*builtin_names(), *(str(p) for p in TOPOLOGIES)]


@pytest.mark.parametrize("source", ALL, ids=lambda s: s.rsplit("/", 1)[-1])
def test_groups_only_promise_what_the_links_say(source):
    t = load_simulated(source)
    devs = by_topology_name(t)
    names = list(devs)
    for a, b in combinations(names, 2):
        da, db = devs[a], devs[b]
        if attr(da, "pcieSwitch") is not None and attr(da, "pcieSwitch") == attr(db, "pcieSwitch"):
            # PIX, or an NVLink pair (PCIe level hidden) both PIX to one more device (DGX-1's GPU pairs).
            assert t.link(a, b).level == LinkLevel.PIX or (t.link(a, b).nvlinks > 0 and any(
                t.link(a, x).level == t.link(b, x).level == LinkLevel.PIX for x in names if x not in (a, b))), (a, b)
        if attr(da, ATTR_PCIE_ROOT) != attr(db, ATTR_PCIE_ROOT) and None not in (attr(da, ATTR_PCIE_ROOT), attr(db, ATTR_PCIE_ROOT)):
            assert t.link(a, b).level <= LinkLevel.NODE, (a, b)  # different roots: never PIX/PXB/PHB
        if t.link(a, b).nvlinks > 0:
            assert attr(da, "nvlinkDomain") == attr(db, "nvlinkDomain") is not None
    for a in names:  # on these machines PIX is an equivalence: every device with a PIX peer is in a group
        if any(b != a and t.link(a, b).level == LinkLevel.PIX for b in names):
            assert attr(devs[a], "pcieSwitch") is not None, a


@pytest.mark.parametrize("source", ALL, ids=lambda s: s.rsplit("/", 1)[-1])
def test_slices_stay_within_the_api_limits(source):
    t = load_simulated(source)
    for s in build_resource_slices(t, OPTS):
        assert len(s["spec"].get("devices", ())) <= 64
        for d in s["spec"].get("devices", ()):
            assert _DNS_LABEL.match(d["name"]), d["name"]
            assert len(d["attributes"]) + len(d.get("capacity", {})) <= 32
            for name, value in d["attributes"].items():
                ident = name.split("/", 1)[-1]
                assert _C_IDENT.match(ident), name
                assert len(value) == 1, (name, value)  # exactly one of int/bool/string/version
                if "string" in value:
                    assert len(value["string"]) <= 64
        assert s["spec"]["pool"]["resourceSliceCount"] == len(build_resource_slices(t, OPTS))


def test_every_device_has_a_distinct_name_across_slices():
    nics = [Device(f"0000:{b:02x}:00.{f}", DeviceKind.NIC, index=b * 8 + f, numa=0, pci_bus_id=f"0000:{b:02x}:00.{f}",
                   attributes={"pf": f"0000:{b:02x}:00.0", "vf_index": str(f), "netdev": f"eth{b}v{f}",
                               "rdma": "true", "pcie_root": "pci0000:00"})
            for b in range(0x10, 0x1a) for f in range(1, 8)]
    t = NodeTopology.build(nics, {})
    slices = build_resource_slices(t, OPTS)
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 6]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert len(set(names)) == len(names) == 70
    vf = slices[0]["spec"]["devices"][0]
    assert attr(vf, "vf") is True and attr(vf, "vfIndex") == 1 and attr(vf, "pf") == "0000:10:00.0"
    assert attr(vf, "rdma") is True and attr(vf, "netdev") == "eth16v1"
    assert attr(vf, ATTR_PCI_BUS_ID) == "0000:10:00.1" and attr(vf, ATTR_PCIE_ROOT) == "pci0000:00"


def test_a_real_root_is_shared_with_devices_below_the_same_host_bridge():
    gpu = Device("GPU0", DeviceKind.GPU, 0, numa=0, pci_bus_id="0000:1b:00.0", uuid="GPU-a")
    nic = Device("mlx5_0", DeviceKind.NIC, 0, numa=0, pci_bus_id="0000:1c:00.0",
                 attributes={"pcie_root": "pci0000:17", "rdma": "true"})
    far = Device("GPU1", DeviceKind.GPU, 1, numa=1, pci_bus_id="0000:9b:00.0", uuid="GPU-b")
    t = NodeTopology.build([gpu, nic, far], [("GPU0", "mlx5_0", Link(level=LinkLevel.PIX))])
    devs = by_topology_name(t)
    assert attr(devs["GPU0"], ATTR_PCIE_ROOT) == "pci0000:17"
    # A real device whose root nobody read gets no root at all (never a made-up one).
    assert ATTR_PCIE_ROOT not in devs["GPU1"]["attributes"]


# ---- health and selection -----------------------------------------------------------------------


def test_unhealthy_devices_are_tainted_or_removed():
    t = load_simulated("dgx-h100").with_health({"GPU2": "Unhealthy"})
    tainted = devices_of(t)["gpu-2"]
    assert tainted["taints"] == [{"key": "topo.dev/unhealthy", "value": "Unhealthy", "effect": "NoSchedule"}]
    assert all("taints" not in d for n, d in devices_of(t).items() if n != "gpu-2")
    removed = devices_of(t, SliceOptions(node_name="node-a", unhealthy="remove"))
    assert "gpu-2" not in removed and len(removed) == 15


def test_only_included_devices_are_published_and_an_empty_pool_still_has_a_slice():
    t = load_simulated("dgx-h100")
    gpus_only = SliceOptions(node_name="node-a", include=lambda d: d.kind == DeviceKind.GPU)
    assert sorted(devices_of(t, gpus_only)) == [f"gpu-{i}" for i in range(8)]
    # The NICs' pcieSwitch IDs still come from the whole topology, so GPU IDs stay the same.
    assert attr(devices_of(t, gpus_only)["gpu-0"], "pcieSwitch") == attr(devices_of(t)["gpu-0"], "pcieSwitch")
    nothing = build_resource_slices(t, SliceOptions(node_name="node-a", include=lambda d: False))
    assert len(nothing) == 1 and "devices" not in nothing[0]["spec"]
    assert nothing[0]["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}


@pytest.mark.parametrize("kwargs, message", [
    ({"node_name": "Node_A"}, "not a DNS subdomain"),
    ({"node_name": "n", "driver_name": "topo"}, "DNS subdomain with a domain"),
    ({"node_name": "n", "unhealthy": "ignore"}, "not one of taint, remove"),
    ({"node_name": "n", "max_devices_per_slice": 128}, "1..64"),
])
def test_bad_options_are_refused_with_the_reason(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SliceOptions(**kwargs)


def test_dgx1_gpu_pairs_behind_one_switch_share_it_with_their_nic():
    """The matrix shows NV1/NV2 for GPU0-GPU1, hiding that both sit with mlx5_0 on one PCIe switch."""
    t = load_simulated("dgx-1-v100")
    devs = by_topology_name(t)
    assert t.link("GPU0", "mlx5_0").level == t.link("GPU1", "mlx5_0").level == LinkLevel.PIX
    sw = attr(devs["GPU0"], "pcieSwitch")
    assert sorted(n for n, d in devs.items() if attr(d, "pcieSwitch") == sw) == ["GPU0", "GPU1", "mlx5_0"]


def test_a_pix_relation_that_is_not_transitive_is_split_into_cliques():
    a, b, c = (Device(n, DeviceKind.NIC, i, numa=0) for i, n in enumerate("abc"))
    t = NodeTopology.build([a, b, c], [("a", "b", Link(level=LinkLevel.PIX)), ("b", "c", Link(level=LinkLevel.PIX)),
                                       ("a", "c", Link(level=LinkLevel.PXB))])
    devs = by_topology_name(t)
    assert attr(devs["a"], "pcieSwitch") == attr(devs["b"], "pcieSwitch") is not None
    assert attr(devs["c"], "pcieSwitch") is None


# ---- GPU–NIC complexes (Grace, ConnectX-8 Data Direct) ------------------------------------------

@pytest.mark.parametrize("source", ["gb200-cx7", "gb300-cx8-dd"])
def test_a_gpu_and_a_nic_share_a_complex_value_exactly_when_the_platform_pairs_them(source):
    """`matchAttribute: topo.dev/complex` over a GPU request and a NIC request can only be met by a
    pair of one complex; the PCIe switch cannot say it on these trays (no GPU has a PIX NIC)."""
    t = load_simulated(source)
    devs = by_topology_name(t)
    for g in t.gpus:
        assert attr(devs[g.name], "pcieSwitch") is None
        matching = [n.name for n in t.nics if attr(devs[n.name], "complex") == attr(devs[g.name], "complex")]
        assert matching == [n.name for n in t.nics if n.complex == g.complex] and len(matching) == 1, g.name
    values = [attr(devs[d.name], "complex") for d in t.gpus]
    assert len(set(values)) == len(values) and all(isinstance(v, str) and 0 < len(v) <= 64 for v in values)


def test_devices_outside_any_complex_have_no_complex_attribute():
    for source in ("dgx-h100", "hgx-b200"):
        assert all("complex" not in d["attributes"] for d in devices_of(load_simulated(source)).values()), source


def test_a_long_complex_id_is_shortened_alike_on_both_devices():
    long_id = "data-direct/" + "0000:3a:00.1-" * 6
    devs = [Device("GPU0", DeviceKind.GPU, 0, 0, complex=long_id), Device("nic0", DeviceKind.NIC, 0, 0,
                                                                         port="nic0", complex=long_id)]
    t = NodeTopology.build(devs, [], source="long")
    got = by_topology_name(t)
    a, b = attr(got["GPU0"], "complex"), attr(got["nic0"], "complex")
    assert a == b and len(a) <= 64 and a != long_id


def _close(topology: NodeTopology, gpu: str, nic: str) -> bool:
    g, n = topology.device(gpu), topology.device(nic)
    return (g.complex is not None and g.complex == n.complex) or topology.link(gpu, nic).level >= LinkLevel.PXB


def test_gb300_nics_follow_their_gpus_in_slice_order_though_their_numbers_do_not():
    """mlx5_1 is GPU0's complex partner: it comes first, so the scheduler's first-fit over an
    unconstrained claim (the extended-resource mapping) gives GPU k the NIC of GPU k."""
    topology = load_simulated("gb300-cx8-dd")
    names = [d["name"] for s in build_resource_slices(topology, OPTS) for d in s["spec"]["devices"]]
    assert names == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "nic-mlx5-1", "nic-mlx5-0", "nic-mlx5-3", "nic-mlx5-2"]
    for k in range(4):
        assert _close(topology, f"GPU{k}", names[4 + k].removeprefix("nic-").replace("-", "_"))


@pytest.mark.parametrize("node", builtin_names())
def test_slice_order_lists_gpus_by_numa_node_then_nics_by_their_first_close_gpu(node):
    topology = load_simulated(node)
    by_slice = {d["name"]: d for d in devices_of(topology).values()}
    table = device_table(topology, OPTS)
    order = [table[n] for s in build_resource_slices(topology, OPTS) for n in (d["name"] for d in s["spec"]["devices"])]
    assert set(by_slice) == {n for n in table}
    gpus = [d for d in order if d.kind == DeviceKind.GPU]
    nics = [d for d in order if d.kind == DeviceKind.NIC]
    assert order[:len(gpus)] == gpus
    # One run per NUMA node, the nodes with the most GPUs first.
    runs = [n for i, n in enumerate(d.numa for d in gpus) if i == 0 or gpus[i - 1].numa != n]
    assert len(runs) == len(set(runs)), (node, runs)
    sizes = [sum(d.numa == n for d in gpus) for n in runs]
    assert sizes == sorted(sizes, reverse=True), (node, runs, sizes)
    ranks = [next((i for i, g in enumerate(gpus) if _close(topology, g.name, n.name)), len(gpus)) for n in nics]
    assert ranks == sorted(ranks), (node, [n.name for n in nics], ranks)


# ---- GPUs discovered through NVML (the NVML double), switch addresses unknown -------------------


def _gb200_through_nvml(tmp_path, cliques=None):
    from dataclasses import replace as _replace

    from plugin.sources.nvml_gpus import NvmlGpuSource
    from topo_testkit.fake_nvml import FakeNvml

    sim = load_simulated("gb200-cx7")
    fake = FakeNvml(sim.without(d.name for d in sim.nics))
    assert fake.switch_address == "unknown"
    for name, clique in (cliques or {}).items():
        fake.set_fabric(name, _replace(fake.by_name[name].fabric, clique_id=clique))
    return NvmlGpuSource(nvml=fake, sysfs_root=fake.write_sysfs(str(tmp_path / "sys"))).load()


def test_a_gb200_tray_read_through_nvml_has_one_nvlink_domain_and_its_clique(tmp_path):
    """Driver 580 gives the switch end no address (FFFFFFFF:FF:FF.0): the GPUs still share a domain."""
    devs = by_topology_name(_gb200_through_nvml(tmp_path))
    gpus = [devs[f"GPU{i}"] for i in range(4)]
    assert len({attr(d, "nvlinkDomain") for d in gpus}) == 1 and attr(gpus[0], "nvlinkDomain") is not None
    (clique,) = {g.fabric.clique for g in load_simulated("gb200-cx7").gpus}
    assert {attr(d, "clique") for d in gpus} == {clique}


def test_gpus_of_two_fabric_cliques_are_two_nvlink_domains(tmp_path):
    devs = by_topology_name(_gb200_through_nvml(tmp_path, {"GPU2": 2, "GPU3": 2}))
    domain = {i: attr(devs[f"GPU{i}"], "nvlinkDomain") for i in range(4)}
    assert domain[0] == domain[1] and domain[2] == domain[3] and domain[0] != domain[2]
    assert None not in domain.values()


WORKSTATION = pathlib.Path(__file__).resolve().parents[1] / "support" / "nodes" / "workstation-gpu0-numa1.yaml"


def _first_fit(topology: NodeTopology, size: int) -> list[str]:
    """What the scheduler gives an unconstrained request of `size` GPUs on an empty node: the first in slice order."""
    gpus = [d["name"] for s in build_resource_slices(topology, OPTS) for d in s["spec"]["devices"]
            if d["name"].startswith("gpu-")]
    return gpus[:size]


def _allocator(topology: NodeTopology, size: int) -> list[str]:
    """The device plugin's answer on the same empty node (our allocator, numa-first), as slice names."""
    from allocator.policies import get_policy
    from allocator.request import AllocationRequest
    from allocator.topology import DeviceGraph

    graph = DeviceGraph.from_topology(topology, topology.gpus)
    got = get_policy("numa-first").allocate(graph, AllocationRequest.of(graph.ids, [], size)).ids
    return sorted(f"gpu-{topology.device(n).index}" for n in got)


def test_where_gpu_numbers_do_not_follow_the_sockets_first_fit_keeps_a_pod_on_one_numa_node():
    """Issue 35: GPU0 alone on NUMA node 1, GPU1-4 on NUMA node 0. Listed by index, first-fit gave a 2-GPU pod
    GPU0+GPU1 (two NUMA nodes) and a 4-GPU pod GPU0-3; now it gets what the device plugin gives."""
    topology = load_simulated(str(WORKSTATION))
    assert _first_fit(topology, 2) == ["gpu-1", "gpu-2"] == _allocator(topology, 2)
    assert _first_fit(topology, 4) == ["gpu-1", "gpu-2", "gpu-3", "gpu-4"] == _allocator(topology, 4)


def test_gpus_closest_to_each_other_are_listed_together():
    """DGX-1 (hybrid cube mesh): the first two GPUs are joined by two NVLinks, as the allocator's best pair is."""
    topology = load_simulated("dgx-1-v100")
    a, b = _first_fit(topology, 2)
    assert topology.link(f"GPU{a[4:]}", f"GPU{b[4:]}").nvlinks == 2
    assert topology.link("GPU0", "GPU1").nvlinks == 1  # by index the first two had one
