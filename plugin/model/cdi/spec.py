"""The CDI spec document we write, as plain data, and the names it defines.

Why our own model: the plugin writes CDI specs itself (issue 13, "CDI, written
by us") so `deviceListStrategy` `cdi-cri`/`cdi-annotations` work on a node
where nothing else generated one. There is no Python CDI library; the CDI
project's Go library checks every spec we write in tests/cdi.

Format facts this module relies on (CDI SPEC.md and the Go library's
`specs-go/version.go`):

- `kind` is `vendor/class`. Vendor: a letter first, then letters, digits,
  `_ - .`, ending in a letter or digit. Class: the same without `.` before
  cdiVersion 0.6.0. Device names: a letter or digit first (a digit needs
  0.5.0), then letters, digits, `_ - . :`.
- A device must edit something (an empty `containerEdits` is invalid).
- `hostPath` on a device node needs cdiVersion 0.5.0.

Which cdiVersion: containerd 1.7.0-1.7.13 vendor the CDI library v0.5.4,
which knows no version above 0.5.0 and refuses the whole file otherwise;
containerd >= 1.7.14 and 2.x accept 0.6.0 and later. So we write 0.5.0, the
newest version every containerd 1.7/2.x accepts, and only a spec that
needs more (a class with a dot, annotations: we emit neither) says so.
Kinds are ours (`topo-dp.<resource domain>/<resource name>`), never
`nvidia.com/gpu`: a spec from NVIDIA's toolkit in the same directory would
otherwise define the same device names, and the CDI cache drops every
device that two specs of one directory both define.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: The cdiVersion we write (see the module docstring).
CDI_VERSION = "0.5.0"
#: Default directory of the specs we write: the runtime's dynamic (higher-priority) CDI dir.
DEFAULT_SPEC_DIR = "/var/run/cdi"
#: Vendor prefix of our kinds; also how the writer recognises its own files.
VENDOR_PREFIX = "topo-dp"

#: Vendor and class (a `.` in the class needs cdiVersion 0.6.0, see `CdiSpec.version`). At least
#: two characters: every released CDI library from v0.6 to v1.1 panics on a one-character vendor
#: or class (a slice-bounds bug fixed after v1.1.0), which would crash a runtime's spec refresh.
_KIND_PART_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*[A-Za-z0-9]$")
_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


class CdiError(ValueError):
    """A spec that no runtime would accept; the message names the field and the value."""


@dataclass(frozen=True)
class DeviceNode:
    """One device node to create in the container.

    `type`/`major`/`minor` are filled whenever we know them, so the runtime
    need not stat the host (and a node a simulated machine lacks can still
    be created in the container). `host_path` is only set when it differs
    from `path`.
    """

    path: str
    host_path: str | None = None
    type: str | None = "c"
    major: int | None = None
    minor: int | None = None
    permissions: str = "rw"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.host_path and self.host_path != self.path:
            out["hostPath"] = self.host_path
        if self.type and self.major is not None and self.minor is not None:
            out.update(type=self.type, major=self.major, minor=self.minor)
        if self.permissions:
            out["permissions"] = self.permissions
        return out


@dataclass(frozen=True)
class Mount:
    """A bind mount of a host directory (the MPS pipe directory of a DRA claim: `plugin.dra.claims.mps`)."""

    host_path: str
    container_path: str
    options: tuple[str, ...] = ("rbind", "rw")

    def to_dict(self) -> dict[str, Any]:
        return {"hostPath": self.host_path, "containerPath": self.container_path, "options": list(self.options)}


@dataclass(frozen=True)
class Edits:
    """Container edits: device nodes (deduplicated by path, first wins), `KEY=VALUE` env and mounts."""

    device_nodes: tuple[DeviceNode, ...] = ()
    env: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()

    def __post_init__(self) -> None:
        for e in self.env:
            if e.find("=") <= 0:
                raise CdiError(f"env entry {e!r} is not KEY=VALUE")
        for n in self.device_nodes:
            if not n.path.startswith("/"):
                raise CdiError(f"device node path {n.path!r} is not absolute")
        seen: set[str] = set()
        nodes = []
        for n in self.device_nodes:
            if n.path not in seen:
                seen.add(n.path)
                nodes.append(n)
        object.__setattr__(self, "device_nodes", tuple(nodes))

    @property
    def empty(self) -> bool:
        return not self.device_nodes and not self.env and not self.mounts

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [n.to_dict() for n in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_dict() for m in self.mounts]
        return out


@dataclass(frozen=True)
class CdiDevice:
    name: str
    edits: Edits

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise CdiError(f"CDI device name {self.name!r}: use letters, digits and _ - . : "
                           "(a letter or digit first and last)")
        if self.edits.empty:
            raise CdiError(f"CDI device {self.name!r} has nothing to inject (no device node, no env)")


@dataclass(frozen=True)
class CdiSpec:
    """One spec file: a kind, its devices, and the edits every container using one of them gets."""

    kind: str
    devices: tuple[CdiDevice, ...]
    edits: Edits = field(default_factory=Edits)

    def __post_init__(self) -> None:
        vendor, sep, cls = self.kind.partition("/")
        if not sep or not _KIND_PART_RE.match(vendor) or not _KIND_PART_RE.match(cls):
            raise CdiError(f"CDI kind {self.kind!r} is not vendor/class (each at least 2 of letters, digits, "
                           "_ - . ; a letter first, a letter or digit last)")
        if not self.devices:
            raise CdiError(f"CDI spec {self.kind!r} has no devices (a runtime rejects an empty spec)")
        names = [d.name for d in self.devices]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise CdiError(f"CDI spec {self.kind!r} defines device(s) twice: {', '.join(dup)}")

    @property
    def vendor(self) -> str:
        return self.kind.partition("/")[0]

    @property
    def cls(self) -> str:
        return self.kind.partition("/")[2]

    @property
    def file_name(self) -> str:
        """`<vendor>-<class>.json`, the CDI library's own naming (GenerateSpecName)."""
        return f"{self.vendor}-{self.cls}.json"

    @property
    def version(self) -> str:
        """CDI_VERSION, or the version the content needs when that is newer (a `.` in the class)."""
        return "0.6.0" if "." in self.cls else CDI_VERSION

    def device_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    def qualified(self, name: str) -> str:
        """The fully qualified CDI name (`vendor/class=name`) a runtime resolves."""
        return f"{self.kind}={name}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cdiVersion": self.version, "kind": self.kind}
        if not self.edits.empty:
            out["containerEdits"] = self.edits.to_dict()
        out["devices"] = [{"name": d.name, "containerEdits": d.edits.to_dict()} for d in self.devices]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


