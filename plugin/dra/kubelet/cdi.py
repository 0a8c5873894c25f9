"""CDI spec files for prepared claims: the interface the DRA side needs, and the writer behind it.

The specs are built by the product's one CDI model (`plugin.model.cdi`) and written by its
one CDI file writer (`plugin.cdi_files`): `claim_spec` gives each device the same device nodes the device-plugin side
would inject for it, and `CdiSpecWriter` writes atomically (temporary file,
fsync, rename, directory fsync). Two calls are all the driver needs:

- `write_claim_spec(claim_uid, devices, settings)` writes (or atomically
  replaces) one spec file for the claim and returns, per device and in the same
  order, the fully qualified CDI device IDs (`vendor/class=name`) the container
  runtime must inject; `settings` adds env for what prepare set on a device
  (`TOPO_DEV_GPU_0_TIMESLICE=Short`, plugin/dra/claims/sharing.py);
- `remove_claim_spec(claim_uid)` removes it; removing one that is not there
  is not an error (unprepare must be idempotent).

With `--dra-toolkit-cdi uuid|index` each GPU's and MIG device's IDs also carry
the name NVIDIA's container toolkit gives it (`nvidia.com/gpu=<UUID>`), after
ours: the toolkit's spec brings the driver's libraries, `nvidia-smi`, firmware
and hooks, ours the exact device nodes and our env (and NICs). The names are
resolved against the toolkit's spec files before our spec is written; a
missing spec or name fails the claim (`ToolkitSpecError`, with the
`nvidia-ctk cdi generate` command that fixes it) and nothing is written.

One spec per claim (not per device), named as the CDI library names
"transient" specs (`<vendor>-<class>_<claim UID>.json`), because a claim's
devices appear and disappear together; device names carry the claim UID
(`<uid>-gpu-0`), so two claims never define the same name within the kind
`<driver>/claim`. The device-plugin side's own specs (`topo-dp.*`) are never
touched, nor are these touched by it.

Errors, by kind (issue 19: each came back as "internal error" with a traceback):
- `BadClaimUid`: the claim UID cannot name a file (too long, a path, odd
  characters); the request is bad, the claim is refused, nothing is touched.
  The API server only ever issues UUIDs (36 characters), so the rule below
  refuses no real claim.
- `CdiDirError`: the node's CDI directory is unusable (replaced by a file,
  read-only, full); the message gives the reason and the fix. At start it is
  a `RuntimeFailure` (exit 1 with the fix).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from allocator.pairing import pair_weight
from allocator.topology import Device, DeviceKind, NodeTopology

from ...cdi_files.writer import CdiSpecWriter, CdiWriteError
from ...model.cdi import CdiOptions, claim_spec
from ...model.cdi.spec import CdiDevice, CdiSpec, DeviceNode, Edits
from ...model.cdi.toolkit import ToolkitSpecs
from ...model.nccl_env import nccl_env
from ...errors import RuntimeFailure, shorten

log = logging.getLogger(__name__)

_ENV_BAD = re.compile(r"[^A-Za-z0-9_]")
#: A claim UID names files: letters, digits, '-', '_' and '.', not first (no hidden names, no "..").
_UID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: Far above a Kubernetes UID (a 36-character UUID), far below a file name's 255 bytes with our prefix.
MAX_CLAIM_UID = 128


class BadClaimUid(ValueError):
    """The kubelet asked about a claim whose UID cannot name a CDI spec file: the request is refused."""


class CdiDirError(RuntimeFailure):
    """The node's CDI spec directory cannot be used; the message has the reason and the fix."""


def check_claim_uid(uid: str) -> None:
    """Raise `BadClaimUid` unless `uid` can name the claim's spec file (see the module doc)."""
    if len(uid) > MAX_CLAIM_UID:
        raise BadClaimUid(f"claim UID {shorten(uid, 60)} is {len(uid)} characters long; a Kubernetes UID has 36 "
                          f"and this driver accepts at most {MAX_CLAIM_UID} (it names the claim's CDI spec file)")
    if not _UID_RE.match(uid):
        raise BadClaimUid(f"claim UID {shorten(uid, 60)} is not a Kubernetes UID: use letters, digits, '-', '_' "
                          "or '.', not first (it names the claim's CDI spec file)")


def _dir_error(e: CdiWriteError) -> CdiDirError:
    return CdiDirError(f"{e} (fix: {e.fix})")


class ClaimCdi(Protocol):
    def write_claim_spec(self, claim_uid: str, devices: Sequence[tuple[str, Device]],
                         settings: Mapping[str, Mapping[str, str]] | None = None,
                         edits: Mapping[str, Edits] | None = None,
                         channels: Sequence[tuple[str, DeviceNode]] = ()) -> list[list[str]]:
        """Write the claim's spec; `devices` are (slice device name, Device); `settings` adds env per device
        ({name: {suffix: value}} -> `TOPO_DEV_<NAME>_<SUFFIX>=value`), `edits` env and mounts as they are
        (MPS: `plugin.dra.claims.mps`); returns CDI IDs per device. A claim with IMEX channels is also given
        `channels=[(slice device name, DeviceNode)]`, whose IDs follow."""
        ...

    def remove_claim_spec(self, claim_uid: str) -> None: ...


