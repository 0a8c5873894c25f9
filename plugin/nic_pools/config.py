"""NIC resource pools: the config's `nics.resourceList`, SR-IOV-network-device-plugin compatible.

Why this format: operators already write `resourceList` entries for the
SR-IOV network device plugin, and Multus / SR-IOV CNI read the
`PCIDEVICE_<PREFIX>_<NAME>` and `..._INFO` variables it sets. So an entry
is theirs (`resourceName`, `resourcePrefix`, `selectors`, `excludeTopology`,
`additionalInfo`, `deviceType: netDevice`) plus our `allocationPolicy`, and
Allocate answers as that plugin does (`../shared/research/nic-and-other-plugins.md`
§2.4): device specs deduplicated by host path, env vars with the IDs and the
per-device info JSON.

Semantics (as upstream): inside one selector object every given field must
match (fields are AND-ed, values of one field OR-ed); the selector objects of
an entry are alternatives; a NIC goes to the first entry (and its first
selector) that matches. `pfNames` / `rootDevices` only match VFs; `#0,2-7`
restricts them to those VF indexes. `isRdma: true` keeps RDMA-capable
functions (false does not filter).

Differences, each deliberate: the config is validated up front and every
mistake stops the start with the file, the field path and the fix (upstream
ignores unknown fields and prints range errors at match time); `-` and `/` in
names also become `_` in env var names (upstream keeps `-`, which is not a
valid shell name); RDMA char devices are handed to every RDMA-capable device
of a pool, not only where the selector says `isRdma` (they belong to that
VF; without them RDMA in the pod fails), and device nodes that do not exist
under the dev root are left out rather than failing container creation.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocator.topology import Device

from .allocate_response import ContainerAllocation, DeviceNode
from .config import ConfigError
from .resources import NicPool, check_resource_name

log = logging.getLogger(__name__)

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


# -- selectors ----------------------------------------------------------------
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


def go_json(obj: Any) -> str:
    """JSON as Go's `json.Marshal` writes a map: sorted keys, no spaces, HTML characters escaped."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                    ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


