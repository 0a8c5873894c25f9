"""NVIDIA's container toolkit's CDI spec on the node: the names it defines, and ours resolved against it.

Why: the driver's user-space libraries (`libcuda.so`, `libnvidia-ml.so`, `nvidia-smi`, the
firmware, the ldcache and soname hooks) depend on the driver installed on the node; NVIDIA's
toolkit writes them into its CDI spec (`nvidia-ctk cdi generate`, or its `nvidia-cdi-refresh`
service), one device per GPU and MIG device. Rather than rebuild that list by hand we name the
toolkit's device for each allocated GPU beside our own (DRA prepare; the device plugin with
`--cdi-specs external`), and check the name exists before answering: a container must never
start without its libraries because a spec was missing or stale.

What the toolkit names a device (nvidia-container-toolkit v1.20, pkg/nvcdi/namer.go):
- `uuid`: the GPU's UUID, a MIG device's MIG UUID;
- `index`: the GPU's NVML index (`0`), a MIG device `<GPU index>:<MIG slot>` (`0:1`);
- its default (no `--device-name-strategy`) is both, so either kind of name resolves against a
  spec generated with the defaults. We default to `uuid`: UUIDs stay the same when a GPU falls
  off the bus and the others' indexes shift, which the index names do not.

The spec's kind is `<vendor>/<class>` (`nvidia.com/gpu`, `--vendor`/`--class` of the toolkit).
Files are read from the CDI spec directories (`/etc/cdi`, `/var/run/cdi`: the toolkit writes the
former by default, its refresh service the latter), JSON or YAML, and re-read only when a
file's size or mtime changes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from allocator import AllocationError
from allocator.topology import Device, DeviceKind

log = logging.getLogger(__name__)

TOOLKIT_STRATEGIES = ("uuid", "index")
DEFAULT_TOOLKIT_DIRS = ("/etc/cdi", "/var/run/cdi")
#: A CDI spec of the toolkit for 8 GPUs is ~20 KB; far above any real one, far below memory trouble.
MAX_SPEC_BYTES = 16 << 20


class ToolkitSpecError(AllocationError):
    """The toolkit's spec cannot give a device its name; the message says what is missing and the fix.

    An `AllocationError`: the device plugin's Allocate refuses the request with the message (the kubelet
    puts it on the pod), as it does for the other requests that cannot be answered."""


def toolkit_name(d: Device, strategy: str) -> str:
    """The toolkit's device name for `d` (GPU or MIG device) under `strategy` (see the module docstring)."""
    if strategy == "uuid":
        if not d.uuid:
            raise ToolkitSpecError(f"device {d.name} has no UUID, so it has no name in NVIDIA's CDI spec; "
                                   "use the index strategy")
        return d.uuid
    if strategy != "index":
        raise ValueError(f"toolkit device-name strategy {strategy!r} is not one of {', '.join(TOOLKIT_STRATEGIES)}")
    if d.kind is DeviceKind.MIG:
        index = d.attributes.get("index", "")  # `<GPU index>:<slot>`, as plugin/sources/nvml_mig.py records it
        if not index:
            raise ToolkitSpecError(f"MIG device {d.name}: its NVML slot is unknown, so it has no index name in "
                                   "NVIDIA's CDI spec; use the uuid strategy")
        return index
    return str(d.index)


@dataclass
class _File:
    stamp: tuple[int, int]
    kind: str
    names: frozenset[str]


def _fix(kind: str, dirs: Sequence[str], strategy: str) -> str:
    vendor, _, cls = kind.partition("/")
    extra = f" --vendor {vendor} --class {cls}" if kind != "nvidia.com/gpu" else ""
    return (f"run `nvidia-ctk cdi generate --device-name-strategy {strategy}{extra} --output "
            f"{dirs[0]}/nvidia.yaml` on the node (or enable the toolkit's nvidia-cdi-refresh service), "
            "or turn the toolkit's names off")


