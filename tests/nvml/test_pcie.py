"""PCIe levels from sysfs realpaths, bus id normalisation and numa_node reading."""

from __future__ import annotations

import os

import pytest

from allocator.topology import LinkLevel
from plugin.sources.pcie import normalize_bdf, numa_node_count, pci_path, pcie_level, read_numa_node

PIX, PXB, PHB, NODE, SYS = LinkLevel.PIX, LinkLevel.PXB, LinkLevel.PHB, LinkLevel.NODE, LinkLevel.SYS


def make_tree(root: str, functions: dict[str, tuple[str, ...]], numa_online: str | None = None) -> str:
    """`functions`: bdf -> path components below `devices/` (root complex, bridges), the bdf appended."""
    for bdf, parents in functions.items():
        real = os.path.join(root, "devices", *parents, bdf)
        os.makedirs(real, exist_ok=True)
        link = os.path.join(root, "bus", "pci", "devices", bdf)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(real, os.path.dirname(link)), link)
    if numa_online is not None:
        path = os.path.join(root, "devices", "system", "node", "online")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(numa_online + "\n")
    return root


RC0, RC1 = "pci0000:17", "pci0000:85"
TREE = {
    # One switch (root port 17:01.0 -> up 18:00.0 -> downs 19:00.0 / 19:01.0) with two GPUs.
    "0000:1a:00.0": (RC0, "0000:17:01.0", "0000:18:00.0", "0000:19:00.0"),
    "0000:1b:00.0": (RC0, "0000:17:01.0", "0000:18:00.0", "0000:19:01.0"),
    # A dual-port card behind a third downstream port.
    "0000:1c:00.0": (RC0, "0000:17:01.0", "0000:18:00.0", "0000:19:02.0"),
    "0000:1c:00.1": (RC0, "0000:17:01.0", "0000:18:00.0", "0000:19:02.0"),
    # Nested switches below the same root port.
    "0000:1f:00.0": (RC0, "0000:17:01.0", "0000:18:00.0", "0000:19:03.0", "0000:1d:00.0", "0000:1e:00.0"),
    # Another root port of the same root complex.
    "0000:21:00.0": (RC0, "0000:17:02.0"),
    # Directly on the root bus (what VMs show).
    "0000:17:05.0": (RC0,),
    "0000:17:06.0": (RC0,),
    # Another root complex.
    "0000:86:00.0": (RC1, "0000:85:01.0"),
}


@pytest.fixture
def tree(tmp_path) -> str:
    return make_tree(str(tmp_path / "sys"), TREE, numa_online="0-1")


@pytest.mark.parametrize(("a", "b", "level"), [
    ("0000:1a:00.0", "0000:1b:00.0", PIX),   # one switch
    ("0000:1a:00.0", "0000:1c:00.1", PIX),   # GPU and NIC under one switch
    ("0000:1c:00.0", "0000:1c:00.1", PIX),   # two ports of one card
    ("0000:1a:00.0", "0000:1f:00.0", PXB),   # through a second switch
    ("0000:1a:00.0", "0000:21:00.0", PHB),   # different root ports
    ("0000:17:05.0", "0000:17:06.0", PHB),   # both on the root bus
    ("0000:17:05.0", "0000:1a:00.0", PHB),
])
def test_levels_within_one_root_complex(tree, a, b, level):
    assert pcie_level(tree, a, b, 0, 0) == level
    assert pcie_level(tree, b, a, 0, 0) == level


def test_levels_across_root_complexes_follow_numa(tree):
    assert pcie_level(tree, "0000:1a:00.0", "0000:86:00.0", 0, 0) == NODE
    assert pcie_level(tree, "0000:1a:00.0", "0000:86:00.0", 0, 1) == SYS
    # Unknown NUMA on a 2-node machine: never claim closeness.
    assert pcie_level(tree, "0000:1a:00.0", "0000:86:00.0", None, 0) == SYS


def test_unknown_numa_on_a_single_node_machine_is_node(tmp_path):
    root = make_tree(str(tmp_path / "sys"), {"0000:1a:00.0": (RC0,), "0000:86:00.0": (RC1,)}, numa_online="0")
    assert numa_node_count(root) == 1
    assert pcie_level(root, "0000:1a:00.0", "0000:86:00.0", None, None) == NODE
    assert numa_node_count(str(tmp_path / "nothing")) == 0
    assert pcie_level(str(tmp_path / "nothing"), "0000:1a:00.0", "0000:86:00.0", None, None) == SYS


def test_unreadable_paths_fall_back_to_numa(tmp_path):
    root = str(tmp_path)
    assert pcie_level(root, "0000:3b:00.0", "0000:5e:00.0", 0, 0) == NODE
    assert pcie_level(root, "0000:3b:00.0", "0000:af:00.0", 0, 1) == SYS
    assert pcie_level(root, "0000:3b:00.0", "0000:3b:00.1", None, None) == PIX  # one card, no tree needed


def test_accepts_nvml_bus_ids(tree):
    assert pcie_level(tree, "00000000:1A:00.0", "00000000:1B:00.0") == PIX


def test_pci_path(tree):
    assert pci_path(tree, "0000:1b:00.0") == (RC0, "0000:17:01.0", "0000:18:00.0", "0000:19:01.0", "0000:1b:00.0")
    assert pci_path(tree, "0000:99:00.0") is None


@pytest.mark.parametrize(("given", "kernel"), [
    ("00000000:3B:00.0", "0000:3b:00.0"),
    ("0000:3B:00.0", "0000:3b:00.0"),
    ("3b:00.0", "0000:3b:00.0"),
    (b"00000001:0A:1F.7\x00", "0001:0a:1f.7"),
    ("00010000:E1:00.0", "10000:e1:00.0"),  # VMD domains keep their width
])
def test_normalize_bdf(given, kernel):
    assert normalize_bdf(given) == kernel


@pytest.mark.parametrize("bad", ["", "GPU0", "0000:3b:00", "0000:3b:20.0", "0000:3b:00.8", "1:2:3:4.0"])
def test_normalize_bdf_rejects(bad):
    with pytest.raises(ValueError, match="not a PCI address"):
        normalize_bdf(bad)


def test_read_numa_node(tmp_path):
    root = str(tmp_path)
    for bdf, text in (("0000:01:00.0", "1\n"), ("0000:02:00.0", "-1\n"), ("0000:03:00.0", "junk")):
        os.makedirs(os.path.join(root, "bus", "pci", "devices", bdf))
        with open(os.path.join(root, "bus", "pci", "devices", bdf, "numa_node"), "w") as f:
            f.write(text)
    assert read_numa_node(root, "0000:01:00.0") == 1
    assert read_numa_node(root, "0000:02:00.0") is None
    assert read_numa_node(root, "0000:03:00.0") is None
    assert read_numa_node(root, "0000:04:00.0") is None


def test_agrees_with_the_generated_node_for_every_pair(tmp_path):
    """The NIC fixtures compute levels from their own description; sysfs realpaths must give the same."""
    from topo_testkit import sysfs_fixture as fixture
    node = fixture.write_node(fixture.default_node(), str(tmp_path / "node"))
    funcs = [f for f in node.functions if f.role in ("gpu", "pf", "vf")]
    seen = set()
    for i, a in enumerate(funcs):
        for b in funcs[i + 1:]:
            want = fixture.link_level(a, b)
            assert pcie_level(node.sysfs_root, a.bdf, b.bdf, a.numa, b.numa) == want, (a.bdf, b.bdf)
            seen.add(want)
    assert seen == {PIX, PXB, PHB, NODE, SYS}
