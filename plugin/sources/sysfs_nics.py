"""NIC discovery from sysfs: PCI network and InfiniBand functions, SR-IOV, RDMA, vfio.

Why sysfs directly (no netlink, no ghw): everything the pools and Allocate
need is a file or a symlink under `/sys/bus/pci/devices/<bdf>`, so one root
prefix (`--sysfs-root`, default `/sys`) redirects the whole scan to a
generated tree in tests. The rules follow the SR-IOV network device plugin
(`../shared/research/nic-and-other-plugins.md` §2), whose selectors and
Allocate format users already rely on:

- PCI class 0x02 (network; 0x0207 is InfiniBand) is a NIC.
- A function without a bound driver is skipped (it cannot be used yet).
- A ConnectX-8 Data Direct DMA function (15b3:2100) is never offered: it is
  no network port, only the path its PF's traffic takes to a GPU
  (`complexes` ties it to that PF).
- An SR-IOV PF with VFs (`sriov_numvfs > 0`) is not offered; its VFs are.
- A NIC whose netdev carries the host's default route (IPv4, and IPv6 too,
  read from `<proc-root>/net/route` and `ipv6_route`; through bonds, VLANs
  and bridges via `lower_*` links) is never offered: it is the uplink.
- `numa_node` -1 (or unreadable) means no NUMA information (`numa=None`).

A device is named by its PCI address (the plugin ID the SR-IOV plugin uses
too, stable across rescans); `port` is its PF's address (a PF's is its own),
which the NIC policies spread over or pack into. Everything else a selector or
Allocate needs lands in `Device.attributes` (strings only), see `ATTRIBUTES`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from allocator.topology import HEALTHY, UNHEALTHY, Device, DeviceKind

log = logging.getLogger(__name__)

#: What `Device.attributes` may hold for a NIC (all values are strings; lists are comma-separated).
ATTRIBUTES = {
    "vendor": "PCI vendor ID, 4 lower-case hex digits without 0x (15b3)",
    "device": "PCI device ID, same form (101c)",
    "class": "PCI class code as sysfs prints it (0x020000)",
    "driver": "bound kernel driver (mlx5_core, vfio-pci, i40e...)",
    "netdev": "first netdev name of the function (empty when none, e.g. vfio-pci)",
    "netdevs": "all netdev names",
    "operstate": "operstate of `netdev` (up, down, unknown...)",
    "link_type": "ether or infiniband (from the netdev type, else the PF's, else the RDMA port)",
    "pf": "PCI address of the PF (VFs only)",
    "pf_netdev": "netdev of the PF (VFs only)",
    "pf_operstate": "operstate of the PF netdev (VFs only)",
    "vf_index": "index of the VF within its PF (`virtfn<N>`), VFs only",
    "sriov_totalvfs": "PFs that can do SR-IOV",
    "sriov_numvfs": "PFs that can do SR-IOV",
    "iommu_group": "IOMMU group number (when the function has one)",
    "vfio_device": "container path of the vfio group device (vfio-pci only): /dev/vfio/<group>",
    "vfio_host_device": "host path of it (/dev/vfio/noiommu-<group> without an IOMMU)",
    "uio_device": "/dev/uioN (uio / igb_uio only)",
    "rdma": "true when the function has RDMA devices",
    "rdma_devices": "RDMA device names (mlx5_3)",
    "rdma_char_devices": "its /dev/infiniband char devices, rdmamap order (ucm, issm, umad, uverbs)",
    "acpi_index": "ACPI index when firmware gives one",
    "pcie_root": "the PCI root complex it hangs off (pci0000:3a), as DRA pciRoot",
}

NETWORK_CLASS = 0x02
INFINIBAND_SUBCLASS = 0x07
_DOWN_STATES = frozenset({"down", "lowerlayerdown", "notpresent"})
# ARPHRD_* values of /sys/class/net/<if>/type, named as netlink's EncapType (what linkTypes matches).
_ARPHRD = {"1": "ether", "32": "infiniband", "772": "loopback", "65534": "none"}

#: A few common models, for display only (selectors use vendor/device IDs).
KNOWN_MODELS: Mapping[tuple[str, str], str] = {
    ("15b3", "1017"): "ConnectX-5", ("15b3", "1018"): "ConnectX-5 VF",
    ("15b3", "1019"): "ConnectX-5 Ex", ("15b3", "101a"): "ConnectX-5 Ex VF",
    ("15b3", "101b"): "ConnectX-6", ("15b3", "101c"): "ConnectX-6 VF",
    ("15b3", "101d"): "ConnectX-6 Dx", ("15b3", "101e"): "ConnectX-6 Dx/Lx VF",
    ("15b3", "101f"): "ConnectX-6 Lx", ("15b3", "1021"): "ConnectX-7",
    ("15b3", "1023"): "ConnectX-8", ("15b3", "a2d6"): "BlueField-2", ("15b3", "a2dc"): "BlueField-3",
    ("8086", "1572"): "X710", ("8086", "154c"): "X710/XL710 VF", ("8086", "1583"): "XL710",
    ("8086", "158b"): "XXV710", ("8086", "1592"): "E810-C", ("8086", "159b"): "E810-XXV",
    ("8086", "1889"): "E810 VF (iavf)", ("14e4", "16d7"): "BCM57414", ("14e4", "1750"): "BCM57508",
}


@dataclass(frozen=True)
class NicRoots:
    """Where the host's filesystems are (a DaemonSet mounts them under /host)."""

    sysfs_root: str = "/sys"
    dev_root: str = "/dev"
    proc_root: str = "/proc"

    def pci_devices(self) -> str:
        return os.path.join(self.sysfs_root, "bus", "pci", "devices")


