"""The config's `nics.resourceList` parsed and validated into `PoolSpec`s (SR-IOV-network-device-plugin format).

Why this format: operators already write `resourceList` entries for the
SR-IOV network device plugin. So an entry is theirs (`resourceName`,
`resourcePrefix`, `selectors`, `excludeTopology`, `additionalInfo`,
`deviceType: netDevice`) plus our `allocationPolicy`.

Differences, each deliberate: the config is validated up front and every
mistake stops the start with the file, the field path and the fix (upstream
ignores unknown fields and prints range errors at match time); `-` and `/` in
names also become `_` in env var names (upstream keeps `-`, which is not a
valid shell name).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ...config import ConfigError
from ...errors import OptionError, clip, shorten
from ..resource_names import check_resource_name
from .selectors import PoolSpec, Selector, VfRange

DEFAULT_PREFIX = "topo.dev"
POLICIES = ("spread", "packed")
LINK_TYPES = ("ether", "infiniband")
CONFIG_PATH = "nics.resourceList"

_ENTRY_KEYS = ("resourceName", "resourcePrefix", "deviceType", "excludeTopology", "selectors",
               "additionalInfo", "allocationPolicy")
_LIST_SELECTORS = ("vendors", "devices", "drivers", "pciAddresses", "acpiIndexes", "pfNames", "rootDevices",
                   "linkTypes")
_BOOL_SELECTORS = ("isRdma", "needVhostNet")
_UNSUPPORTED_SELECTORS = {
    "ddpProfiles": "Intel DDP profiles need devlink/ddptool, which this plugin does not use",
    "pKeys": "InfiniBand partition keys are not read",
    "vdpaType": "vDPA devices are not discovered",
    "auxTypes": "auxiliary (SF) devices are not discovered",
}
_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]+$")
_PREFIX_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_HEX_RE = re.compile(r"^(0x)?[0-9a-fA-F]{1,4}$")
_BDF_RE = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")


class NicPoolError(ConfigError):
    """A bad `nics.resourceList`; `str()` names the file, the field path and the fix."""

    def __init__(self, source: str, field_path: str, message: str, fix: str):
        self.source = source
        self.field = field_path
        self.detail = message
        self.fix = fix
        super().__init__(f"{source}: field {field_path}: {message} (fix: {fix})")


# -- parsing --------------------------------------------------------------------
class _Parser:
    def __init__(self, source: str, base: str):
        self.source = source
        self.base = base

    def err(self, path: str, message: str, fix: str) -> NicPoolError:
        return NicPoolError(self.source, path, message, fix)

    def unknown_key(self, path: str, key: Any, allowed: Sequence[str]) -> NicPoolError:
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(allowed)}"
        return self.err(f"{path}.{clip(str(key))}", "unknown field", hint)

    def str_list(self, path: str, value: Any) -> list[str]:
        if isinstance(value, str):
            raise self.err(path, f"expected a list of strings, got the string {shorten(value)}",
                           f"write [{shorten(value)}]")
        if not isinstance(value, list):
            raise self.err(path, f"expected a list of strings, got {type(value).__name__}", "write a YAML list")
        for i, v in enumerate(value):
            if not isinstance(v, str):
                raise self.err(f"{path}[{i}]", f"expected a string, got {shorten(v)}", f"quote it: \"{clip(str(v))}\"")
        return value

    def hex_ids(self, path: str, value: Any, what: str, example: str) -> frozenset[str]:
        out = set()
        for i, v in enumerate(self.str_list(path, value)):
            if not _HEX_RE.match(v.strip()):
                raise self.err(f"{path}[{i}]", f"{shorten(v)} is not a hex PCI {what} ID",
                               f"write 4 hex digits as lspci -n shows them, e.g. {example!r}")
            out.add(f"{int(v.strip(), 16):04x}")
        return frozenset(out)

    def bdf(self, path: str, v: str) -> str:
        m = _BDF_RE.match(v.strip())
        if not m:
            raise self.err(path, f"{shorten(v)} is not a PCI address",
                           "write domain:bus:device.function, e.g. '0000:3b:00.2'")
        dom, bus, dev, fn = m.groups()
        return f"{(dom or '0000').lower()}:{bus.lower()}:{dev.lower()}.{fn}"

    def vf_ranges(self, path: str, value: Any, kind: str) -> tuple[VfRange, ...]:
        out: list[VfRange] = []
        seen: dict[str, int] = {}
        example = "ens1f0#0,2-7" if kind == "pfNames" else "0000:3b:00.0#0,2-7"
        for i, item in enumerate(self.str_list(path, value)):
            p = f"{path}[{i}]"
            head, sep, tail = item.partition("#")
            head = head.strip()
            if not head:
                raise self.err(p, f"{shorten(item)} names no PF", f"write the PF before '#', e.g. {example!r}")
            pf = self.bdf(p, head) if kind == "rootDevices" else head.lower()
            indexes: set[int] | None = None
            if sep:
                if "#" in tail:
                    raise self.err(p, f"{shorten(item)} has more than one '#'", f"write one '#', e.g. {example!r}")
                if not tail.strip():
                    raise self.err(p, f"{shorten(item)} has no VF index after '#'",
                                   f"list VF indexes or ranges after '#', e.g. {example!r}, or drop '#' for all VFs")
                indexes = set()
                for part in tail.split(","):
                    m = _RANGE_RE.match(part.strip())
                    if not m:
                        raise self.err(p, f"{shorten(item)} has a bad VF index or range {shorten(part.strip())}",
                                       f"write indexes and inclusive ranges like {example!r}")
                    lo = int(m.group(1))
                    hi = int(m.group(2)) if m.group(2) is not None else lo
                    if hi < lo:
                        raise self.err(p, f"{shorten(item)} has the range {shorten(part.strip())} whose end is "
                                          "before its start",
                                       f"write it as {hi}-{lo}")
                    indexes.update(range(lo, hi + 1))
            if pf in seen:
                raise self.err(p, f"{shorten(head)} is already listed at {path}[{seen[pf]}] "
                                  "(only the first would count)",
                               "merge the VF ranges into one item, e.g. 'ens1f0#0-1,3'")
            seen[pf] = i
            out.append(VfRange(pf, frozenset(indexes) if indexes is not None else None))
        return tuple(out)

    def selector(self, path: str, raw: Any) -> Selector:
        if not isinstance(raw, Mapping):
            raise self.err(path, f"a selector must be a mapping of fields, got {type(raw).__name__}",
                           "write e.g. {vendors: ['15b3'], drivers: ['mlx5_core']}")
        kw: dict[str, Any] = {}
        for key, value in raw.items():
            p = f"{path}.{key}"
            if key in _UNSUPPORTED_SELECTORS:
                raise self.err(p, f"is not supported by topo-device-plugin ({_UNSUPPORTED_SELECTORS[key]})",
                               "remove it, or select these devices by vendors/devices/pfNames instead")
            if key in _BOOL_SELECTORS:
                if not isinstance(value, bool):
                    raise self.err(p, f"expected true or false, got {shorten(value)}", f"write {key}: true")
                kw["is_rdma" if key == "isRdma" else "need_vhost_net"] = value
                continue
            if key not in _LIST_SELECTORS:
                raise self.unknown_key(path, key, _LIST_SELECTORS + _BOOL_SELECTORS)
            if key == "vendors":
                kw["vendors"] = self.hex_ids(p, value, "vendor", "15b3")
            elif key == "devices":
                kw["devices"] = self.hex_ids(p, value, "device", "101c")
            elif key == "drivers":
                kw["drivers"] = frozenset(v.strip() for v in self.str_list(p, value))
            elif key == "pciAddresses":
                kw["pci_addresses"] = frozenset(self.bdf(f"{p}[{i}]", v)
                                                for i, v in enumerate(self.str_list(p, value)))
            elif key == "acpiIndexes":
                kw["acpi_indexes"] = frozenset(v.strip() for v in self.str_list(p, value))
            elif key in ("pfNames", "rootDevices"):
                kw["pf_names" if key == "pfNames" else "root_devices"] = self.vf_ranges(p, value, key)
            elif key == "linkTypes":
                types = set()
                for i, v in enumerate(self.str_list(p, value)):
                    t = v.strip().lower()
                    if t not in LINK_TYPES:
                        close = difflib.get_close_matches(t, LINK_TYPES, n=1, cutoff=0.4)
                        raise self.err(f"{p}[{i}]", f"{shorten(v)} is not a link type",
                                       f"use {close[0]!r}" if close else "use 'ether' or 'infiniband'")
                    types.add(t)
                kw["link_types"] = frozenset(types)
        if kw.get("is_rdma") and kw.get("drivers") == frozenset({"vfio-pci"}):
            raise self.err(f"{path}.isRdma", "vfio-pci functions have no RDMA device, so nothing can match",
                           "drop isRdma or select a kernel driver such as mlx5_core")
        return Selector(**kw)

    def entry(self, i: int, raw: Any, default_prefix: str) -> PoolSpec:
        path = f"{self.base}[{i}]"
        if not isinstance(raw, Mapping):
            raise self.err(path, f"expected a mapping with resourceName and selectors, got {type(raw).__name__}",
                           "write e.g. {resourceName: sriov_a, selectors: {pfNames: [ens1f0]}}")
        for key in raw:
            if key not in _ENTRY_KEYS:
                raise self.unknown_key(path, key, _ENTRY_KEYS)
        name = raw.get("resourceName")
        if name is None:
            raise self.err(f"{path}.resourceName", "is required", "name the resource, e.g. resourceName: sriov_a")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise self.err(f"{path}.resourceName", f"{shorten(name)} may only use letters, digits, '_' and '-'",
                           "rename it, e.g. sriov_a")
        prefix = raw.get("resourcePrefix", default_prefix)
        if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix) or "kubernetes.io" in prefix:
            raise self.err(f"{path}.resourcePrefix", f"{shorten(prefix)} is not a valid resource domain",
                           "use a lower-case DNS name outside kubernetes.io, e.g. example.com")
        try:
            check_resource_name(f"{prefix}/{name}")
        except OptionError as e:
            raise self.err(f"{path}.resourceName", str(e), "start and end the name with a letter or digit") from None
        dtype = raw.get("deviceType", "netDevice")
        if dtype != "netDevice":
            raise self.err(f"{path}.deviceType", f"{shorten(dtype)} is not supported (only netDevice)",
                           "remove deviceType or set it to netDevice")
        excl = raw.get("excludeTopology", False)
        if not isinstance(excl, bool):
            raise self.err(f"{path}.excludeTopology", f"expected true or false, got {shorten(excl)}",
                           "write excludeTopology: true")
        policy = raw.get("allocationPolicy", "spread")
        if policy not in POLICIES:
            raise self.err(f"{path}.allocationPolicy", f"{shorten(policy)} is not a NIC policy",
                           "use spread (VFs over different PFs) or packed (fill one PF first)")
        if "selectors" not in raw:
            raise self.err(f"{path}.selectors", "is required",
                           "add selectors, e.g. selectors: [{pfNames: [ens1f0]}] ({} takes every NIC)")
        sel_raw = raw["selectors"]
        if isinstance(sel_raw, Mapping):
            selectors: tuple[Selector, ...] = (self.selector(f"{path}.selectors", sel_raw),)
        elif isinstance(sel_raw, list):
            if not sel_raw:
                raise self.err(f"{path}.selectors", "is empty, so the pool could never get a device",
                               "add a selector ({} takes every NIC) or remove the entry")
            selectors = tuple(self.selector(f"{path}.selectors[{j}]", s) for j, s in enumerate(sel_raw))
        else:
            raise self.err(f"{path}.selectors", f"expected a list of selector objects, got {type(sel_raw).__name__}",
                           "write selectors: [{vendors: ['15b3']}]")
        info = None
        if "additionalInfo" in raw:
            info = self.additional_info(f"{path}.additionalInfo", raw["additionalInfo"])
        return PoolSpec(prefix, name, selectors, policy, excl, info)

    def additional_info(self, path: str, raw: Any) -> dict[str, dict[str, str]]:
        if not isinstance(raw, Mapping):
            raise self.err(path, "expected a mapping of '*' or a PCI address to key/values",
                           "write additionalInfo: {'*': {key: value}}")
        out: dict[str, dict[str, str]] = {}
        for key, kv in raw.items():
            p = f"{path}.{key}"
            k = "*" if key == "*" else self.bdf(p, str(key))
            if not isinstance(kv, Mapping):
                raise self.err(p, "expected a mapping of keys to string values", "write {key: value}")
            for ik, iv in kv.items():
                if not isinstance(iv, str):
                    raise self.err(f"{p}.{ik}", f"expected a string, got {shorten(iv)}",
                                   f"quote it: \"{clip(str(iv))}\"")
            out[k] = {str(ik): iv for ik, iv in kv.items()}
        return out


def parse_pool_specs(raw: Any, source: str, *, default_prefix: str = DEFAULT_PREFIX,
                     path: str = CONFIG_PATH) -> tuple[PoolSpec, ...]:
    """Validate `nics.resourceList`; raise `NicPoolError` on the first mistake."""
    p = _Parser(source, path)
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise p.err(path, f"expected a list of resource entries, got {type(raw).__name__}",
                    "write resourceList: [{resourceName: ..., selectors: ...}]")
    if not _PREFIX_RE.match(default_prefix):
        raise p.err(path, f"default resource prefix {default_prefix!r} is not a DNS name", "fix the prefix option")
    specs: list[PoolSpec] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(raw):
        spec = p.entry(i, entry, default_prefix)
        if spec.resource_name in seen:
            raise p.err(f"{path}[{i}].resourceName",
                        f"{spec.resource_name} is already defined at {path}[{seen[spec.resource_name]}]",
                        "give every pool a unique resourceName (or a different resourcePrefix)")
        seen[spec.resource_name] = i
        specs.append(spec)
    return tuple(specs)
