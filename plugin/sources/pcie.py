"""PCIe distance between two PCI functions, read from sysfs the way `nvidia-smi topo -m` reports it.

Why from sysfs: NVML only answers for GPU pairs, but the allocator also needs
GPU<->NIC and NIC<->NIC levels, and a GPU pair must still get a level where
NVML cannot say (`nvmlDeviceGetTopologyCommonAncestor` unsupported, e.g. in
some VMs). The kernel names every function's place in the hierarchy in its
realpath: `/sys/bus/pci/devices/<bdf>` links to
`/sys/devices/pci<domain>:<bus>/<root port>/<switch up>/<switch down>/<bdf>`,
so the common ancestor of two functions is the common prefix of their paths.

Levels, as `nvidia-smi topo -m` defines them:

- PIX: at most one PCIe switch between them (both under one switch's downstream
  ports, both behind the same bridge, or functions of one card);
- PXB: several bridges/switches, below one root port (no host bridge crossed);
- PHB: same root complex (host bridge), different root ports, or both directly
  on the root bus (what VMs show);
- NODE: different root complexes on the same NUMA node;
- SYS: different NUMA nodes (the SMP interconnect is crossed).

When a path cannot be read, only the NUMA nodes decide (NODE or SYS). A
function with no NUMA information (`numa_node` -1) counts as on the same node
when the machine has at most one NUMA node online, else as SYS: we never claim
a closeness we cannot see.
"""

from __future__ import annotations

import os
import re

from allocator.topology import LinkLevel

__all__ = ["normalize_bdf", "numa_node_count", "pci_path", "pcie_level", "read_numa_node"]

_BDF_RE = re.compile(r"^([0-9a-f]{4,}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
_ROOT_RE = re.compile(r"^pci[0-9a-f]{4,}:[0-9a-f]{2}$")


def normalize_bdf(bus_id: str | bytes) -> str:
    """A PCI address as the kernel names it in sysfs: `0000:3b:00.0`.

    Accepts NVML's form (`00000000:3B:00.0`, 8-digit domain, upper case), the
    legacy 4-digit form, and a bare `3b:00.0` (domain 0). A domain wider than
    4 digits (VMD, `10000:e1:00.0`) keeps its width, as the kernel prints it.
    Raises ValueError on anything else.
    """
    s = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    s = s.strip().lower().rstrip("\x00")
    parts = s.split(":")
    try:
        if len(parts) == 2:
            domain, (bus, devfn) = 0, parts
        elif len(parts) == 3:
            domain, bus, devfn = int(parts[0], 16), parts[1], parts[2]
        else:
            raise ValueError
        dev, fn = devfn.split(".")
        b, d, f = int(bus, 16), int(dev, 16), int(fn, 16)
        if not (0 <= b <= 0xFF and 0 <= d <= 0x1F and 0 <= f <= 7):
            raise ValueError
    except ValueError:
        raise ValueError(f"not a PCI address: {s!r} (expected [domain:]bus:device.function)") from None
    return f"{domain:04x}:{b:02x}:{d:02x}.{f}"


def _slot(bdf: str) -> str:
    """`domain:bus:device` of a function: functions of one card share it."""
    return bdf.rsplit(".", 1)[0]


def pci_path(sysfs_root: str, bdf: str) -> tuple[str, ...] | None:
    """The chain from the root complex down to the function, or None when sysfs does not show it.

    `("pci0000:17", "0000:17:01.0", "0000:18:00.0", "0000:19:00.0", "0000:1a:00.0")`:
    root complex, bridges (root port, switch ports...), then the function
    itself. Components that are not PCI functions (a VMD domain's `pci10000:e0`)
    are skipped.
    """
    link = os.path.join(sysfs_root, "bus", "pci", "devices", bdf)
    real = os.path.realpath(link)
    if not os.path.exists(real):
        return None
    base = os.path.realpath(sysfs_root)
    rel = os.path.relpath(real, base)
    parts = rel.split(os.sep) if not rel.startswith("..") else real.split(os.sep)
    start = next((i for i, p in enumerate(parts) if _ROOT_RE.match(p)), None)
    if start is None:
        return None
    chain = [parts[start]] + [p for p in parts[start + 1:] if _BDF_RE.match(p)]
    if len(chain) < 2 or chain[-1] != bdf:
        return None
    return tuple(chain)


def read_numa_node(sysfs_root: str, bdf: str) -> int | None:
    """`<sysfs_root>/bus/pci/devices/<bdf>/numa_node`; -1, unreadable or garbage -> None."""
    try:
        with open(os.path.join(sysfs_root, "bus", "pci", "devices", bdf, "numa_node"), encoding="ascii") as f:
            value = int(f.read().strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return value if value >= 0 else None


def numa_node_count(sysfs_root: str) -> int:
    """How many NUMA nodes are online (`devices/system/node/online`, e.g. `0-1`); 0 when unknown."""
    try:
        with open(os.path.join(sysfs_root, "devices", "system", "node", "online"), encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return 0
    count = 0
    for part in filter(None, text.split(",")):
        try:
            lo, _, hi = part.partition("-")
            count += (int(hi) if hi else int(lo)) - int(lo) + 1
        except ValueError:
            return 0
    return count


def _numa_level(sysfs_root: str, numa_a: int | None, numa_b: int | None) -> LinkLevel:
    if numa_a is not None and numa_b is not None:
        return LinkLevel.NODE if numa_a == numa_b else LinkLevel.SYS
    return LinkLevel.NODE if numa_node_count(sysfs_root) == 1 else LinkLevel.SYS


def pcie_level(
    sysfs_root: str, bdf_a: str, bdf_b: str, numa_a: int | None = None, numa_b: int | None = None
) -> LinkLevel:
    """The `nvidia-smi topo -m` level between two PCI functions (rules in the module docstring).

    `bdf_a`/`bdf_b` may be in NVML or kernel form; `numa_a`/`numa_b` are the
    functions' NUMA nodes (None: unknown), used when the root complexes differ
    or a path cannot be read.
    """
    a, b = normalize_bdf(bdf_a), normalize_bdf(bdf_b)
    if a == b or _slot(a) == _slot(b):
        return LinkLevel.PIX
    pa, pb = pci_path(sysfs_root, a), pci_path(sysfs_root, b)
    if pa is None or pb is None or pa[0] != pb[0]:
        return _numa_level(sysfs_root, numa_a, numa_b)
    ua, ub = pa[:-1], pb[:-1]  # what each function hangs off: root complex, then bridges
    k = 0
    while k < min(len(ua), len(ub)) and ua[k] == ub[k]:
        k += 1
    if k == 1:
        return LinkLevel.PHB
    if ua == ub:
        return LinkLevel.PIX
    below = max(len(ua), len(ub)) - k  # bridges between the common ancestor and the farther function
    return LinkLevel.PIX if below <= 1 else LinkLevel.PXB