@dataclass(frozen=True)
class NicInventory:
    """What one scan found: the offered NICs and why others were left out."""

    devices: tuple[Device, ...]
    #: PCI address -> reason, for every network function that is not offered.
    skipped: Mapping[str, str] = field(default_factory=dict)
    #: Netdevs that carry a default route (after following bonds/VLANs/bridges down).
    default_route_netdevs: tuple[str, ...] = ()


# -- small sysfs helpers ----------------------------------------------------
def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _link_base(path: str) -> str | None:
    try:
        return os.path.basename(os.readlink(path).rstrip("/"))
    except OSError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _hex_id(text: str | None) -> str | None:
    if not text:
        return None
    t = text.strip().lower()
    if t.startswith("0x"):
        t = t[2:]
    try:
        return f"{int(t, 16):04x}"
    except ValueError:
        return None


def _numa(text: str | None) -> int | None:
    try:
        n = int(text) if text is not None else -1
    except ValueError:
        return None
    return n if n >= 0 else None


def _vf_index_key(name: str) -> int:
    try:
        return int(name[len("virtfn"):])
    except ValueError:
        return 1 << 30


# -- default route ----------------------------------------------------------
def default_route_interfaces(proc_root: str = "/proc") -> set[str]:
    """Interfaces that carry an IPv4 or IPv6 default route, read from procfs.

    `/proc/net/route`: Destination and Mask `00000000`, flag RTF_UP.
    `/proc/net/ipv6_route`: destination ::/0, not a reject route (the kernel's
    `lo` unreachable default).
    """
    out: set[str] = set()
    text = _read(os.path.join(proc_root, "net", "route"))
    if text is None:
        log.warning("cannot read %s/net/route: the default-route NIC cannot be recognised", proc_root)
    else:
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) < 8:
                continue
            iface, dest, flags, mask = parts[0], parts[1], parts[3], parts[7]
            try:
                up = int(flags, 16) & 0x1
            except ValueError:
                continue
            if up and int(dest, 16) == 0 and int(mask, 16) == 0:
                out.add(iface)
    text6 = _read(os.path.join(proc_root, "net", "ipv6_route"))
    for line in (text6 or "").splitlines():
        parts = line.split()
        if len(parts) < 10:
            continue
        dest, plen, flags, iface = parts[0], parts[1], parts[8], parts[9]
        try:
            reject = int(flags, 16) & 0x0200
        except ValueError:
            continue
        if int(dest, 16) == 0 and int(plen, 16) == 0 and not reject and iface != "lo":
            out.add(iface)
    return out


