"""Creating and destroying MIG instances (dynamic MIG): through NVML, or in a simulated node's state file.

Why two backends behind one interface: the DRA driver creates a MIG device when a claim for one
of a partitionable GPU's placements is prepared, and destroys it at unprepare. On a GPU node
that is NVML (`NvmlMigBackend`); a simulated node has no NVML, so `SimulatedMigBackend` keeps
the instances in a JSON file that tests (and users) can read, checked against the same profile
table (`plugin.sources.mig_profiles`) the NVML double uses.

The calls (NVML's MIG management API; the GPU must already be in MIG mode):
- possible placements: `nvmlDeviceGetGpuInstanceProfileInfo` (profile index -> profile ID),
  `nvmlDeviceGetGpuInstancePossiblePlacements` (C `..._v2`: start/size of each placement);
- create: `nvmlDeviceCreateGpuInstanceWithPlacement`, then the compute instance spanning it,
  `nvmlGpuInstanceGetComputeInstanceProfileInfo` + `nvmlGpuInstanceCreateComputeInstance`;
  the MIG device's UUID is then found among `nvmlDeviceGetMigDeviceHandleByIndex`;
- existing instances: `nvmlDeviceGetGpuInstanceById` for each ID, `nvmlGpuInstanceGetInfo`
  (profile and placement);
- destroy: `nvmlComputeInstanceDestroy`, then `nvmlGpuInstanceDestroy`; an instance that is not
  there any more counts as destroyed (unprepare is repeated after crashes).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import uuid as uuidlib
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from allocator.topology import Device

from ...atomic_file import replace_file
from ...sources.mig_profiles import COMPUTE_SLICES, MEMORY_SLICES, GpuMigTable, Placement, table_for
from ...sources.nvml_mig import ProfileCalls

log = logging.getLogger(__name__)

#: GPU instance IDs NVML uses on an A100/H100 (at most 7 instances at once; IDs up to 14).
MAX_GPU_INSTANCE_ID = 14


class MigError(Exception):
    """A MIG instance cannot be created or destroyed; the message says which and why."""


@dataclass(frozen=True)
class MigInstance:
    """One MIG device made of a GPU instance and the one compute instance spanning it."""

    gpu: str  # the parent GPU's device name in the topology (GPU0)
    profile: str
    start: int
    size: int
    gi: int
    ci: int
    uuid: str


class MigBackend(Protocol):
    def placements(self, gpu: Device) -> list[Placement]:
        """Every placement the GPU allows (also those taken now): what the slices publish."""
        ...

    def instances(self, gpu: Device) -> list[MigInstance]:
        """The MIG instances on the GPU now."""
        ...

    def create(self, gpu: Device, placement: Placement) -> MigInstance: ...

    def destroy(self, gpu: Device, gi: int, ci: int) -> None:
        """Destroy the instance; one that is not there is not an error."""
        ...


def _table(gpu: Device) -> GpuMigTable:
    table = table_for(gpu.model, gpu.memory_mib)
    if table is None:
        raise MigError(f"{gpu.name} ({gpu.model or 'unknown model'}, {gpu.memory_mib or '?'} MiB) has no MIG "
                       "profile table: dynamic MIG knows the 80 GB A100 and H100")
    return table


class SimulatedMigBackend:
    """MIG instances of a simulated node, kept in `state_path` (JSON: `{"gpus": {GPU name: [instance]}}`).

    Callers serialise changes (the DRA driver calls it under its checkpoint lock); each change
    rewrites the file atomically, so a reader never sees half a change.
    """

    def __init__(self, state_path: str):
        self.state_path = state_path

    def _load(self) -> dict[str, list[MigInstance]]:
        try:
            with open(self.state_path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise MigError(f"simulated MIG state {self.state_path}: unreadable ({e}); remove it only when no pod "
                           "on this node uses a MIG claim") from None
        return {g: [MigInstance(**i) for i in items] for g, items in (data.get("gpus") or {}).items()}

    def _save(self, state: dict[str, list[MigInstance]]) -> None:
        body = {"version": 1, "gpus": {g: [asdict(i) for i in items] for g, items in sorted(state.items()) if items}}
        replace_file(self.state_path, json.dumps(body, indent=1, sort_keys=True) + "\n", mode=0o644,
                     prefix=".mig-state-", durable=True)

    def placements(self, gpu: Device) -> list[Placement]:
        return _table(gpu).placements()

    def instances(self, gpu: Device) -> list[MigInstance]:
        return list(self._load().get(gpu.name, []))

    def create(self, gpu: Device, placement: Placement) -> MigInstance:
        table = _table(gpu)
        profile = table.profile(placement.profile.name)
        if profile is None or placement.start not in profile.starts:
            raise MigError(f"{gpu.name}: no MIG placement {placement.profile.name} at slice {placement.start}")
        state = self._load()
        have = state.get(gpu.name, [])
        for i in have:
            other = table.profile(i.profile)
            if other is not None and placement.overlaps(Placement(other, i.start)):
                raise MigError(f"{gpu.name}: placement {placement.profile.name}@{placement.start} overlaps "
                               f"{i.profile}@{i.start} (GPU instance {i.gi}): insufficient resources")
        used = sum(p.compute_slices for p in (table.profile(i.profile) for i in have) if p is not None)
        if used + profile.compute_slices > COMPUTE_SLICES:
            raise MigError(f"{gpu.name}: {profile.name} needs {profile.compute_slices} compute slices, "
                           f"{COMPUTE_SLICES - used} are free: insufficient resources")
        gi = min(set(range(1, MAX_GPU_INSTANCE_ID + 1)) - {i.gi for i in have})
        made = MigInstance(gpu=gpu.name, profile=profile.name, start=placement.start, size=profile.memory_slices,
                           gi=gi, ci=0, uuid=f"MIG-{uuidlib.uuid4()}")
        state[gpu.name] = [*have, made]
        self._save(state)
        return made

    def destroy(self, gpu: Device, gi: int, ci: int) -> None:
        state = self._load()
        have = state.get(gpu.name, [])
        left = [i for i in have if (i.gi, i.ci) != (gi, ci)]
        if len(left) != len(have):
            state[gpu.name] = left
            self._save(state)


class NvmlMigBackend:
    """MIG instances through NVML (`nvml` is the pynvml module, or its test double)."""

    def __init__(self, nvml: Any):
        self.nvml = nvml
        self._initialised = False
        #: Profile-info calls in the newest version the driver has (R470 lacks the versioned ones).
        self.calls = ProfileCalls(nvml)

    def _handle(self, gpu: Device) -> Any:
        if not self._initialised:
            # Our own reference (NVML counts nvmlInit calls): discovery shuts its own down after reading the node.
            try:
                self.nvml.nvmlInit()
            except self.nvml.NVMLError as e:
                raise MigError(f"{gpu.name}: NVML cannot be initialised: {e}") from None
            self._initialised = True
        if gpu.uuid:
            return self.nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
        return self.nvml.nvmlDeviceGetHandleByIndex(gpu.index)

    def _err(self, gpu: Device, what: str, e: Exception) -> MigError:
        nv = self.nvml
        # pynvml's own text needs the loaded library ("NVML Error with code 23" otherwise): say it in words.
        words = {getattr(nv, "NVML_ERROR_INSUFFICIENT_RESOURCES", 23): "insufficient resources (the placement "
                 "overlaps an instance on the GPU, or its compute slices are taken)",
                 getattr(nv, "NVML_ERROR_NO_PERMISSION", 4): "no permission (the driver needs CAP_SYS_ADMIN)",
                 getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3): "not supported (is the GPU in MIG mode?)",
                 getattr(nv, "NVML_ERROR_IN_USE", 19): "in use"}
        return MigError(f"{gpu.name}: {what}: NVML says {words.get(getattr(e, 'value', None), str(e))}")

    def placements(self, gpu: Device) -> list[Placement]:
        """The table's placements NVML confirms (`nvmlDeviceGetGpuInstancePossiblePlacements`)."""
        table = _table(gpu)
        nv = self.nvml
        handle = self._handle(gpu)
        out: list[Placement] = []
        for profile in table.profiles:
            try:
                info = self.calls("nvmlDeviceGetGpuInstanceProfileInfo", handle, profile.gi_profile)
                slots = (nv.c_nvmlGpuInstancePlacement_t * MEMORY_SLICES)()
                count = ctypes.c_uint(MEMORY_SLICES)
                nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, slots, ctypes.byref(count))
            except nv.NVMLError as e:
                log.info("MIG profile not offered by the GPU", extra={"gpu": gpu.name, "profile": profile.name,
                                                                      "reason": str(e)})
                continue
            starts = {slots[i].start for i in range(count.value) if slots[i].size == profile.memory_slices}
            out += [Placement(profile, s) for s in profile.starts if s in starts]
        return out

    def instances(self, gpu: Device) -> list[MigInstance]:
        table = _table(gpu)
        nv = self.nvml
        handle = self._handle(gpu)
        uuids = self._mig_uuids(handle)
        out = []
        for gi_id in range(MAX_GPU_INSTANCE_ID + 1):
            try:
                gi = nv.nvmlDeviceGetGpuInstanceById(handle, gi_id)
                info = nv.nvmlGpuInstanceGetInfo(gi)
            except nv.NVMLError:
                continue  # no instance with this ID
            profile = self._profile_by_id(handle, table, info.profileId)
            ci = next((c for (g, c) in uuids if g == gi_id), 0)
            out.append(MigInstance(gpu=gpu.name, profile=profile.name if profile else f"id{info.profileId}",
                                   start=int(info.placement.start), size=int(info.placement.size), gi=gi_id, ci=ci,
                                   uuid=uuids.get((gi_id, ci), "")))
        return out

    def _profile_by_id(self, handle: Any, table: GpuMigTable, profile_id: int) -> Any:
        for p in table.profiles:
            try:
                if self.calls("nvmlDeviceGetGpuInstanceProfileInfo", handle, p.gi_profile).id == profile_id:
                    return p
            except self.nvml.NVMLError:
                continue
        return None

    def _mig_uuids(self, handle: Any) -> dict[tuple[int, int], str]:
        nv = self.nvml
        out = {}
        for slot in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                u = nv.nvmlDeviceGetUUID(mig)
                out[(int(nv.nvmlDeviceGetGpuInstanceId(mig)), int(nv.nvmlDeviceGetComputeInstanceId(mig)))] = (
                    u.decode() if isinstance(u, bytes) else str(u))
            except nv.NVMLError:
                continue
        return out

    def create(self, gpu: Device, placement: Placement) -> MigInstance:
        nv = self.nvml
        handle = self._handle(gpu)
        p = placement.profile
        try:
            info = self.calls("nvmlDeviceGetGpuInstanceProfileInfo", handle, p.gi_profile)
            where = nv.c_nvmlGpuInstancePlacement_t(placement.start, p.memory_slices)
            gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, ctypes.byref(where))
        except nv.NVMLError as e:
            raise self._err(gpu, f"creating GPU instance {p.name} at slice {placement.start}", e) from None
        try:
            gi_id = int(nv.nvmlGpuInstanceGetInfo(gi).id)
            ci_info = self.calls("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, p.ci_profile, 0)
            ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            ci_id = int(nv.nvmlComputeInstanceGetInfo(ci).id)
        except nv.NVMLError as e:
            try:  # no half-made device left behind
                nv.nvmlGpuInstanceDestroy(gi)
            except nv.NVMLError:
                log.error("GPU instance left after a failed compute instance", extra={"gpu": gpu.name})
            raise self._err(gpu, f"creating the compute instance of {p.name} at slice {placement.start}", e) from None
        uuid = self._mig_uuids(handle).get((gi_id, ci_id), "")
        return MigInstance(gpu=gpu.name, profile=p.name, start=placement.start, size=p.memory_slices,
                           gi=gi_id, ci=ci_id, uuid=uuid)

    def destroy(self, gpu: Device, gi: int, ci: int) -> None:
        nv = self.nvml
        gone = {getattr(nv, "NVML_ERROR_NOT_FOUND", 6), getattr(nv, "NVML_ERROR_INVALID_ARGUMENT", 2)}
        handle = self._handle(gpu)
        try:
            gi_h = nv.nvmlDeviceGetGpuInstanceById(handle, gi)
        except nv.NVMLError as e:
            if getattr(e, "value", None) in gone:
                return
            raise self._err(gpu, f"finding GPU instance {gi}", e) from None
        try:
            nv.nvmlComputeInstanceDestroy(nv.nvmlGpuInstanceGetComputeInstanceById(gi_h, ci))
        except nv.NVMLError as e:
            if getattr(e, "value", None) not in gone:
                raise self._err(gpu, f"destroying compute instance {gi}/{ci}", e) from None
        try:
            nv.nvmlGpuInstanceDestroy(gi_h)
        except nv.NVMLError as e:
            if getattr(e, "value", None) not in gone:
                raise self._err(gpu, f"destroying GPU instance {gi}", e) from None


def default_state_path(plugin_dir: str) -> str:
    return os.path.join(plugin_dir, "simulated-mig.json")