def device_env(name: str, d: Device) -> list[str]:
    """What a container learns about each of its claim's devices (GPU UUID, NIC PCI address and netdev).

    A GPU's value is the `uuid` its slice publishes: `d` comes from `slices.device_table`, which
    gives every GPU that UUID (`plugin.model.identity`), also a simulated one without its own.
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


def setting_env(name: str, settings: Mapping[str, str]) -> list[str]:
    """Env entries for what prepare set on a device (e.g. its time-slice): `TOPO_DEV_<NAME>_<SUFFIX>=value`."""
    key = _ENV_BAD.sub("_", name).upper()
    return [f"TOPO_DEV_{key}_{_ENV_BAD.sub('_', k).upper()}={v}" for k, v in sorted(settings.items())]


class ClaimSpecs:
    """Writes `<cdi_root>/<driver>-claim_<uid>.json` (kind `<driver>/claim`) through `plugin.cdi_files`."""

    def __init__(self, cdi_root: str, driver: str = "topo.dev", options: CdiOptions | None = None,
                 nccl_topology: Callable[[], NodeTopology] | None = None, toolkit: ToolkitSpecs | None = None):
        self.kind = f"{driver}/claim"
        #: With `--nccl-env`: the node's topology, whose GPU–NIC pairing weights order the claim's NCCL hint.
        self.nccl_topology = nccl_topology
        self._prefix = f"{driver}-claim_"
        # The writer only accepts names starting with "<its prefix>.": the driver's first label.
        self.writer = CdiSpecWriter(cdi_root, vendor_prefix=driver.split(".", 1)[0])
        self.options = options or CdiOptions(spec_dir=cdi_root)
        #: NVIDIA's toolkit's spec, whose names go beside ours (None: our spec alone).
        self.toolkit = toolkit

    def file_name(self, claim_uid: str) -> str:
        return f"{self._prefix}{claim_uid}.json"

    def spec_path(self, claim_uid: str) -> str:
        return os.path.join(self.writer.directory, self.file_name(claim_uid))

    def write_claim_spec(self, claim_uid: str, devices: Sequence[tuple[str, Device]],
                         settings: Mapping[str, Mapping[str, str]] | None = None,
                         edits: Mapping[str, Edits] | None = None,
                         channels: Sequence[tuple[str, DeviceNode]] = ()) -> list[list[str]]:
        check_claim_uid(claim_uid)
        # Before anything is written: a claim the toolkit's spec cannot serve leaves nothing behind.
        toolkit = self.toolkit.resolve(d for _, d in devices) if self.toolkit else [[] for _ in devices]
        named = [(f"{claim_uid}-{name}", d) for name, d in devices]
        extra_edits = edits or {}
        env = [device_env(name, d) + setting_env(name, (settings or {}).get(name, {}))
               + list(extra_edits[name].env if name in extra_edits else ()) for name, d in devices]
        mounts = [extra_edits[name].mounts if name in extra_edits else () for name, _ in devices]
        # IMEX channels: their device node alone (a claim may hold channels and nothing else).
        extra = tuple(CdiDevice(f"{claim_uid}-{name}", Edits((node,))) for name, node in channels)
        if named:
            spec = claim_spec(self.kind, named, self.options, env, self.claim_env([d for _, d in devices]), mounts)
            spec = CdiSpec(spec.kind, spec.devices + extra, spec.edits) if extra else spec
        else:
            spec = CdiSpec(self.kind, extra)
        try:
            self.writer.write(spec, self.file_name(claim_uid))
        except CdiWriteError as e:
            raise _dir_error(e) from None
        return ([[spec.qualified(n), *more] for (n, _), more in zip(named, toolkit)]
                + [[spec.qualified(d.name)] for d in extra])

    def claim_env(self, devices: Sequence[Device]) -> list[str]:
        """The NCCL hint of a claim's devices as `KEY=VALUE` (none without `nccl_topology`).

        The claim holds the GPUs and the NICs together, so its NICs are ordered by their GPU partners
        (`allocator.pairing.pair_weight`: the same `pcieSwitch` or complex first). A NIC's interface is
        named by its host netdev, the name it keeps in the pod unless the claim's configuration renames it.
        """
        if self.nccl_topology is None:
            return []
        topology = self.nccl_topology()
        gpus = [d for d in devices if d.kind is DeviceKind.GPU]
        nics = [d for d in devices if d.kind is DeviceKind.NIC]
        env = nccl_env(gpus, nics, lambda g, n: pair_weight(topology, g, n))
        return [f"{k}={v}" for k, v in env.items()]

    def remove_claim_spec(self, claim_uid: str) -> None:
        check_claim_uid(claim_uid)
        try:
            self.writer.remove(self.file_name(claim_uid))
        except CdiWriteError as e:
            raise _dir_error(e) from None

    def claim_uids(self) -> list[str]:
        """Claims that have a spec file here (to find specs no checkpoint entry owns). A file whose
        name holds no valid UID is not one this driver wrote, and is left alone."""
        try:
            names = self.writer.owned_files()
        except CdiWriteError as e:
            raise _dir_error(e) from None
        uids = [n[len(self._prefix):-len(".json")] for n in names
                if n.startswith(self._prefix) and n.endswith(".json")]
        return [u for u in uids if len(u) <= MAX_CLAIM_UID and _UID_RE.match(u)]