@dataclass
class ToolkitSpecs:
    """The device names of the toolkit's spec(s) of one kind in the CDI spec directories."""

    dirs: Sequence[str] = DEFAULT_TOOLKIT_DIRS
    kind: str = "nvidia.com/gpu"
    strategy: str = "uuid"
    _files: dict[str, _File] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.strategy not in TOOLKIT_STRATEGIES:
            raise ValueError(f"toolkit device-name strategy {self.strategy!r} is not one of "
                             f"{', '.join(TOOLKIT_STRATEGIES)}")

    def _spec_files(self) -> list[str]:
        out = []
        for d in self.dirs:
            try:
                names = sorted(os.listdir(d))
            except FileNotFoundError:
                continue
            except OSError as e:
                raise ToolkitSpecError(f"CDI spec directory {d} cannot be read ({e.strerror})") from None
            out += [os.path.join(d, n) for n in names if n.endswith((".json", ".yaml", ".yml"))]
        return out

    def _read(self, path: str) -> _File | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None  # removed between the listing and now
        stamp = (st.st_mtime_ns, st.st_size)
        known = self._files.get(path)
        if known is not None and known.stamp == stamp:
            return known
        if st.st_size > MAX_SPEC_BYTES:
            log.warning("CDI spec file too large, skipped", extra={"path": path, "bytes": st.st_size})
            return None
        try:
            with open(path, encoding="utf-8") as f:
                data: Any = yaml.safe_load(f)  # JSON is YAML: one parser for both
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            # Not fatal: a spec of another vendor may be broken; ours is judged by whether its names resolve.
            log.warning("CDI spec file unreadable, skipped", extra={"path": path, "reason": str(e)[:200]})
            return None
        if not isinstance(data, dict):
            return None
        names = frozenset(str(d.get("name")) for d in data.get("devices") or [] if isinstance(d, dict))
        got = _File(stamp, str(data.get("kind", "")), names)
        self._files[path] = got
        return got

    def check(self, d: Device, name: str) -> str | None:
        """The device plugin's check of an `external` name (`<kind>=<name>`, the device's UUID): None when a
        spec of our kind defines it or no spec of our kind is readable here (nothing to check against: the
        runtime decides, as before); else why not, with the fix."""
        files, names = self.names()
        if not files or name in names:
            return None
        return (f"{self.kind}={name} ({d.name}) is not defined in {', '.join(files)}: the spec was generated before "
                f"this device existed or without the uuid device-name strategy; "
                f"{_fix(self.kind, self.dirs, 'uuid')}")

    def names(self) -> tuple[list[str], frozenset[str]]:
        """(the files of our kind, every device name they define)."""
        files: list[str] = []
        names: set[str] = set()
        seen = self._spec_files()
        for path in seen:
            got = self._read(path)
            if got is not None and got.kind == self.kind:
                files.append(path)
                names |= got.names
        for gone in set(self._files) - set(seen):
            del self._files[gone]
        return files, frozenset(names)

    def resolve(self, devices: Iterable[Device]) -> list[list[str]]:
        """Per device, the toolkit's qualified CDI names (`nvidia.com/gpu=<name>`; none for a NIC).

        Raises ToolkitSpecError, naming the device, the files read and the fix, when there is no
        spec of the kind or it lacks a device's name.
        """
        devices = list(devices)
        if not any(d.kind in (DeviceKind.GPU, DeviceKind.MIG) for d in devices):
            return [[] for _ in devices]
        files, names = self.names()
        where = ", ".join(self.dirs)
        if not files:
            raise ToolkitSpecError(f"no CDI spec of kind {self.kind} (NVIDIA's container toolkit) in {where}, so the "
                                   f"container would start without the driver's libraries: "
                                   f"{_fix(self.kind, self.dirs, self.strategy)}")
        out: list[list[str]] = []
        for d in devices:
            if d.kind not in (DeviceKind.GPU, DeviceKind.MIG):
                out.append([])
                continue
            name = toolkit_name(d, self.strategy)
            if name not in names:
                raise ToolkitSpecError(
                    f"{self.kind}={name} ({d.name}) is not defined in {', '.join(files)}: the spec was generated "
                    f"before this device existed or without the {self.strategy} device-name strategy; "
                    f"{_fix(self.kind, self.dirs, self.strategy)}")
            out.append([f"{self.kind}={name}"])
        return out
