"""GPU–NIC complexes found by the real hardware source on generated GB200, GB300, HGX B200 and
ConnectX-8 inline trees (sysfs fixture + NVML double), and what a broken VPD or a missing DMA
function does: that GPU pairs by PCIe path, one warning names it, nothing crashes.

The expected complexes are declared in the fixtures' specs (what each platform defines), not
computed by the code under test.
"""

from __future__ import annotations

import logging

import pytest

from allocator.topology import ComplexKind, LinkLevel
from plugin.sources.hardware import HardwareOptions, HardwareSource
from topo_testkit import sysfs_fixture as sf


def source(node: sf.GeneratedNode, **kw) -> HardwareSource:
    return HardwareSource(HardwareOptions(
        sysfs_root=node.sysfs_root, dev_root=node.dev_root, proc_root=node.proc_root,
        nvml=sf.fake_nvml(node), hotplug=False, node_name=node.spec.name, **kw))


def complexes(topology) -> dict[str, tuple[str | None, ComplexKind | None]]:
    return {d.name: (d.complex, d.complex_kind) for d in topology.devices}


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "plugin.sources.hardware"]


@pytest.mark.parametrize("spec", [sf.gb200_cx7_node, sf.gb300_cx8_dd_node, sf.hgx_b200_node, sf.cx8_inline_node],
                         ids=["gb200-cx7", "gb300-cx8-dd", "hgx-b200", "cx8-inline"])
def test_discovery_finds_the_platforms_complexes(tmp_path, caplog, spec):
    node = sf.write_node(spec(), str(tmp_path))
    with caplog.at_level(logging.WARNING):
        found = source(node).load()
    assert complexes(found) == complexes(node.topology)
    assert found == node.topology  # links, NUMA nodes and every NIC fact too
    assert warnings_of(caplog) == []


def test_gb200_pairs_each_gpu_with_the_nic_in_the_same_physical_place(tmp_path):
    node = sf.write_node(sf.gb200_cx7_node(), str(tmp_path))
    t = source(node).load()
    by_complex: dict[str, list[str]] = {}
    for d in t.devices:
        if d.complex:
            assert d.complex_kind is ComplexKind.CPU_ROOT
            by_complex.setdefault(d.complex, []).append(d.pci_bus_id or "")
    # Within a socket: the lower GPU address with the lower NIC address.
    assert by_complex == {"numa0-0": ["0008:01:00.0", "0001:01:00.0"], "numa0-1": ["0009:01:00.0", "0002:01:00.0"],
                          "numa1-0": ["0018:01:00.0", "0010:01:00.0"], "numa1-1": ["0019:01:00.0", "0012:01:00.0"]}
    # PCIe alone cannot tell them apart: every GPU-NIC pair of a socket is NODE.
    assert {t.link("GPU0", n.name).level for n in t.nics if n.numa == 0} == {LinkLevel.NODE}
    bf3 = next(n for n in t.nics if n.model == "BlueField-3")
    assert bf3.complex is None  # a DPU on a Grace root port is no GPU's NIC


def test_data_direct_dma_function_is_matched_to_its_pf_by_board_serial(tmp_path):
    """The PFs are crossed against the GPUs' order: only the serial can pair them right."""
    node = sf.write_node(sf.gb300_cx8_dd_node(), str(tmp_path))
    src = source(node)
    t = src.load()
    gpu0, gpu1 = t.device("GPU0"), t.device("GPU1")
    nic_of = {d.complex: d.pci_bus_id for d in t.nics}
    assert (gpu0.complex, nic_of[gpu0.complex]) == ("MT2452XZ0A01", "0003:01:00.0")
    assert (gpu1.complex, nic_of[gpu1.complex]) == ("MT2452XZ0A02", "0002:01:00.0")
    assert gpu0.complex_kind is ComplexKind.DATA_DIRECT
    # The DMA functions themselves are no NIC to offer.
    dmas = [f.bdf for f in node.functions if f.role == "dma"]
    assert len(dmas) == 4 and not {d.name for d in t.nics} & set(dmas)
    assert all("Data Direct DMA" in src.nic_inventory.skipped[b] for b in dmas)


def _truncated() -> bytes:
    return sf.make_vpd("MT2452XZ0A01")[:20]


@pytest.mark.parametrize(("fault", "blamed", "reason"), [
    ({"dma_vpd": {0: sf.make_vpd("MT2452XZ0A01", checksum_ok=False)}}, "DMA", "checksum"),
    ({"dma_vpd": {0: _truncated()}}, "DMA", "past"),
    ({"dma_vpd": {0: sf.make_vpd(None)}}, "DMA", "no serial number"),
    ({"pf_vpd": {0: sf.make_vpd("MT2452XZ0A01", checksum_ok=False)}}, "PF", "checksum"),
    ({"pf_vpd": {0: sf.make_vpd(None)}}, "PF", "no serial number"),
    ({"no_dma": frozenset({0})}, "switch", "no NIC or Data Direct DMA function"),
], ids=["dma-bad-checksum", "dma-truncated", "dma-no-sn", "pf-bad-checksum", "pf-no-sn", "dma-missing"])
def test_a_broken_data_direct_complex_degrades_to_pcie_pairing_with_one_warning(tmp_path, caplog, fault, blamed,
                                                                               reason):
    node = sf.write_node(sf.gb300_cx8_dd_node(**fault), str(tmp_path))
    src = source(node)
    with caplog.at_level(logging.WARNING):
        found = src.load()
        src.discover()  # a rescan: the same fault is not reported again
    assert complexes(found) == complexes(node.topology)  # GPU0 and its NIC: none; the others intact
    assert found.device("GPU0").complex is None
    assert {found.device(f"GPU{i}").complex for i in (1, 2, 3)} == {"MT2452XZ0A02", "MT2452XZ0A03", "MT2452XZ0A04"}
    messages = warnings_of(caplog)
    assert len(messages) == 1, messages
    gpu0 = node.function("GPU0")
    assert "GPU0" in messages[0] and gpu0.bdf in messages[0] and reason in messages[0]
    if blamed == "PF":
        assert node.function("ibp3s0").bdf in messages[0]  # the PF whose VPD is bad
    elif blamed == "DMA":
        dma = next(f for f in node.functions if f.role == "dma" and f.host_bridge == gpu0.host_bridge)
        assert dma.bdf in messages[0]
    # PCIe path pairing stands for GPU0: its NIC on the same socket is NODE, as sysfs says.
    assert found.link("GPU0", node.function("ibp3s0").bdf).level is LinkLevel.NODE


def test_no_complex_on_a_tree_without_connectx_or_grace(tmp_path, caplog):
    node = sf.write_node(sf.default_node(), str(tmp_path))
    with caplog.at_level(logging.WARNING):
        t = source(node).load()
    assert all(d.complex is None and d.complex_kind is None for d in t.devices)
    assert warnings_of(caplog) == []
