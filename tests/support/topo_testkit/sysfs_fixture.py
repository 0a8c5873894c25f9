"""Generate a node's sysfs, /dev and /proc trees from topology data.

Why generated and not recorded: a test should say "two sockets, a PCIe
switch with two GPUs and a ConnectX card, one VF on vfio-pci" and get every
file, symlink and number that follows from it, consistent by construction
(bus numbers, `physfn`/`virtfn*` pairs, IOMMU groups, RDMA char devices,
the default route). The same description also yields the topology that
discovery must produce (`GeneratedNode.topology`), so a test compares two
independently computed answers. Run as a module to write a whole demo node:

    PYTHONPATH=tests/support python -m topo_testkit.sysfs_fixture OUTDIR

which writes `OUTDIR/{sys,dev,proc}`, `OUTDIR/config.yaml` (NIC pools for
this node, paths set) and `OUTDIR/node.yaml` (the expected topology as a
SimulatedNode, for the fake NVML and for comparisons). The node has no GPU
driver; `python -m topo_testkit.with_fake_nvml OUTDIR/node.yaml serve
--config OUTDIR/config.yaml` runs the daemon with NVML answered from node.yaml.

The PCIe hierarchy is real-looking: `bus/pci/devices/<bdf>` links into
`devices/pci0000:BB/<root port>/<switch up>/<switch down>/<bdf>`, so PCIe
distances can be computed from realpaths as on a real machine. Expected
link levels follow `nvidia-smi topo -m`: same socket and host bridge but
different root ports -> PHB; different host bridges -> NODE; different
sockets -> SYS; under one switch (or one card) -> PIX; through several
switches below one root port -> PXB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Union

import yaml

from allocator.topology import HEALTHY, ComplexKind, Device, DeviceKind, FabricInfo, Link, LinkLevel, NodeTopology

_UUID_NS = uuid.UUID("0b6f7d1e-3c2a-4f59-a1e8-5d4c3b2a1908")


# -- the description --------------------------------------------------------
@dataclass(frozen=True)
class Gpu:
    model: str = "NVIDIA A100 80GB PCIe"
    device_id: str = "20b5"
    memory_mib: int = 81920
    #: What the platform defines (the expected answer, declared by the test author): complex ID and kind.
    complex: str | None = None
    complex_kind: ComplexKind | None = None
    #: NVLink fabric membership the fake NVML reports for this GPU.
    fabric: FabricInfo | None = None
    #: Write this in the GPU's `numa_node` instead of its socket's (a GPU-memory node, to test the guard).
    sysfs_numa: int | None = None


@dataclass(frozen=True)
class DmaFunction:
    """A ConnectX-8 Data Direct DMA function (15b3:2100); its VPD names its board by serial."""

    serial: str | None = None
    #: Raw VPD bytes instead of the generated ones (malformed VPD tests); b"" writes no file.
    vpd: bytes | None = None


@dataclass(frozen=True)
class Vf:
    #: `vfio-pci` binds the VF for DPDK/VMs (no netdev, an IOMMU group device).
    driver: str | None = None
    rdma: bool = False


@dataclass(frozen=True)
class Port:
    """One physical function of a NIC card (one port)."""

    netdev: str
    vfs: tuple[Vf, ...] = ()
    #: `sriov_totalvfs`; 0 means the function cannot do SR-IOV (no sriov_* files).
    total_vfs: int = 8
    link_type: str = "ether"
    operstate: str = "up"
    rdma: bool = False
    #: The host's default route goes out of this netdev (it must never be offered).
    default_route: bool = False
    #: A child device the netdev sits under instead of the function itself (virtio: `virtio0`).
    netdev_parent: str | None = None


@dataclass(frozen=True)
class NicCard:
    ports: tuple[Port, ...]
    vendor: str = "15b3"
    device: str = "101b"
    vf_device: str = "101c"
    driver: str = "mlx5_core"
    #: Driver of VFs that do not name one (mlx5 VFs use mlx5_core; Intel's use iavf).
    vf_driver: str = "mlx5_core"
    #: Board serial written into each PF's VPD (None: no `vpd` file).
    serial: str | None = None
    #: Raw VPD bytes instead of the generated ones (malformed VPD tests).
    vpd: bytes | None = None
    #: The expected complex of every offered function of this card.
    complex: str | None = None
    complex_kind: ComplexKind | None = None


@dataclass(frozen=True)
class Switch:
    """A PCIe switch: an upstream port and one downstream port per child."""

    children: tuple[Child, ...]
    #: PCI IDs of its ports (a ConnectX-8's integrated switch: 15b3:197c; Broadcom PEX: 1000:c030).
    vendor: str = "8086"
    device: str = "2030"


Child = Union[Gpu, NicCard, Switch, DmaFunction]


@dataclass(frozen=True)
class HostBridge:
    """A PCI root complex (`pci0000:BB`); each child sits behind its own root port."""

    children: tuple[Child, ...]
    bus: int | None = None
    #: PCI domain (segment) of this root complex; Grace gives every root port its own.
    domain: int = 0
    #: PCI IDs of its root ports (Grace: 10de:22b1).
    root_port: tuple[str, str] = ("8086", "2030")


@dataclass(frozen=True)
class Socket:
    numa: int | None
    host_bridges: tuple[HostBridge, ...]


@dataclass(frozen=True)
class Bond:
    """A bond over port netdevs; with `default_route` the route leaves through it."""

    name: str
    slaves: tuple[str, ...]
    default_route: bool = True


@dataclass(frozen=True)
class NodeSpec:
    name: str
    sockets: tuple[Socket, ...]
    #: NVLink bridges: (GPU index, GPU index, link count).
    nvlinks: tuple[tuple[int, int, int], ...] = ()
    #: Every GPU pair joined through NVSwitch with this many links (0: no NVSwitch).
    nvswitch_links: int = 0
    #: NUMA distance between different sockets (10 on the diagonal).
    numa_distance: int = 21
    bonds: tuple[Bond, ...] = ()
    #: NUMA nodes without CPUs holding GPU memory (Grace): (node, the socket's NUMA node it belongs to).
    gpu_memory_nodes: tuple[tuple[int, int], ...] = ()
    #: CPUs per socket, for `cpulist` (memory-only nodes get an empty one).
    cpus_per_socket: int = 72


def default_node() -> NodeSpec:
    """The issue's node: 2 sockets, 8 GPUs, 2 dual-port ConnectX-6 cards with VFs, one VF on
    vfio-pci, one RDMA (InfiniBand) port, and an onboard X710 whose first port is the uplink.

    Every link level occurs: GPU0/GPU1/card0 share a switch (PIX), GPU2/GPU3 sit behind
    nested switches (PXB), the X710 has its own root port next to them (PHB), the two host
    bridges of a socket are NODE apart and the sockets SYS. GPU pairs have NVLink bridges (NV12).
    """
    cx0 = NicCard(ports=(
        Port("ens1f0", vfs=(Vf(), Vf(), Vf(), Vf(driver="vfio-pci"))),
        Port("ens1f1"),
    ))
    cx1 = NicCard(ports=(
        Port("ens2f0", vfs=(Vf(), Vf(), Vf(), Vf())),
        Port("ibp2s0f1", link_type="infiniband", rdma=True),
    ))
    x710 = NicCard(
        ports=(Port("eno1", total_vfs=32, default_route=True), Port("eno2", total_vfs=32)),
        vendor="8086", device="1572", vf_device="154c", driver="i40e", vf_driver="iavf",
    )
    return NodeSpec(
        name="gen-2socket-8gpu-2cx6",
        sockets=(
            Socket(0, (
                HostBridge((Switch((Gpu(), Gpu(), cx0)),), bus=0x17),
                HostBridge((Switch((Switch((Gpu(),)), Switch((Gpu(),)))), x710), bus=0x3a),
            )),
            Socket(1, (
                HostBridge((Switch((Gpu(), Gpu(), cx1)),), bus=0x85),
                HostBridge((Switch((Switch((Gpu(),)), Switch((Gpu(),)))),), bus=0xae),
            )),
        ),
        nvlinks=((0, 1, 12), (2, 3, 12), (4, 5, 12), (6, 7, 12)),
    )


# -- the platforms people buy now (docs/platforms.md) ---------------------------
GRACE_RP = ("10de", "22b1")
CX_SWITCH = ("15b3", "197c")
BROADCOM_SWITCH = ("1000", "c030")
#: The NVLink domain every GB200/GB300 GPU below reports (one rack, one clique).
NVL72_FABRIC = FabricInfo("8a3e5c71-2d4f-4b96-a0e8-5f7c1b9d2e43", 7)


def _ib_port(name: str) -> Port:
    return Port(name, total_vfs=0, link_type="infiniband", rdma=True)


def gb200_cx7_node(fabric: FabricInfo | None = NVL72_FABRIC) -> NodeSpec:
    """A GB200 NVL72 compute tray: 2 Grace sockets, 4 GPUs and 4 ConnectX-7 NICs, every one on a Grace
    root port of its own (its own PCI domain), plus a BlueField-3 that is no GPU's NIC.

    Complexes (cpu-root): within a NUMA node the i-th GPU and the i-th ConnectX in PCI address
    order. GPU memory shows up as NUMA nodes 2/10 (socket 0) and 18/26 (socket 1), with no CPUs.
    """
    def gpu(cid: str) -> Gpu:
        return Gpu(model="NVIDIA GB200", device_id="2941", memory_mib=189471, complex=cid,
                   complex_kind=ComplexKind.CPU_ROOT, fabric=fabric)

    def cx7(netdev: str, cid: str | None) -> NicCard:
        return NicCard(ports=(_ib_port(netdev),), device="1021", vf_device="101e",
                       complex=cid, complex_kind=ComplexKind.CPU_ROOT if cid else None)

    def on_root(domain: int, child: Child) -> HostBridge:
        return HostBridge((child,), domain=domain, root_port=GRACE_RP)

    bf3 = NicCard(ports=(Port("enP6p3s0f0np0", total_vfs=0),), device="a2dc", vf_device="101e")
    return NodeSpec(
        name="gen-gb200-cx7",
        sockets=(
            Socket(0, (on_root(0x0001, cx7("ibp1s0", "numa0-0")), on_root(0x0002, cx7("ibp2s0", "numa0-1")),
                       on_root(0x0006, bf3), on_root(0x0008, gpu("numa0-0")), on_root(0x0009, gpu("numa0-1")))),
            Socket(1, (on_root(0x0010, cx7("ibp16s0", "numa1-0")), on_root(0x0012, cx7("ibp18s0", "numa1-1")),
                       on_root(0x0018, gpu("numa1-0")), on_root(0x0019, gpu("numa1-1")))),
        ),
        nvswitch_links=18, numa_distance=40,
        gpu_memory_nodes=((2, 0), (10, 0), (18, 1), (26, 1)),
    )


def gb300_cx8_dd_node(dma_vpd: dict[int, bytes] | None = None, no_dma: frozenset[int] = frozenset(),
                      pf_vpd: dict[int, bytes] | None = None,
                      fabric: FabricInfo | None = NVL72_FABRIC) -> NodeSpec:
    """A GB300 NVL72 compute tray with ConnectX-8 Data Direct: each GPU sits below a ConnectX
    switch (15b3:197c) next to its NIC's DMA function (15b3:2100); the NIC's PF is on a Grace root
    port of its own. Only the board serial in the VPD ties a DMA function to its PF, and the PFs'
    physical order is crossed against the GPUs' on purpose (GPU0's board is the second NIC).

    Faults for the degradation tests: `dma_vpd[i]` / `pf_vpd[i]` replace GPU i's DMA function's /
    NIC's VPD bytes, `no_dma` leaves GPU i's DMA function out. A GPU so broken gets no complex.
    """
    dma_vpd, pf_vpd = dma_vpd or {}, pf_vpd or {}
    serial = [f"MT2452XZ0A0{i + 1}" for i in range(4)]

    def fine(i: int) -> bool:
        return i not in dma_vpd and i not in no_dma and i not in pf_vpd

    def gpu_complex(i: int) -> Switch:
        ok = fine(i)
        dma = () if i in no_dma else (DmaFunction(serial[i], vpd=dma_vpd.get(i)),)
        gpu = Gpu(model="NVIDIA GB300", device_id="31c2", memory_mib=274658, fabric=fabric,
                  complex=serial[i] if ok else None, complex_kind=ComplexKind.DATA_DIRECT if ok else None)
        return Switch((*dma, Switch((gpu,), *CX_SWITCH)), *CX_SWITCH)

    def nic(i: int, netdev: str) -> NicCard:
        ok = fine(i)
        return NicCard(ports=(_ib_port(netdev),), device="1023", vf_device="101e", serial=serial[i],
                       vpd=pf_vpd.get(i), complex=serial[i] if ok else None,
                       complex_kind=ComplexKind.DATA_DIRECT if ok else None)

    def on_root(domain: int, child: Child) -> HostBridge:
        return HostBridge((child,), domain=domain, root_port=GRACE_RP)

    return NodeSpec(
        name="gen-gb300-cx8-dd",
        sockets=(
            Socket(0, (on_root(0x0002, nic(1, "ibp2s0")), on_root(0x0003, nic(0, "ibp3s0")),
                       on_root(0x0008, gpu_complex(0)), on_root(0x0009, gpu_complex(1)))),
            Socket(1, (on_root(0x0012, nic(3, "ibp18s0")), on_root(0x0013, nic(2, "ibp19s0")),
                       on_root(0x0018, gpu_complex(2)), on_root(0x0019, gpu_complex(3)))),
        ),
        nvswitch_links=18, numa_distance=40,
        gpu_memory_nodes=((2, 0), (10, 0), (18, 1), (26, 1)),
    )


def hgx_b200_node() -> NodeSpec:
    """HGX B200 (switch-based): 8 GPUs and 8 ConnectX-7 on four Broadcom PCIe switches, two GPUs and
    two NICs per switch; the PCIe path alone pairs them (PIX), and no complex is defined."""
    def switch(k: int) -> HostBridge:
        cards = tuple(NicCard(ports=(_ib_port(f"ibp{k}s{j}"),), device="1021", vf_device="101e") for j in (0, 1))
        gpus = (Gpu(model="NVIDIA B200", device_id="2901", memory_mib=183359),) * 2
        return HostBridge((Switch(gpus + cards, *BROADCOM_SWITCH),), bus=0x10 + 0x20 * k)

    return NodeSpec(name="gen-hgx-b200", sockets=(Socket(0, (switch(0), switch(1))), Socket(1, (switch(2), switch(3)))),
                    nvswitch_links=18)


def cx8_inline_node() -> NodeSpec:
    """ConnectX-8 inline: each GPU hangs off the PCIe switch inside a ConnectX-8 (15b3:197c) that also
    holds the NIC's PF (an x86 host, HGX B300 style). Complex: the switch's GPU and NIC (ID: board serial)."""
    def tray(k: int) -> HostBridge:
        serial = f"MT2501XZ0B0{k}"
        gpu = Gpu(model="NVIDIA B300", device_id="3182", memory_mib=274658, complex=serial,
                  complex_kind=ComplexKind.INLINE)
        card = NicCard(ports=(_ib_port(f"ibp{k}s0"),), device="1023", vf_device="101e", serial=serial,
                       complex=serial, complex_kind=ComplexKind.INLINE)
        return HostBridge((Switch((Switch((gpu,), *CX_SWITCH), card), *CX_SWITCH),), bus=0x10 + 0x20 * k)

    return NodeSpec(name="gen-cx8-inline", sockets=(Socket(0, (tray(0), tray(1))), Socket(1, (tray(2), tray(3)))),
                    nvswitch_links=18)


# -- placement ---------------------------------------------------------------
@dataclass
class Function:
    """One PCI function as placed in the generated tree."""

    bdf: str
    #: Path components below `devices/`, ending with the BDF.
    path: tuple[str, ...]
    role: str  # bridge | gpu | pf | vf | dma
    numa: int | None
    vendor: str
    device: str
    cls: int
    driver: str | None
    socket: int = 0
    host_bridge: str = ""
    root_port: str = ""
    #: Identity of the switch/root port the function hangs off, and of its card.
    parent: str = ""
    card: str = ""
    # GPUs
    gpu_index: int | None = None
    gpu: Gpu | None = None
    # NICs
    netdev: str | None = None
    operstate: str = "up"
    link_type: str = "ether"
    rdma_dev: str | None = None
    char_devs: tuple[str, ...] = ()
    pf: str | None = None
    vf_index: int | None = None
    vfs: list[str] = field(default_factory=list)
    total_vfs: int = 0
    default_route: bool = False
    netdev_parent: str | None = None
    iommu_group: int | None = None
    #: Bytes of the function's `vpd` file (None: no file).
    vpd: bytes | None = None
    #: The card a NIC function belongs to (its expected complex).
    nic: NicCard | None = None


class _Placer:
    def __init__(self, spec: NodeSpec):
        self.spec = spec
        self.functions: list[Function] = []
        self.next_bus = 0x01
        self.domain = 0
        self.domain_bus: dict[int, int] = {}
        self.gpus = 0
        self.rdma = 0
        self.uverbs = 0
        self.umad = 0
        self.switches = 0
        self.cards = 0

    def bus(self) -> int:
        if self.domain:
            b = self.domain_bus.get(self.domain, 0x01)
            self.domain_bus[self.domain] = b + 1
        else:
            b = self.next_bus
            self.next_bus += 1
        if b > 0xFF:
            raise ValueError("node needs more than 256 PCI buses")
        return b

    def place(self) -> list[Function]:
        for si, sock in enumerate(self.spec.sockets):
            for hb in sock.host_bridges:
                self.domain = hb.domain
                if hb.domain:  # a segment of its own (Grace): root bus 00, buses counted per domain
                    bus = 0x00
                    self.domain_bus.setdefault(hb.domain, 0x01)
                else:
                    bus = max(hb.bus or 0, self.next_bus)
                    self.next_bus = bus + 1
                d = f"{hb.domain:04x}"
                root = f"pci{d}:{bus:02x}"
                for ci, child in enumerate(hb.children):
                    rp = f"{d}:{bus:02x}:{ci + 1:02x}.0" if not hb.domain else f"{d}:{bus:02x}:{ci:02x}.0"
                    self._bridge(rp, (root, rp), sock.numa, si, root, rp, ids=hb.root_port)
                    self._child(child, (root, rp), self.bus(), sock.numa, si, root, rp, parent=rp)
        return self.functions

    def _bdf(self, bus: int, dev: int = 0, fn: int = 0) -> str:
        return f"{self.domain:04x}:{bus:02x}:{dev:02x}.{fn}"

    def _bridge(self, bdf: str, path: tuple[str, ...], numa, si, root, rp,
                ids: tuple[str, str] = ("8086", "2030")) -> None:
        self.functions.append(Function(bdf, path, "bridge", numa, ids[0], ids[1], 0x060400, "pcieport",
                                       socket=si, host_bridge=root, root_port=rp))

    def _child(self, child: Child, path, bus: int, numa, si, root, rp, parent: str) -> None:
        if isinstance(child, Switch):
            self.switches += 1
            sw = f"switch{self.switches}"
            up = self._bdf(bus)
            ids = (child.vendor, child.device)
            self._bridge(up, path + (up,), numa, si, root, rp, ids=ids)
            inner = self.bus()
            for k, c in enumerate(child.children):
                down = self._bdf(inner, k)
                self._bridge(down, path + (up, down), numa, si, root, rp, ids=ids)
                self._child(c, path + (up, down), self.bus(), numa, si, root, rp, parent=sw)
        elif isinstance(child, DmaFunction):
            bdf = self._bdf(bus)
            self.functions.append(Function(
                bdf, path + (bdf,), "dma", numa, "15b3", "2100", 0x020000, "mlx5_core",
                socket=si, host_bridge=root, root_port=rp, parent=parent, card=bdf,
                vpd=child.vpd if child.vpd is not None else (make_vpd(child.serial) if child.serial else None),
            ))
        elif isinstance(child, Gpu):
            bdf = self._bdf(bus)
            self.functions.append(Function(
                bdf, path + (bdf,), "gpu", numa, "10de", child.device_id, 0x030200, "nvidia",
                socket=si, host_bridge=root, root_port=rp, parent=parent, card=bdf,
                gpu_index=self.gpus, gpu=child,
            ))
            self.gpus += 1
        elif isinstance(child, NicCard):
            self.cards += 1
            card = f"card{self.cards}"
            slot = len(child.ports)
            for p, port in enumerate(child.ports):
                pf_bdf = self._bdf(bus, 0, p)
                cls = 0x020700 if port.link_type == "infiniband" else 0x020000
                pf = Function(
                    pf_bdf, path + (pf_bdf,), "pf", numa, child.vendor, child.device, cls, child.driver,
                    socket=si, host_bridge=root, root_port=rp, parent=parent, card=card,
                    netdev=port.netdev, operstate=port.operstate, link_type=port.link_type,
                    total_vfs=port.total_vfs if (port.total_vfs or port.vfs) else 0,
                    default_route=port.default_route, netdev_parent=port.netdev_parent,
                    vpd=child.vpd if child.vpd is not None else (make_vpd(child.serial) if child.serial else None),
                    nic=child,
                )
                if port.rdma:
                    self._rdma(pf)
                self.functions.append(pf)
                for v, vf in enumerate(port.vfs):
                    fn = slot
                    slot += 1
                    vf_bdf = self._bdf(bus, fn // 8, fn % 8)
                    driver = vf.driver or child.vf_driver
                    f = Function(
                        vf_bdf, path + (vf_bdf,), "vf", numa, child.vendor, child.vf_device, cls, driver,
                        socket=si, host_bridge=root, root_port=rp, parent=parent, card=card,
                        netdev=None if driver == "vfio-pci" else f"{port.netdev}v{v}",
                        operstate=port.operstate, link_type=port.link_type, pf=pf_bdf, vf_index=v, nic=child,
                    )
                    if vf.rdma and driver != "vfio-pci":
                        self._rdma(f)
                    pf.vfs.append(vf_bdf)
                    self.functions.append(f)
        else:  # pragma: no cover - typing guard
            raise TypeError(f"unknown node part {child!r}")

    def _rdma(self, f: Function) -> None:
        f.rdma_dev = f"mlx5_{self.rdma}"
        self.rdma += 1
        # rdmamap order: ucm, issm, umad, uverbs.
        f.char_devs = (f"issm{self.umad}", f"umad{self.umad}", f"uverbs{self.uverbs}")
        self.umad += 1
        self.uverbs += 1


def link_level(a: Function, b: Function) -> LinkLevel:
    """The `nvidia-smi topo -m` level between two placed functions."""
    if a.socket != b.socket:
        return LinkLevel.SYS
    if a.host_bridge != b.host_bridge:
        return LinkLevel.NODE
    if a.root_port != b.root_port:
        return LinkLevel.PHB
    if a.card == b.card or a.parent == b.parent:
        return LinkLevel.PIX
    return LinkLevel.PXB


# -- writing -----------------------------------------------------------------
def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _symlink(target: str, link: str) -> None:
    """A relative symlink `link -> target`, as sysfs has them."""
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(os.path.relpath(target, os.path.dirname(link)), link)


@dataclass(frozen=True)
class GeneratedNode:
    spec: NodeSpec
    root: str
    sysfs_root: str
    dev_root: str
    proc_root: str
    functions: tuple[Function, ...]
    #: What discovery must find on this node (GPUs as NVML reports them, offered NICs, every link).
    topology: NodeTopology

    def function(self, key: str) -> Function:
        """A function by BDF, netdev name or GPU name (`GPU3`)."""
        for f in self.functions:
            if key in (f.bdf, f.netdev) or (f.gpu_index is not None and key == f"GPU{f.gpu_index}"):
                return f
        raise KeyError(key)

    @property
    def gpu_topology(self) -> NodeTopology:
        """Only the GPUs and their links: what a fake NVML for this node is built from."""
        return self.topology.without(d.name for d in self.topology.nics)

    def set_operstate(self, netdev: str, state: str) -> None:
        _write(os.path.join(self.sysfs_root, "class", "net", netdev, "operstate"), state + "\n")


def fake_nvml(node: GeneratedNode | str, **kw):
    """A `FakeNvml` for the GPUs of a generated node (or of a written `node.yaml`).

    The generated sysfs tree already holds the GPUs' PCI functions and NUMA
    nodes, so the fake's own `write_sysfs` is not needed.
    """
    from plugin.sources.simulated import load_simulated

    from .fake_nvml import FakeNvml

    topo = node.topology if isinstance(node, GeneratedNode) else load_simulated(node)
    return FakeNvml(topo.without(d.name for d in topo.nics), **kw)


def gpu_uuid(spec: NodeSpec, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(_UUID_NS, f"{spec.name}/GPU{index}"))


def write_node(spec: NodeSpec, root: str, clean: bool = True) -> GeneratedNode:
    """Write `root/sys`, `root/dev` and `root/proc` for `spec`; return where and what is expected.

    With `clean`, earlier trees there are removed first (re-writing a changed spec into the
    same directory is how tests simulate hot-plug).
    """
    functions = _Placer(spec).place()
    sysfs, dev, proc = (os.path.join(root, d) for d in ("sys", "dev", "proc"))
    if clean:
        for d in (sysfs, dev, proc):
            shutil.rmtree(d, ignore_errors=True)
    devices_dir = os.path.join(sysfs, "devices")
    by_bdf = {f.bdf: f for f in functions}

    group = 0
    for f in functions:
        real = os.path.join(devices_dir, *f.path)
        os.makedirs(real, exist_ok=True)
        _write(os.path.join(real, "vendor"), f"0x{f.vendor}\n")
        _write(os.path.join(real, "device"), f"0x{f.device}\n")
        _write(os.path.join(real, "class"), f"0x{f.cls:06x}\n")
        sysfs_numa = f.gpu.sysfs_numa if f.gpu is not None and f.gpu.sysfs_numa is not None else f.numa
        _write(os.path.join(real, "numa_node"), f"{-1 if sysfs_numa is None else sysfs_numa}\n")
        if f.vpd:
            with open(os.path.join(real, "vpd"), "wb") as vpd_file:
                vpd_file.write(f.vpd)
        _symlink(real, os.path.join(sysfs, "bus", "pci", "devices", f.bdf))
        if f.driver:
            drv = os.path.join(sysfs, "bus", "pci", "drivers", f.driver)
            os.makedirs(drv, exist_ok=True)
            _symlink(drv, os.path.join(real, "driver"))
            _symlink(real, os.path.join(drv, f.bdf))
        # Every function gets its own IOMMU group (ACS everywhere).
        f.iommu_group = group
        gdir = os.path.join(sysfs, "kernel", "iommu_groups", str(group))
        os.makedirs(os.path.join(gdir, "devices"), exist_ok=True)
        _symlink(gdir, os.path.join(real, "iommu_group"))
        _symlink(real, os.path.join(gdir, "devices", f.bdf))
        group += 1
        if f.role == "pf" and f.total_vfs:
            _write(os.path.join(real, "sriov_totalvfs"), f"{f.total_vfs}\n")
            _write(os.path.join(real, "sriov_numvfs"), f"{len(f.vfs)}\n")
            for i, vf in enumerate(f.vfs):
                _symlink(os.path.join(devices_dir, *by_bdf[vf].path), os.path.join(real, f"virtfn{i}"))
        if f.role == "vf" and f.pf:
            _symlink(os.path.join(devices_dir, *by_bdf[f.pf].path), os.path.join(real, "physfn"))
        if f.netdev:
            nd = os.path.join(real, *((f.netdev_parent,) if f.netdev_parent else ()), "net", f.netdev)
            _write(os.path.join(nd, "operstate"), f.operstate + "\n")
            _write(os.path.join(nd, "type"), ("32" if f.link_type == "infiniband" else "1") + "\n")
            _symlink(nd, os.path.join(sysfs, "class", "net", f.netdev))
        if f.rdma_dev:
            ib = os.path.join(real, "infiniband", f.rdma_dev)
            _write(os.path.join(ib, "ports", "1", "link_layer"),
                   ("InfiniBand" if f.link_type == "infiniband" else "Ethernet") + "\n")
            _symlink(ib, os.path.join(sysfs, "class", "infiniband", f.rdma_dev))
            for c in f.char_devs:
                cls = "infiniband_verbs" if c.startswith("uverbs") else "infiniband_mad"
                cdir = os.path.join(real, cls, c)
                _write(os.path.join(cdir, "ibdev"), f.rdma_dev + "\n")
                if c.startswith(("umad", "issm")):
                    _write(os.path.join(cdir, "port"), "1\n")
                _symlink(cdir, os.path.join(sysfs, "class", cls, c))
                _write(os.path.join(dev, "infiniband", c), "")
        if f.role == "vf" and f.driver == "vfio-pci":
            _write(os.path.join(dev, "vfio", str(f.iommu_group)), "")
        if f.role == "gpu":
            _write(os.path.join(dev, f"nvidia{f.gpu_index}"), "")

    # Bonds (virtual netdevs) and the routing table.
    for bond in spec.bonds:
        bdir = os.path.join(devices_dir, "virtual", "net", bond.name)
        _write(os.path.join(bdir, "operstate"), "up\n")
        _write(os.path.join(bdir, "type"), "1\n")
        _symlink(bdir, os.path.join(sysfs, "class", "net", bond.name))
        for s in bond.slaves:
            slave = os.path.join(sysfs, "class", "net", s)
            _symlink(os.path.realpath(slave), os.path.join(bdir, f"lower_{s}"))
    routes = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"]
    uplinks = [f.netdev for f in functions if f.default_route and f.netdev]
    uplinks += [b.name for b in spec.bonds if b.default_route]
    for i, name in enumerate(uplinks):
        routes.append(f"{name}\t00000000\t0101A8C0\t0003\t0\t0\t{100 + i}\t00000000\t0\t0\t0")
        routes.append(f"{name}\t0001A8C0\t00000000\t0001\t0\t0\t{100 + i}\t00FFFFFF\t0\t0\t0")
    # A link-local subnet on another port, so only a default route excludes a NIC.
    others = [f.netdev for f in functions if f.role == "pf" and f.netdev and f.netdev not in uplinks]
    if others:
        routes.append(f"{others[0]}\t0000A8C0\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0")
    _write(os.path.join(proc, "net", "route"), "\n".join(routes) + "\n")

    # NUMA nodes (CPU sockets, then Grace's GPU-memory nodes with no CPUs) and their distances.
    numas, dist = numa_layout(spec)
    cpu_nodes = sorted({s.numa for s in spec.sockets if s.numa is not None})
    for n in numas:
        row = " ".join(str(dist[(n, m)]) for m in numas)
        node_dir = os.path.join(sysfs, "devices", "system", "node", f"node{n}")
        _write(os.path.join(node_dir, "distance"), row + "\n")
        if n in cpu_nodes:
            first = cpu_nodes.index(n) * spec.cpus_per_socket
            _write(os.path.join(node_dir, "cpulist"), f"{first}-{first + spec.cpus_per_socket - 1}\n")
        else:
            _write(os.path.join(node_dir, "cpulist"), "\n")
    _write(os.path.join(sysfs, "devices", "system", "node", "online"), ",".join(map(str, numas)) + "\n")

    # Device nodes every GPU/RDMA/vfio user needs.
    if any(f.role == "gpu" for f in functions):
        for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
            _write(os.path.join(dev, name), "")
    if any(f.rdma_dev for f in functions):
        _write(os.path.join(dev, "infiniband", "rdma_cm"), "")
    if any(f.driver == "vfio-pci" for f in functions):
        _write(os.path.join(dev, "vfio", "vfio"), "")
    os.makedirs(dev, exist_ok=True)

    return GeneratedNode(spec, root, sysfs, dev, proc, tuple(functions), expected_topology(spec, functions))


# -- VPD and NUMA layout ------------------------------------------------------
def make_vpd(serial: str | None, name: str = "NVIDIA ConnectX-8 SuperNIC", part: str = "900-9X81Q-00CN-ST0",
             checksum_ok: bool = True) -> bytes:
    """A `vpd` file as a ConnectX card has it: identifier string, read-only keywords (PN, SN when
    given, RV checksum), end tag. `checksum_ok=False` writes a wrong RV byte."""
    def kw(key: str, value: bytes) -> bytes:
        return key.encode("ascii") + bytes([len(value)]) + value

    ident = name.encode("ascii")
    out = bytes([0x82]) + len(ident).to_bytes(2, "little") + ident
    body = kw("PN", part.encode("ascii")) + (kw("SN", serial.encode("ascii")) if serial else b"")
    body += b"RV" + bytes([1])  # the checksum byte follows
    ro_len = len(body) + 1
    head = out + bytes([0x90]) + ro_len.to_bytes(2, "little") + body
    check = (-sum(head)) % 256
    if not checksum_ok:
        check = (check + 1) % 256
    return head + bytes([check]) + bytes([0x78])


def numa_layout(spec: NodeSpec) -> tuple[list[int], dict[tuple[int, int], int]]:
    """NUMA nodes (sockets and GPU-memory nodes) and distances: a memory node is 80 from its socket."""
    cpu = sorted({s.numa for s in spec.sockets if s.numa is not None})
    owner = dict(spec.gpu_memory_nodes)
    numas = sorted(set(cpu) | set(owner))
    dist: dict[tuple[int, int], int] = {}
    for a in numas:
        for b in numas:
            if a == b:
                dist[(a, b)] = 10
            elif a in owner or b in owner:
                mem, other = (a, b) if a in owner else (b, a)
                dist[(a, b)] = 80 if owner[mem] == other else 120
            else:
                dist[(a, b)] = spec.numa_distance
    return numas, dist


# -- the expected answer -------------------------------------------------------
def _offered(spec: NodeSpec, functions: list[Function]) -> Iterator[Function]:
    uplinks = {f.netdev for f in functions if f.default_route}
    for b in spec.bonds:
        if b.default_route:
            uplinks.update(b.slaves)
    for f in functions:
        if f.role == "pf" and (f.vfs or f.netdev in uplinks):
            continue
        if f.role in ("pf", "vf") and f.driver:
            yield f


def _nic_attributes(f: Function, by_bdf: dict[str, Function]) -> dict[str, str]:
    a = {"vendor": f.vendor, "device": f.device, "class": f"0x{f.cls:06x}", "driver": f.driver or "",
         "netdev": f.netdev or ""}
    if f.netdev:
        a["netdevs"] = f.netdev
        a["operstate"] = f.operstate
    if f.pf:
        pf = by_bdf[f.pf]
        a["pf"] = f.pf
        a["vf_index"] = str(f.vf_index)
        if pf.netdev:
            a["pf_netdev"] = pf.netdev
            a["pf_operstate"] = pf.operstate
    if f.role == "pf" and f.total_vfs:
        a["sriov_totalvfs"] = str(f.total_vfs)
        a["sriov_numvfs"] = str(len(f.vfs))
    a["iommu_group"] = str(f.iommu_group)
    if f.driver == "vfio-pci":
        a["vfio_device"] = a["vfio_host_device"] = f"/dev/vfio/{f.iommu_group}"
    a["rdma"] = "true" if f.rdma_dev else "false"
    if f.rdma_dev:
        a["rdma_devices"] = f.rdma_dev
        a["rdma_char_devices"] = ",".join(f"/dev/infiniband/{c}" for c in f.char_devs)
    a["link_type"] = f.link_type
    a["pcie_root"] = f.host_bridge
    return a


def expected_topology(spec: NodeSpec, functions: list[Function]) -> NodeTopology:
    from plugin.sources.sysfs_nics import KNOWN_MODELS

    by_bdf = {f.bdf: f for f in functions}
    gpus = [f for f in functions if f.role == "gpu"]
    nics = sorted(_offered(spec, functions), key=lambda f: f.bdf)
    devices: list[Device] = []
    placed: dict[str, Function] = {}
    for f in gpus:
        name = f"GPU{f.gpu_index}"
        assert f.gpu is not None
        devices.append(Device(
            name=name, kind=DeviceKind.GPU, index=f.gpu_index or 0, numa=f.numa, health=HEALTHY,
            uuid=gpu_uuid(spec, f.gpu_index or 0), pci_bus_id=f.bdf, model=f.gpu.model,
            minor=f.gpu_index, memory_mib=f.gpu.memory_mib,
            complex=f.gpu.complex, complex_kind=f.gpu.complex_kind, fabric=f.gpu.fabric,
        ))
        placed[name] = f
    for i, f in enumerate(nics):
        devices.append(Device(
            name=f.bdf, kind=DeviceKind.NIC, index=i, numa=f.numa, health=HEALTHY, pci_bus_id=f.bdf,
            model=KNOWN_MODELS.get((f.vendor, f.device), f"{f.vendor}:{f.device}"),
            port=f.pf or f.bdf, attributes=_nic_attributes(f, by_bdf),
            complex=f.nic.complex if f.nic else None, complex_kind=f.nic.complex_kind if f.nic else None,
        ))
        placed[f.bdf] = f
    nv: dict[tuple[int, int], int] = {}
    if spec.nvswitch_links:
        for ga in range(len(gpus)):
            for gb in range(ga + 1, len(gpus)):
                nv[(ga, gb)] = spec.nvswitch_links
    for ga, gb, count in spec.nvlinks:
        nv[(min(ga, gb), max(ga, gb))] = count
    links: dict[tuple[str, str], Link] = {}
    names = [d.name for d in devices]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            level = link_level(placed[a], placed[b])
            fa, fb = placed[a], placed[b]
            n = 0
            if fa.role == "gpu" and fb.role == "gpu":
                ia, ib = sorted((fa.gpu_index or 0, fb.gpu_index or 0))
                n = nv.get((ia, ib), 0)
            links[(a, b)] = Link(nvlinks=n, level=level)
    numas, dist = numa_layout(spec)
    return NodeTopology.build(devices, links, source=spec.name, numa_nodes=numas, numa_distances=dist)


# -- companions: the simulated node and an example config -----------------------
def simulated_node_yaml(node: GeneratedNode) -> str:
    """The expected topology in the SimulatedNode format (GPUs with UUID, PCI bus ID, minor)."""
    t = node.topology
    gpus = [{"name": d.name, "numa": d.numa, "model": d.model, "memoryMiB": d.memory_mib, "uuid": d.uuid,
             "pciBusId": d.pci_bus_id, "minor": d.minor} for d in t.gpus]
    nics = [{"name": d.name, "numa": d.numa, "port": d.port, "pciBusId": d.pci_bus_id, "model": d.model}
            for d in t.nics]
    links = [{"devices": [a, b], "link": link.label} for (a, b), link in sorted(t.links.items())]
    numas = list(t.numa_nodes)
    doc = {
        "apiVersion": "topo-device-plugin/v1",
        "kind": "SimulatedNode",
        "metadata": {"name": t.source, "description": "generated by topo_testkit.sysfs_fixture"},
        "numa": {"nodes": numas, "distances": [[t.numa_distance(a, b) for b in numas] for a in numas]},
        "gpus": gpus,
        "nics": nics,
        "links": links,
    }
    return yaml.safe_dump(doc, sort_keys=False)


def example_pools(node: GeneratedNode) -> list[dict]:
    """NIC pools (SR-IOV-network-device-plugin style) that use every selector kind on `node`."""
    pools: list[dict] = []
    vfio = [f for f in node.functions if f.driver == "vfio-pci"]
    if vfio:
        pools.append({"resourceName": "sriov_vfio", "selectors": {"drivers": ["vfio-pci"]},
                      "allocationPolicy": "packed"})
    rdma = [f for f in node.functions if f.rdma_dev]
    if rdma:
        pools.append({"resourceName": "rdma_ib", "selectors": [{"isRdma": True, "linkTypes": ["infiniband"]}]})
    pfs_with_vfs = [f for f in node.functions if f.role == "pf" and f.vfs]
    if pfs_with_vfs:
        first = pfs_with_vfs[0]
        pools.append({"resourceName": "sriov_a", "selectors": [{"pfNames": [f"{first.netdev}#0-{len(first.vfs) - 1}"]}]})
    if len(pfs_with_vfs) > 1:
        pools.append({"resourceName": "sriov_b", "selectors": [{"rootDevices": [f.bdf for f in pfs_with_vfs[1:]]}],
                      "allocationPolicy": "spread"})
    pools.append({"resourceName": "pf_mlx", "selectors": {"vendors": ["15b3"], "drivers": ["mlx5_core"]},
                  "excludeTopology": False})
    pools.append({"resourceName": "pf_other", "resourcePrefix": "example.com", "selectors": [{"linkTypes": ["ether"]}]})
    return pools


def example_config(node: GeneratedNode) -> str:
    doc = {
        "version": "v1",
        # The generated node has no GPU driver: run the daemon through `topo_testkit.with_fake_nvml`
        # with `node.yaml`, so NVML answers come from the same node description.
        "flags": {"sysfsRoot": node.sysfs_root, "devRoot": node.dev_root, "procRoot": node.proc_root},
        "nics": {"resourceList": example_pools(node)},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def write_demo(outdir: str, spec: NodeSpec | None = None) -> GeneratedNode:
    """Write a whole demo node: trees, `config.yaml` and `node.yaml`."""
    os.makedirs(outdir, exist_ok=True)
    node = write_node(spec or default_node(), os.path.abspath(outdir))
    _write(os.path.join(outdir, "config.yaml"), example_config(node))
    _write(os.path.join(outdir, "node.yaml"), simulated_node_yaml(node))
    return node


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m topo_testkit.sysfs_fixture",
                                 description="Write a generated GPU+NIC node (sysfs, dev, proc, config) to OUTDIR.")
    ap.add_argument("outdir")
    args = ap.parse_args(argv)
    node = write_demo(args.outdir)
    t = node.topology
    print(f"node {t.source}: {len(t.gpus)} GPUs, {len(t.nics)} offered NICs")
    for key, path in (("sysfs root", node.sysfs_root), ("dev root", node.dev_root), ("proc root", node.proc_root),
                      ("config", os.path.join(node.root, "config.yaml")),
                      ("expected topology", os.path.join(node.root, "node.yaml"))):
        print(f"  {key:18} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
