"""CDI spec files for prepared claims: the interface the DRA side needs, and the writer behind it.

The specs are built and written by the product's one CDI layer (`plugin.cdi`):
`claim_spec` gives each device the same device nodes the device-plugin side
would inject for it, and `CdiSpecWriter` writes atomically (temporary file,
fsync, rename, directory fsync). Two calls are all the driver needs:

- `write_claim_spec(claim_uid, devices)` writes (or atomically replaces) one
  spec file for the claim and returns, per device and in the same order, the
  fully qualified CDI device IDs (`vendor/class=name`) the container runtime
  must inject;
- `remove_claim_spec(claim_uid)` removes it; removing one that is not there
  is not an error (unprepare must be idempotent).

One spec per claim (not per device), named as the CDI library names
"transient" specs (`<vendor>-<class>_<claim UID>.json`), because a claim's
devices appear and disappear together; device names carry the claim UID
(`<uid>-gpu-0`), so two claims never define the same name within the kind
`<driver>/claim`. The device-plugin side's own specs (`topo-dp.*`) are never
touched, nor are these touched by it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from typing import Protocol

from allocator.topology import Device, DeviceKind

from ..cdi import CdiOptions, CdiSpecWriter, claim_spec

log = logging.getLogger(__name__)

_ENV_BAD = re.compile(r"[^A-Za-z0-9_]")


class ClaimCdi(Protocol):
    def write_claim_spec(self, claim_uid: str, devices: Sequence[tuple[str, Device]]) -> list[list[str]]:
        """Write the claim's spec; `devices` are (slice device name, Device); returns CDI IDs per device."""
        ...

    def remove_claim_spec(self, claim_uid: str) -> None: ...


def device_env(name: str, d: Device) -> list[str]:
    """What a container learns about each of its claim's devices (GPU UUID, NIC PCI address and netdev).

    A GPU's value is the `uuid` its slice publishes: `d` comes from `slices.device_table`, which
    gives every GPU that UUID (`plugin.identity`), also a simulated one without its own.
    """
    key = _ENV_BAD.sub("_", name).upper()
    if d.kind in (DeviceKind.GPU, DeviceKind.MIG):
        if not d.uuid:
            raise ValueError(f"device {name} ({d.name}) has no UUID: take it from slices.device_table")
        return [f"TOPO_DEV_{key}={d.uuid}"]
    env = [f"TOPO_DEV_{key}={d.pci_bus_id or d.name}"]
    if d.attributes.get("netdev"):
        env.append(f"TOPO_DEV_{key}_NETDEV={d.attributes['netdev']}")
    return env


class ClaimSpecs:
    """Writes `<cdi_root>/<driver>-claim_<uid>.json` (kind `<driver>/claim`) through `plugin.cdi`."""

    def __init__(self, cdi_root: str, driver: str = "topo.dev", options: CdiOptions | None = None):
        self.kind = f"{driver}/claim"
        self._prefix = f"{driver}-claim_"
        # The writer only accepts names starting with "<its prefix>.": the driver's first label.
        self.writer = CdiSpecWriter(cdi_root, vendor_prefix=driver.split(".", 1)[0])
        self.options = options or CdiOptions(spec_dir=cdi_root)

    def file_name(self, claim_uid: str) -> str:
        return f"{self._prefix}{claim_uid}.json"

    def spec_path(self, claim_uid: str) -> str:
        return os.path.join(self.writer.directory, self.file_name(claim_uid))

    def write_claim_spec(self, claim_uid: str, devices: Sequence[tuple[str, Device]]) -> list[list[str]]:
        named = [(f"{claim_uid}-{name}", d) for name, d in devices]
        spec = claim_spec(self.kind, named, self.options, [device_env(name, d) for name, d in devices])
        self.writer.write(spec, self.file_name(claim_uid))
        return [[spec.qualified(n)] for n, _ in named]

    def remove_claim_spec(self, claim_uid: str) -> None:
        self.writer.remove(self.file_name(claim_uid))

    def claim_uids(self) -> list[str]:
        """Claims that have a spec file here (to find specs no checkpoint entry owns)."""
        return [n[len(self._prefix):-len(".json")] for n in self.writer.owned_files()
                if n.startswith(self._prefix) and n.endswith(".json")]