def lower_interfaces(sysfs_root: str, names: Iterable[str]) -> set[str]:
    """`names` plus every netdev below them (bond slaves, VLAN parents, bridge ports)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        for entry in _listdir(os.path.join(sysfs_root, "class", "net", n)):
            if entry.startswith("lower_"):
                todo.append(entry[len("lower_"):])
    return seen


# -- netdevs ----------------------------------------------------------------
_BDF_RE = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def netdevs_by_function(sysfs_root: str) -> dict[str, list[str]]:
    """PCI function -> its netdevs, from `class/net/*` realpaths.

    Most drivers put the netdev right under the function (`<bdf>/net/eth0`),
    but some put it under a child device (virtio: `<bdf>/virtio0/net/eth0`),
    so `<bdf>/net` alone would miss it, and with it the default-route check.
    The owner is the nearest PCI function above the netdev.
    """
    out: dict[str, list[str]] = {}
    base = os.path.join(sysfs_root, "class", "net")
    for name in _listdir(base):
        real = os.path.realpath(os.path.join(base, name))
        if not os.path.isdir(real):
            continue
        parts = real.split(os.sep)
        owner = next((p for p in reversed(parts) if _BDF_RE.match(p)), None)
        if owner is not None:
            out.setdefault(owner, []).append(name)
    return out


def _netdev_attr(sysfs_root: str, function_path: str, netdev: str, attr: str) -> str | None:
    value = _read(os.path.join(sysfs_root, "class", "net", netdev, attr))
    return value if value is not None else _read(os.path.join(function_path, "net", netdev, attr))


# -- RDMA -----------------------------------------------------------------
def rdma_char_devices(sysfs_root: str, rdma_dev: str) -> list[str]:
    """The `/dev/infiniband/*` char devices of one RDMA device (container paths).

    As Mellanox rdmamap does: scan the `infiniband_cm/ucm*`, `infiniband_mad/
    issm*`, `infiniband_mad/umad*` and `infiniband_verbs/uverbs*` class
    entries for an `ibdev` naming the device; but compare exactly (rdmamap's
    substring test confuses mlx5_1 with mlx5_10) and keep every match (one
    umad/issm per port).
    """
    out: list[str] = []
    for cls, prefix in (("infiniband_cm", "ucm"), ("infiniband_mad", "issm"),
                        ("infiniband_mad", "umad"), ("infiniband_verbs", "uverbs")):
        base = os.path.join(sysfs_root, "class", cls)
        for entry in _listdir(base):
            if not entry.startswith(prefix):
                continue
            if _read(os.path.join(base, entry, "ibdev")) == rdma_dev:
                out.append(f"/dev/infiniband/{entry}")
    return out


# -- one function -----------------------------------------------------------
@dataclass
class _Raw:
    bdf: str
    path: str
    cls: int
    vendor: str
    device: str
    driver: str | None
    numa: int | None
    netdevs: list[str]
    physfn: str | None
    numvfs: int | None
    totalvfs: int | None


def _read_raw(roots: NicRoots, bdf: str, netdevs: list[str] | None = None) -> _Raw | None:
    path = os.path.join(roots.pci_devices(), bdf)
    cls_text = _read(os.path.join(path, "class"))
    try:
        cls = int(cls_text or "", 16)
    except ValueError:
        return None
    if (cls >> 16) != NETWORK_CLASS:
        return None

    def _int(name: str) -> int | None:
        t = _read(os.path.join(path, name))
        try:
            return int(t) if t is not None else None
        except ValueError:
            return None

    return _Raw(
        bdf=bdf,
        path=path,
        cls=cls,
        vendor=_hex_id(_read(os.path.join(path, "vendor"))) or "",
        device=_hex_id(_read(os.path.join(path, "device"))) or "",
        driver=_link_base(os.path.join(path, "driver")),
        numa=_numa(_read(os.path.join(path, "numa_node"))),
        netdevs=sorted(set(_listdir(os.path.join(path, "net"))) | set(netdevs or ())),
        physfn=_link_base(os.path.join(path, "physfn")),
        numvfs=_int("sriov_numvfs"),
        totalvfs=_int("sriov_totalvfs"),
    )


def _link_type(roots: NicRoots, raw: _Raw, rdma_devs: list[str], pf: _Raw | None) -> str:
    for r in ([raw] + ([pf] if pf else [])):
        for nd in r.netdevs:
            t = _ARPHRD.get(_netdev_attr(roots.sysfs_root, r.path, nd, "type") or "")
            if t:
                return t
    for dev in rdma_devs:
        ll = _read(os.path.join(raw.path, "infiniband", dev, "ports", "1", "link_layer"))
        if ll:
            return "infiniband" if ll.lower() == "infiniband" else "ether"
    return "infiniband" if ((raw.cls >> 8) & 0xFF) == INFINIBAND_SUBCLASS else "ether"


def _vf_indexes(pf_path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for entry in _listdir(pf_path):
        if entry.startswith("virtfn"):
            target = _link_base(os.path.join(pf_path, entry))
            if target:
                out[target] = _vf_index_key(entry)
    return out


def _pcie_root(path: str) -> str | None:
    try:
        real = os.path.realpath(path)
    except OSError:
        return None
    for part in real.split(os.sep):
        if part.startswith("pci") and ":" in part:
            return part
    return None


def _model(vendor: str, device: str) -> str:
    return KNOWN_MODELS.get((vendor, device), f"{vendor}:{device}")


def discover_nics(
    sysfs_root: str = "/sys",
    dev_root: str = "/dev",
    proc_root: str = "/proc",
    *,
    link_health: bool = False,
    previous: Iterable[Device] = (),
) -> NicInventory:
    """Scan the PCI bus under `sysfs_root` and return the NICs to offer.

    `link_health`: a NIC whose link is down (its own netdev for a PF, the PF's
    for a VF, since a VF is only as good as its uplink) is `Unhealthy`.
    `previous`: the NICs of the last scan. A VF handed to a pod in exclusive
    RDMA mode loses its host netdev and `infiniband/` entries; keeping its
    earlier RDMA facts stops it from silently leaving an `isRdma` pool (the
    SR-IOV plugin's issue #565). Never raises for a bad device: it is skipped
    with a reason in `NicInventory.skipped`.
    """
    roots = NicRoots(sysfs_root, dev_root, proc_root)
    if not os.path.isdir(roots.pci_devices()):
        log.warning("no PCI devices under %s: no NICs discovered", roots.pci_devices())
        return NicInventory(devices=(), skipped={})
    raws = _scan_functions(roots)
    route_ifaces = default_route_interfaces(proc_root)
    uplinks = lower_interfaces(sysfs_root, route_ifaces) if route_ifaces else set()
    prev = {d.name: d for d in previous}
    skipped: dict[str, str] = {}
    devices: list[Device] = []
    vf_indexes: dict[str, dict[str, int]] = {}
    for bdf, raw in sorted(raws.items()):
        why = _skip_reason(raw, uplinks)
        if why:
            skipped[bdf] = why
            continue
        attrs = _attributes(roots, raw, raws, vf_indexes, prev.get(bdf))
        devices.append(_device(raw, attrs, len(devices), link_health))
    for bdf, why in skipped.items():
        log.debug("NIC %s not offered: %s", bdf, why)
    return NicInventory(devices=tuple(devices), skipped=skipped, default_route_netdevs=tuple(sorted(uplinks)))


def _scan_functions(roots: NicRoots) -> dict[str, _Raw]:
    """Every network-class PCI function, with the netdevs each owns."""
    owned = netdevs_by_function(roots.sysfs_root)
    raws: dict[str, _Raw] = {}
    for bdf in _listdir(roots.pci_devices()):
        raw = _read_raw(roots, bdf, owned.get(bdf))
        if raw is not None:
            raws[bdf] = raw
    return raws


def _skip_reason(raw: _Raw, uplinks: set[str]) -> str | None:
    """Why a function is not offered (None: it is)."""
    if (raw.vendor, raw.device) == ("15b3", "2100"):
        return "ConnectX-8 Data Direct DMA function (not a port; it serves its PF's complex)"
    if raw.driver is None:
        return "no driver bound"
    if raw.totalvfs is not None and (raw.numvfs or 0) > 0:
        return f"SR-IOV PF with {raw.numvfs} VFs (its VFs are offered instead)"
    carrying = sorted(set(raw.netdevs) & uplinks)
    if carrying:
        return f"carries the host's default route ({', '.join(carrying)})"
    return None


def _attributes(roots: NicRoots, raw: _Raw, raws: Mapping[str, _Raw], vf_indexes: dict[str, dict[str, int]],
                old: Device | None) -> dict[str, str]:
    """Everything selectors and Allocate need about one offered function (see `ATTRIBUTES`)."""
    attrs: dict[str, str] = {
        "vendor": raw.vendor,
        "device": raw.device,
        "class": f"0x{raw.cls:06x}",
        "driver": raw.driver or "",
        "netdev": raw.netdevs[0] if raw.netdevs else "",
    }
    if raw.netdevs:
        attrs["netdevs"] = ",".join(raw.netdevs)
        attrs["operstate"] = _netdev_attr(roots.sysfs_root, raw.path, raw.netdevs[0], "operstate") or "unknown"
    pf = _pf_attributes(roots, raw, raws, vf_indexes, attrs)
    if raw.totalvfs is not None:
        attrs["sriov_totalvfs"] = str(raw.totalvfs)
        attrs["sriov_numvfs"] = str(raw.numvfs or 0)
    _user_space_attributes(roots, raw, attrs)
    _rdma_attributes(roots, raw, pf, old, attrs)
    acpi = _read(os.path.join(raw.path, "acpi_index"))
    if acpi:
        attrs["acpi_index"] = acpi
    root = _pcie_root(raw.path)
    if root:
        attrs["pcie_root"] = root
    return attrs


def _pf_attributes(roots: NicRoots, raw: _Raw, raws: Mapping[str, _Raw], vf_indexes: dict[str, dict[str, int]],
                   attrs: dict[str, str]) -> _Raw | None:
    """A VF's PF, VF index and PF netdev (with its link state); returns the PF when it was scanned."""
    if not raw.physfn:
        return None
    pf = raws.get(raw.physfn)
    pf_path = os.path.join(roots.pci_devices(), raw.physfn)
    attrs["pf"] = raw.physfn
    if raw.physfn not in vf_indexes:
        vf_indexes[raw.physfn] = _vf_indexes(pf_path)
    idx = vf_indexes[raw.physfn].get(raw.bdf)
    if idx is not None:
        attrs["vf_index"] = str(idx)
    pf_netdevs = pf.netdevs if pf else _listdir(os.path.join(pf_path, "net"))
    if pf_netdevs:
        attrs["pf_netdev"] = pf_netdevs[0]
        attrs["pf_operstate"] = _netdev_attr(roots.sysfs_root, pf_path, pf_netdevs[0], "operstate") or "unknown"
    return pf


def _user_space_attributes(roots: NicRoots, raw: _Raw, attrs: dict[str, str]) -> None:
    """IOMMU group, and the vfio / uio device node of a function bound to a user-space driver."""
    group = _link_base(os.path.join(raw.path, "iommu_group"))
    if group is not None:
        attrs["iommu_group"] = group
    if raw.driver == "vfio-pci" and group is not None:
        attrs["vfio_device"] = f"/dev/vfio/{group}"
        name = _read(os.path.join(roots.sysfs_root, "kernel", "iommu_groups", group, "name"))
        noiommu = name == "vfio-noiommu" or (
            not os.path.exists(os.path.join(roots.dev_root, "vfio", group))
            and os.path.exists(os.path.join(roots.dev_root, "vfio", f"noiommu-{group}"))
        )
        attrs["vfio_host_device"] = f"/dev/vfio/noiommu-{group}" if noiommu else f"/dev/vfio/{group}"
    if raw.driver in ("uio", "igb_uio", "uio_pci_generic"):
        uio = _listdir(os.path.join(raw.path, "uio"))
        if uio:
            attrs["uio_device"] = f"/dev/{uio[0]}"


def _rdma_attributes(roots: NicRoots, raw: _Raw, pf: _Raw | None, old: Device | None, attrs: dict[str, str]) -> None:
    """RDMA devices and their char devices, and the link type (a VF moved into a pod keeps what we knew)."""
    rdma_devs = _listdir(os.path.join(raw.path, "infiniband"))
    char_devs = [c for dev in rdma_devs for c in rdma_char_devices(roots.sysfs_root, dev)]
    if (not rdma_devs and not raw.netdevs and old is not None
            and old.attributes.get("rdma") == "true" and old.attributes.get("driver") == raw.driver):
        # Moved into a pod's network namespace: keep what we knew.
        rdma_devs = [d for d in old.attributes.get("rdma_devices", "").split(",") if d]
        char_devs = [d for d in old.attributes.get("rdma_char_devices", "").split(",") if d]
        attrs["link_type"] = old.attributes.get("link_type", "")
    attrs["rdma"] = "true" if rdma_devs else "false"
    if rdma_devs:
        attrs["rdma_devices"] = ",".join(rdma_devs)
        attrs["rdma_char_devices"] = ",".join(char_devs)
    if not attrs.get("link_type"):
        attrs["link_type"] = _link_type(roots, raw, rdma_devs, pf)


def _device(raw: _Raw, attrs: dict[str, str], index: int, link_health: bool) -> Device:
    health = HEALTHY
    if link_health:
        state = attrs.get("pf_operstate") if raw.physfn else attrs.get("operstate")
        if state in _DOWN_STATES:
            health = UNHEALTHY
    return Device(name=raw.bdf, kind=DeviceKind.NIC, index=index, numa=raw.numa, health=health,
                  pci_bus_id=raw.bdf, model=_model(raw.vendor, raw.device), port=raw.physfn or raw.bdf,
                  attributes=attrs)


def link_states(sysfs_root: str, devices: Iterable[Device]) -> dict[str, str]:
    """Current operstate of every netdev the devices name (theirs and their PFs'); cheap to poll."""
    base = os.path.join(sysfs_root, "class", "net")
    out: dict[str, str] = {}
    for d in devices:
        for key in ("netdev", "pf_netdev"):
            nd = d.attributes.get(key)
            if nd and nd not in out:
                out[nd] = _read(os.path.join(base, nd, "operstate")) or "absent"
    return out