def kind_for_resource(resource_name: str, vendor_prefix: str = VENDOR_PREFIX) -> str:
    """Our CDI kind for an extended resource: `nvidia.com/gpu` -> `topo-dp.nvidia.com/gpu`.

    The class is the resource's name with every character CDI classes (before
    0.6.0) do not allow, such as the `.` of `mig-1g.10gb` or `gpu.shared`,
    turned into `_`, and `r-` in front when it does not start with a letter or
    is a single character. One kind per resource, so two resources never
    share a device name.
    """
    domain, sep, name = resource_name.partition("/")
    if not sep or not domain or not name:
        raise CdiError(f"resource name {resource_name!r} is not <domain>/<name>")
    cls = re.sub(r"[^A-Za-z0-9_-]", "_", name)
    if not cls[0].isalpha() or len(cls) < 2:
        cls = "r-" + cls
    return f"{vendor_prefix}.{domain}/{cls}"


def device_name(device_id: str) -> str:
    """The CDI device name for a plugin device ID: the ID, with characters CDI names do not
    allow (the `/` of old-style MIG IDs `MIG-GPU-<uuid>/<gi>/<ci>`) turned into `_`."""
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", device_id)


def qualified_names(spec: CdiSpec, names: Iterable[str]) -> list[str]:
    """Qualified CDI names (`vendor/class=name`) of those `names` the spec defines, in order, each once.

    A name the spec does not define is left out: handing a runtime a name it
    cannot resolve fails container creation (a NIC with no device node to
    inject has no CDI device; its Allocate response carries it instead).
    """
    known = set(spec.device_names())
    out: list[str] = []
    for n in names:
        q = spec.qualified(n)
        if n in known and q not in out:
            out.append(q)
    return out
