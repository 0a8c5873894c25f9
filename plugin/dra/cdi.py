"""CDI spec files for prepared claims: the interface the DRA side needs, and a minimal writer.

Why an interface: the CDI spec builder and atomic writer of the sharing work
(plugin/cdi/) is written separately; the DRA driver only needs two calls, so
it depends on this protocol and ships a small writer of its own that can be
swapped for that one without touching the driver:

- `write_claim_spec(claim_uid, devices)` writes (or atomically replaces) one
  spec file for the claim and returns, per device and in the same order, the
  fully qualified CDI device IDs (`vendor/class=name`) the container runtime
  must inject;
- `remove_claim_spec(claim_uid)` removes it; removing one that is not there
  is not an error (unprepare must be idempotent).

One spec per claim (not per device) because containerd resolves CDI names
when the container starts: a claim's devices appear and disappear together,
and device names carry the claim UID so two claims never share a name.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from typing import Any, Protocol

from allocator.topology import Device, DeviceKind

CDI_VERSION = "0.6.0"
_ENV_BAD = re.compile(r"[^A-Za-z0-9_]")


class ClaimCdi(Protocol):
    def write_claim_spec(self, claim_uid: str, devices: Sequence[tuple[str, Device]]) -> list[list[str]]:
        """Write the claim's spec; `devices` are (slice device name, Device); returns CDI IDs per device."""
        ...

    def remove_claim_spec(self, claim_uid: str) -> None: ...


def _gpu_edits(d: Device) -> dict[str, Any]:
    nodes = [f"/dev/nvidia{d.minor}"] if d.minor is not None else []
    nodes += ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    return {
        "env": [f"TOPO_DEV_GPU_{d.index}_UUID={d.uuid or d.name}"],
        "deviceNodes": [{"path": p} for p in nodes],
    }


def _nic_edits(d: Device) -> dict[str, Any]:
    a = d.attributes
    nodes = [p for p in a.get("rdma_char_devices", "").split(",") if p]
    if a.get("vfio_device"):
        nodes += ["/dev/vfio/vfio", a["vfio_device"]]
    edits: dict[str, Any] = {"env": [f"TOPO_DEV_NIC_{_ENV_BAD.sub('_', d.name).upper()}={d.pci_bus_id or d.name}"]}
    if nodes:
        edits["deviceNodes"] = [{"path": p} for p in dict.fromkeys(nodes)]
    return edits


class MinimalClaimCdiWriter:
    """Writes `<cdi_root>/<vendor>-claim_<uid>.json` with kind `<vendor>/claim`.

    Device edits are the device nodes and one informative env variable per
    device; the full builder of plugin/cdi/ (mounts, hooks, MIG) replaces this.
    """

    def __init__(self, cdi_root: str, vendor: str = "topo.dev", cdi_class: str = "claim"):
        self.cdi_root = cdi_root
        self.kind = f"{vendor}/{cdi_class}"
        self._prefix = f"{vendor}-{cdi_class}_"

    def spec_path(self, claim_uid: str) -> str:
        return os.path.join(self.cdi_root, f"{self._prefix}{claim_uid}.json")

    def write_claim_spec(self, claim_uid: str, devices: Sequence[tuple[str, Device]]) -> list[list[str]]:
        entries, ids = [], []
        for name, d in devices:
            cdi_name = f"{claim_uid}-{name}"
            entries.append({"name": cdi_name, "containerEdits": _gpu_edits(d) if d.kind == DeviceKind.GPU
                            else _nic_edits(d)})
            ids.append([f"{self.kind}={cdi_name}"])
        spec = {"cdiVersion": CDI_VERSION, "kind": self.kind, "devices": entries}
        os.makedirs(self.cdi_root, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=self.cdi_root)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(spec, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.spec_path(claim_uid))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return ids

    def remove_claim_spec(self, claim_uid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.spec_path(claim_uid))