# -- Allocate -------------------------------------------------------------------
class NicAllocateBuilder:
    """The container's share of a pool's devices, as the SR-IOV network device plugin builds it."""

    def __init__(self, spec: PoolSpec, dev_root: str = "/dev"):
        self.spec = spec
        self.dev_root = dev_root

    def _host(self, container_path: str) -> str:
        rel = container_path[len("/dev/"):] if container_path.startswith("/dev/") else container_path.lstrip("/")
        return os.path.join(self.dev_root, rel)

    def _exists(self, container_path: str) -> bool:
        return os.path.exists(self._host(container_path))

    def _node(self, out: ContainerAllocation, container: str, host: str | None = None) -> bool:
        host_path = self._host(host or container)
        if not os.path.exists(host_path):
            log.warning("%s: device node %s does not exist; not handing it to the container",
                        self.spec.resource_name, host_path)
            return False
        out.add_device(DeviceNode(container_path=container, host_path=host_path, permissions="rw"))
        return True

    def device_info(self, out: ContainerAllocation, d: Device) -> dict[str, dict[str, str]]:
        """Add `d`'s device nodes to `out` and return its `_INFO` entry."""
        a = d.attributes
        info: dict[str, dict[str, str]] = {"generic": {"deviceID": d.name}}
        driver = a.get("driver", "")
        if driver == "vfio-pci":
            self._node(out, "/dev/vfio/vfio")
            vinfo = {"mount": "/dev/vfio/vfio"}
            dev = a.get("vfio_device")
            if dev and self._node(out, dev, a.get("vfio_host_device") or dev):
                vinfo["dev-mount"] = dev
            info["vfio"] = vinfo
        elif a.get("uio_device"):
            uinfo: dict[str, str] = {}
            if self._node(out, a["uio_device"]):
                uinfo["mount"] = a["uio_device"]
            info["uio"] = uinfo
        if self.spec.additional_info is not None:
            extra: dict[str, str] = {}
            for key in ("*", d.name):
                extra.update(self.spec.additional_info.get(key, {}))
            info["extra"] = extra
        selector = self.spec.selector_for(d)
        if a.get("rdma") == "true":
            rinfo: dict[str, str] = {}
            chars = [c for c in a.get("rdma_char_devices", "").split(",") if c]
            if self._exists("/dev/infiniband/rdma_cm"):
                chars.append("/dev/infiniband/rdma_cm")
            for c in chars:
                if self._node(out, c):
                    for key in ("uverbs", "umad", "issm", "rdma_cm"):
                        if key in c:
                            rinfo[key] = c
                            break
            devs = [r for r in a.get("rdma_devices", "").split(",") if r]
            if devs:
                rinfo["rdma_dev"] = devs[0]
            info["rdma"] = rinfo
        elif selector is not None and selector.is_rdma:
            log.warning("%s: %s was selected as RDMA but has no RDMA device now", self.spec.resource_name, d.name)
        if selector is not None and selector.need_vhost_net:
            if self._exists("/dev/vhost-net") and self._exists("/dev/net/tun"):
                self._node(out, "/dev/vhost-net")
                self._node(out, "/dev/net/tun")
                info["vhost"] = {"net-mount": "/dev/vhost-net", "tun-mount": "/dev/net/tun"}
            else:
                log.warning("%s: needVhostNet is set but %s/vhost-net or net/tun does not exist",
                            self.spec.resource_name, self.dev_root)
        return info

    def build(self, ids: Sequence[str], devices: Sequence[Device]) -> ContainerAllocation:
        out = ContainerAllocation()
        infos: dict[str, dict[str, dict[str, str]]] = {}
        for i, d in zip(ids, devices):
            infos[i] = self.device_info(out, d)
        env = self.spec.env_name
        out.envs[env] = ",".join(ids)
        out.envs[env + "_INFO"] = go_json(infos)
        return out


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
        return self.err(f"{path}.{key}", "unknown field", hint)

    def str_list(self, path: str, value: Any) -> list[str]:
        if isinstance(value, str):
            raise self.err(path, f"expected a list of strings, got the string {value!r}", f"write [{value!r}]")
        if not isinstance(value, list):
            raise self.err(path, f"expected a list of strings, got {type(value).__name__}", "write a YAML list")
        for i, v in enumerate(value):
            if not isinstance(v, str):
                raise self.err(f"{path}[{i}]", f"expected a string, got {v!r}", f"quote it: \"{v}\"")
        return value

    def hex_ids(self, path: str, value: Any, what: str, example: str) -> frozenset[str]:
        out = set()
        for i, v in enumerate(self.str_list(path, value)):
            if not _HEX_RE.match(v.strip()):
                raise self.err(f"{path}[{i}]", f"{v!r} is not a hex PCI {what} ID",
                               f"write 4 hex digits as lspci -n shows them, e.g. {example!r}")
            out.add(f"{int(v.strip(), 16):04x}")
        return frozenset(out)

    def bdf(self, path: str, v: str) -> str:
        m = _BDF_RE.match(v.strip())
        if not m:
            raise self.err(path, f"{v!r} is not a PCI address", "write domain:bus:device.function, e.g. '0000:3b:00.2'")
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
                raise self.err(p, f"{item!r} names no PF", f"write the PF before '#', e.g. {example!r}")
            pf = self.bdf(p, head) if kind == "rootDevices" else head.lower()
            indexes: set[int] | None = None
            if sep:
                if "#" in tail:
                    raise self.err(p, f"{item!r} has more than one '#'", f"write one '#', e.g. {example!r}")
                if not tail.strip():
                    raise self.err(p, f"{item!r} has no VF index after '#'",
                                   f"list VF indexes or ranges after '#', e.g. {example!r}, or drop '#' for all VFs")
                indexes = set()
                for part in tail.split(","):
                    m = _RANGE_RE.match(part.strip())
                    if not m:
                        raise self.err(p, f"{item!r} has a bad VF index or range {part.strip()!r}",
                                       f"write indexes and inclusive ranges like {example!r}")
                    lo = int(m.group(1))
                    hi = int(m.group(2)) if m.group(2) is not None else lo
                    if hi < lo:
                        raise self.err(p, f"{item!r} has the range {part.strip()!r} whose end is before its start",
                                       f"write it as {hi}-{lo}")
                    indexes.update(range(lo, hi + 1))
            if pf in seen:
                raise self.err(p, f"{head!r} is already listed at {path}[{seen[pf]}] (only the first would count)",
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
                    raise self.err(p, f"expected true or false, got {value!r}", f"write {key}: true")
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
                        raise self.err(f"{p}[{i}]", f"{v!r} is not a link type",
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
            raise self.err(f"{path}.resourceName", f"{name!r} may only use letters, digits, '_' and '-'",
                           "rename it, e.g. sriov_a")
        prefix = raw.get("resourcePrefix", default_prefix)
        if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix) or "kubernetes.io" in prefix:
            raise self.err(f"{path}.resourcePrefix", f"{prefix!r} is not a valid resource domain",
                           "use a lower-case DNS name outside kubernetes.io, e.g. example.com")
        try:
            check_resource_name(f"{prefix}/{name}")
        except ValueError as e:
            raise self.err(f"{path}.resourceName", str(e), "start and end the name with a letter or digit") from None
        dtype = raw.get("deviceType", "netDevice")
        if dtype != "netDevice":
            raise self.err(f"{path}.deviceType", f"{dtype!r} is not supported (only netDevice)",
                           "remove deviceType or set it to netDevice")
        excl = raw.get("excludeTopology", False)
        if not isinstance(excl, bool):
            raise self.err(f"{path}.excludeTopology", f"expected true or false, got {excl!r}",
                           "write excludeTopology: true")
        policy = raw.get("allocationPolicy", "spread")
        if policy not in POLICIES:
            raise self.err(f"{path}.allocationPolicy", f"{policy!r} is not a NIC policy",
                           "use spread (VFs over different PFs) or packed (fill one PF first)")
        if "selectors" not in raw:
            raise self.err(f"{path}.selectors", "is required",
                           "add selectors, e.g. selectors: [{pfNames: [ens1f0]}] ({} takes every NIC)")
        sel_raw = raw["selectors"]
        if isinstance(sel_raw, Mapping):
            selectors = (self.selector(f"{path}.selectors", sel_raw),)
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
                    raise self.err(f"{p}.{ik}", f"expected a string, got {iv!r}", f"quote it: \"{iv}\"")
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


def parse_pools(raw: Any, source: str, *, default_prefix: str = DEFAULT_PREFIX, dev_root: str = "/dev",
                path: str = CONFIG_PATH) -> tuple[NicPool, ...]:
    """`nics.resourceList` -> the `NicPool`s for `ResourceOptions(nic_pools=...)`.

    `source` (the config file) and `path` name the place in errors. `dev_root`
    is where Allocate looks for (and points the runtime at) device nodes.
    """
    return tuple(
        NicPool(
            resource_name=spec.resource_name,
            select=spec,
            policy=spec.policy,
            exclude_topology=spec.exclude_topology,
            builder=NicAllocateBuilder(spec, dev_root),
        )
        for spec in parse_pool_specs(raw, source, default_prefix=default_prefix, path=path)
    )


def pool_of(device: Device, pools: Sequence[NicPool]) -> NicPool | None:
    """The pool that gets `device` (first match), or None."""
    for pool in pools:
        if pool.select(device):
            return pool
    return None


@dataclass(frozen=True)
class PoolSummary:
    """For `discover`: which NICs each pool gets."""

    resource_name: str
    policy: str
    exclude_topology: bool
    devices: tuple[str, ...] = field(default_factory=tuple)


def summarize(devices: Sequence[Device], pools: Sequence[NicPool]) -> tuple[tuple[PoolSummary, ...], tuple[str, ...]]:
    """Pool membership (first match wins) and the NICs no pool takes."""
    members: dict[str, list[str]] = {p.resource_name: [] for p in pools}
    left: list[str] = []
    for d in devices:
        pool = pool_of(d, pools)
        if pool is None:
            left.append(d.name)
        else:
            members[pool.resource_name].append(d.name)
    return (
        tuple(PoolSummary(p.resource_name, p.policy, p.exclude_topology, tuple(members[p.resource_name]))
              for p in pools),
        tuple(left),
    )
