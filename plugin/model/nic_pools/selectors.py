"""NIC pool selectors and the validated pool entry (`PoolSpec`).

Why apart from the parser: matching a device is what every rescan does,
parsing is what a config load does; as in the SR-IOV network device plugin
(config / selectors / device and info providers), the data a pool is made of
knows nothing of YAML. Semantics (as upstream): inside one selector every
given field must match (AND), the values of one field are alternatives (OR),
the selectors of an entry are alternatives and the first that matches counts;
`pfNames` / `rootDevices` only match VFs, `#0,2-7` restricts them to those VF
indexes; `isRdma: true` keeps RDMA-capable functions (false does not filter).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from allocator.topology import Device


@dataclass(frozen=True)
class VfRange:
    """A `pfNames` / `rootDevices` item: the PF and which of its VFs (None: all)."""

    pf: str
    indexes: frozenset[int] | None = None

    def matches(self, pf: str, vf_index: int | None) -> bool:
        if pf != self.pf:
            return False
        return self.indexes is None or (vf_index is not None and vf_index in self.indexes)


@dataclass(frozen=True)
class Selector:
    """One selector object; `None` fields do not filter."""

    vendors: frozenset[str] | None = None
    devices: frozenset[str] | None = None
    drivers: frozenset[str] | None = None
    pci_addresses: frozenset[str] | None = None
    acpi_indexes: frozenset[str] | None = None
    pf_names: tuple[VfRange, ...] | None = None
    root_devices: tuple[VfRange, ...] | None = None
    link_types: frozenset[str] | None = None
    is_rdma: bool = False
    need_vhost_net: bool = False

    def matches(self, d: Device) -> bool:
        a = d.attributes
        if self.vendors is not None and a.get("vendor", "") not in self.vendors:
            return False
        if self.devices is not None and a.get("device", "") not in self.devices:
            return False
        if self.drivers is not None and a.get("driver", "") not in self.drivers:
            return False
        if self.pci_addresses is not None and d.name not in self.pci_addresses:
            return False
        if self.acpi_indexes is not None and a.get("acpi_index", "") not in self.acpi_indexes:
            return False
        vf = _int_or_none(a.get("vf_index"))
        if self.pf_names is not None:
            pf_name = a.get("pf_netdev", "").lower()
            if not pf_name or not any(r.matches(pf_name, vf) for r in self.pf_names):
                return False
        if self.root_devices is not None:
            pf_addr = a.get("pf", "")
            if not pf_addr or not any(r.matches(pf_addr, vf) for r in self.root_devices):
                return False
        if self.link_types is not None and a.get("link_type", "").lower() not in self.link_types:
            return False
        if self.is_rdma and a.get("rdma") != "true":
            return False
        return True


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class PoolSpec:
    """One validated `resourceList` entry. Callable: it is the `NicPool.select` of its pool."""

    prefix: str
    name: str
    selectors: tuple[Selector, ...]
    policy: str = "spread"
    exclude_topology: bool = False
    #: `additionalInfo`: "*" or a PCI address -> extra key/values for the `_INFO` JSON.
    additional_info: Mapping[str, Mapping[str, str]] | None = None

    @property
    def resource_name(self) -> str:
        return f"{self.prefix}/{self.name}"

    def selector_for(self, d: Device) -> Selector | None:
        for s in self.selectors:
            if s.matches(d):
                return s
        return None

    def __call__(self, d: Device) -> bool:
        return self.selector_for(d) is not None

    @property
    def env_name(self) -> str:
        return env_var_name(self.prefix, self.name)


def env_var_name(prefix: str, name: str) -> str:
    """`PCIDEVICE_<PREFIX>_<NAME>`, upper-cased, with `.`, `/` and `-` as `_`."""
    return re.sub(r"[./-]", "_", f"PCIDEVICE_{prefix}_{name}").upper()
