"""GPU–NIC complexes, classified from the sysfs PCIe tree (docs/platforms.md).

Why: on the platforms people buy now the PCIe path no longer names a GPU's
NIC. On Grace systems every GPU and every NIC sits on a CPU root port of its
own (so PCIe says NODE for every pair of a socket), and with ConnectX-8 Data
Direct the NIC reaches its GPU through a DMA function that lives in another
part of the tree than the NIC's PF. A complex is the platform's own answer
to "which NIC is this GPU's", and `Device.complex` carries it to the
allocator (a GPU and a NIC of one complex pair as `PIX`).

What we recognise, by PCI vendor:device IDs read from sysfs (the IDs rdma-core's
`rdma_topo` uses for the same job):

- ConnectX switch port `15b3:197c` (up- and downstream ports of the PCIe
  switch inside a ConnectX-8); the outermost such port above a function
  names "its ConnectX switch".
- ConnectX-7/-8 physical functions `15b3:1021` / `15b3:1023`.
- ConnectX-8 Data Direct DMA function `15b3:2100`.
- Grace CPU root ports `10de:22b1`, `10de:22b2`, `10de:22b8`.

The classes, tried in this order for each GPU:

- INLINE: a ConnectX PF below the GPU's ConnectX switch. The complex is
  that switch's GPU and every PF below it (with their VFs).
- DATA_DIRECT: a DMA function below the GPU's ConnectX switch. The DMA
  function and its PF share a board; the board serial (VPD keyword `SN`,
  `pci_vpd.board_serial`) read from both names the PF. ID: the serial.
- CPU_ROOT: the GPU directly on a Grace root port, and ConnectX PFs directly
  on Grace root ports of the same NUMA node: the i-th GPU and the i-th NIC
  in PCI address order (the tray's physical order) form complex
  `numa<N>-<i>`.

A GPU below a ConnectX switch that none of these explains (a DMA function
missing, a VPD that cannot be read, no PF with that serial) gets no complex:
it pairs by PCIe path as before, and one warning names the device and what
was missing. Nothing here raises for bad hardware data.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from allocator.topology import ComplexKind, Device

from .pci_vpd import VpdError, board_serial
from .pcie import pci_path

__all__ = ["CX_DMA", "CX_PFS", "CX_SWITCH", "GRACE_ROOT_PORTS", "ComplexReport", "classify_complexes"]

MELLANOX, NVIDIA = "15b3", "10de"
CX_SWITCH = frozenset({(MELLANOX, "197c")})
CX_PFS = frozenset({(MELLANOX, "1021"), (MELLANOX, "1023")})
CX_DMA = frozenset({(MELLANOX, "2100")})
GRACE_ROOT_PORTS = frozenset({(NVIDIA, "22b1"), (NVIDIA, "22b2"), (NVIDIA, "22b8")})


@dataclass(frozen=True)
class ComplexReport:
    """Which device is in which complex, and what could not be classified (one line per device)."""

    #: Device name -> (complex ID, kind); only complexes with at least one GPU and one offered NIC.
    members: dict[str, tuple[str, ComplexKind]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


@dataclass
class _Fn:
    bdf: str
    path: str
    vendor: str
    device: str
    chain: tuple[str, ...]

    @property
    def ids(self) -> tuple[str, str]:
        return (self.vendor, self.device)

    @property
    def parent(self) -> str | None:
        return self.chain[-2] if len(self.chain) >= 3 else None


def _read_id(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f"{int(f.read().strip(), 16):04x}"
    except (OSError, ValueError, UnicodeDecodeError):
        return ""


def _numa(path: str) -> int | None:
    try:
        with open(os.path.join(path, "numa_node"), encoding="ascii") as f:
            n = int(f.read().strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return n if n >= 0 else None


def _scan(sysfs_root: str) -> dict[str, _Fn]:
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return {}
    out: dict[str, _Fn] = {}
    for bdf in names:
        path = os.path.join(base, bdf)
        if os.path.islink(os.path.join(path, "physfn")):
            continue  # a VF: it follows its PF (`Device.attributes["pf"]`), no need to place it
        chain = pci_path(sysfs_root, bdf)
        if chain is None:
            continue
        out[bdf] = _Fn(bdf, path, _read_id(os.path.join(path, "vendor")), _read_id(os.path.join(path, "device")),
                       chain)
    return out


class _Classifier:
    def __init__(self, sysfs_root: str, gpus: Sequence[Device], nics: Sequence[Device]):
        self.fns = _scan(sysfs_root)
        self.gpus = [g for g in gpus if g.pci_bus_id and g.pci_bus_id in self.fns]
        self.nics = nics
        self.warnings: list[str] = []
        self.serials: dict[str, str | None] = {}
        self.vpd_errors: dict[str, str] = {}
        #: (complex ID, kind, GPU names, PF addresses)
        self.complexes: list[tuple[str, ComplexKind, list[str], list[str]]] = []

    def switch_of(self, fn: _Fn) -> str | None:
        """The outermost ConnectX switch port above `fn` (its ConnectX switch), if any."""
        for bdf in fn.chain[1:-1]:
            up = self.fns.get(bdf)
            if up is not None and up.ids in CX_SWITCH:
                return bdf
        return None

    def serial(self, fn: _Fn) -> str | None:
        """Board serial of a function, None when its VPD cannot say (why: `self.vpd_errors`)."""
        if fn.bdf not in self.serials:
            try:
                self.serials[fn.bdf] = board_serial(fn.path)
            except VpdError as e:
                self.serials[fn.bdf] = None
                self.vpd_errors[fn.bdf] = str(e)
        return self.serials[fn.bdf]

    def run(self) -> None:
        below: dict[str, list[_Fn]] = {}
        for fn in self.fns.values():
            sw = self.switch_of(fn)
            if sw is not None:
                below.setdefault(sw, []).append(fn)
        pfs = [f for f in self.fns.values() if f.ids in CX_PFS]
        placed: set[str] = set()
        for g in self.gpus:
            assert g.pci_bus_id is not None
            sw = self.switch_of(self.fns[g.pci_bus_id])
            if sw is None:
                continue
            placed.add(g.name)
            members = below.get(sw, [])
            inline = [f.bdf for f in members if f.ids in CX_PFS]
            if inline:
                pf_fn = self.fns[inline[0]]
                cid = self.serial(pf_fn) or f"cx-switch-{sw}"
                self.complexes.append((cid, ComplexKind.INLINE, [g.name], inline))
                continue
            dmas = [f for f in members if f.ids in CX_DMA]
            if not dmas:
                self.warnings.append(f"{g.name} ({g.pci_bus_id}) is below ConnectX switch {sw} but no NIC or "
                                     "Data Direct DMA function (15b3:2100) is: paired by PCIe path")
                continue
            self.data_direct(g, dmas[0], pfs)
        self.cpu_root([g for g in self.gpus if g.name not in placed], pfs)

    def data_direct(self, g: Device, dma: _Fn, pfs: list[_Fn]) -> None:
        """One warning per GPU that stays without its complex, naming the device at fault."""
        head = f"{g.name} ({g.pci_bus_id}): Data Direct DMA function {dma.bdf}"
        serial = self.serial(dma)
        if serial is None:
            self.warnings.append(f"{head} has unusable VPD ({self.vpd_errors[dma.bdf]}): paired by PCIe path")
            return
        owners = [pf.bdf for pf in pfs if self.serial(pf) == serial]
        if not owners:
            bad = "; ".join(f"PF {pf.bdf} has unusable VPD ({self.vpd_errors[pf.bdf]})"
                            for pf in pfs if pf.bdf in self.vpd_errors)
            self.warnings.append(f"{head}: no ConnectX PF carries its board serial {serial}"
                                 + (f" ({bad})" if bad else "") + ": paired by PCIe path")
            return
        self.complexes.append((serial, ComplexKind.DATA_DIRECT, [g.name], owners))

    def cpu_root(self, gpus: Iterable[Device], pfs: list[_Fn]) -> None:
        def on_grace_root(fn: _Fn) -> bool:
            parent = self.fns.get(fn.parent) if fn.parent else None
            return parent is not None and parent.ids in GRACE_ROOT_PORTS

        taken = {pf for _, _, _, owned in self.complexes for pf in owned}
        by_numa_gpu: dict[int, list[Device]] = {}
        for g in gpus:
            assert g.pci_bus_id is not None
            if g.numa is not None and on_grace_root(self.fns[g.pci_bus_id]):
                by_numa_gpu.setdefault(g.numa, []).append(g)
        by_numa_nic: dict[int, list[str]] = {}
        for pf in pfs:
            numa = _numa(pf.path)
            if pf.bdf not in taken and numa is not None and on_grace_root(pf):
                by_numa_nic.setdefault(numa, []).append(pf.bdf)
        for numa, gs in sorted(by_numa_gpu.items()):
            ns = sorted(by_numa_nic.get(numa, []))
            for i, (g, nic) in enumerate(zip(sorted(gs, key=lambda d: d.pci_bus_id or ""), ns)):
                self.complexes.append((f"numa{numa}-{i}", ComplexKind.CPU_ROOT, [g.name], [nic]))

    def report(self) -> ComplexReport:
        members: dict[str, tuple[str, ComplexKind]] = {}
        for cid, kind, gpu_names, pf_bdfs in self.complexes:
            owned = set(pf_bdfs)
            nic_names = [n.name for n in self.nics if n.name in owned or n.attributes.get("pf") in owned]
            if not nic_names:
                continue  # its NIC is not offered (the uplink, no driver): nothing to pair with
            for name in (*gpu_names, *nic_names):
                members[name] = (cid, kind)
        return ComplexReport(members=members, warnings=tuple(self.warnings))


def classify_complexes(sysfs_root: str, gpus: Sequence[Device], nics: Sequence[Device]) -> ComplexReport:
    """The complexes of this node's GPUs (NVML, kernel-form PCI addresses) and offered NICs."""
    if not gpus:
        return ComplexReport()
    c = _Classifier(sysfs_root, gpus, nics)
    c.run()
    return c.report()
