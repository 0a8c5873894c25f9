"""MIG devices through NVML: which GPUs are in MIG mode, their MIG devices, profiles and device nodes.

Why this way (NVIDIA's plugin and go-nvlib are the reference; we read them,
this is our own code):

- MIG mode: `nvmlDeviceGetMigMode` (current mode); NOT_SUPPORTED means the GPU
  cannot do MIG.
- MIG devices: `nvmlDeviceGetMaxMigDeviceCount`, then
  `nvmlDeviceGetMigDeviceHandleByIndex` for every slot (a NOT_FOUND slot is
  empty); each has a UUID (`MIG-…`), a GPU instance and a compute instance ID
  and a memory size (`nvmlDeviceGetAttributes`).
- Profile name (`1g.10gb`, `1c.3g.40gb`, `1g.10gb+me`): the GPU instance's
  profile ID (`nvmlDeviceGetGpuInstanceById` → `nvmlGpuInstanceGetInfo`) is
  looked up among the GPU's GPU-instance profiles
  (`nvmlDeviceGetGpuInstanceProfileInfo`), the compute instance's among the
  GPU instance's compute-instance profiles; their profile *indexes* give the
  slice counts and attributes, and the memory the `gb` part, rounded as
  go-nvlib does (in eighths of the GPU, times the GPU's memory in whole GiB).
- Device nodes: besides the parent's `/dev/nvidia<minor>`, a MIG device
  needs the access nodes of its GPU instance and compute instance,
  `/dev/nvidia-caps/nvidia-cap<N>`. N is read from
  `<proc>/driver/nvidia/capabilities/gpu<minor>/mig/gi<gi>[/ci<ci>]/access`
  (`DeviceFileMinor:`), else from `<proc>/driver/nvidia-caps/mig-minors`
  (the table NVIDIA's plugin reads); the node's major from `<proc>/devices`
  (`nvidia-caps`), so a CDI spec can describe the node.

- Profile-info calls by driver age: pynvml's `...ProfileInfo(..., version=2)`
  calls the versioned C functions (`nvmlDeviceGetGpuInstanceProfileInfoV`,
  `nvmlGpuInstanceGetComputeInstanceProfileInfoV`), which NVML has only since
  CUDA 11.6 (driver R510); the R450/R470 drivers have only the unversioned
  ones (`version=1`), which NVIDIA's plugin calls. We ask for the versioned
  call and, when the driver lacks it (FUNCTION_NOT_FOUND), use the unversioned
  one for the rest of the discovery. Only the profile `id` is read, which both
  versions carry.

A MIG device NVML cannot describe is skipped with an error log; the GPU is
still served whole under `--mig-strategy none`. A driver that lacks even the
unversioned call (older than the first MIG driver, R450) stops discovery with
`MigDriverError`, naming the call and the driver needed: its MIG devices would
otherwise vanish from every strategy without a word.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import replace
from typing import Any

from allocator.topology import Device, DeviceKind

from ..errors import RuntimeFailure

log = logging.getLogger(__name__)

#: The oldest driver branch with NVML's MIG calls (CUDA 11.0); the versioned profile calls came with R510.
MIN_MIG_DRIVER = "R450"
_VERSIONED_SINCE = "R510"
#: pynvml function -> (C function of version 2, C function of version 1).
_PROFILE_CALLS = {
    "nvmlDeviceGetGpuInstanceProfileInfo": ("nvmlDeviceGetGpuInstanceProfileInfoV",
                                            "nvmlDeviceGetGpuInstanceProfileInfo"),
    "nvmlGpuInstanceGetComputeInstanceProfileInfo": ("nvmlGpuInstanceGetComputeInstanceProfileInfoV",
                                                     "nvmlGpuInstanceGetComputeInstanceProfileInfo"),
}


class MigDriverError(RuntimeFailure):
    """The driver's NVML lacks a call MIG discovery needs (exit 1): the message names the call and the driver."""


class ProfileCalls:
    """Calls the profile-info functions in the newest version this driver has; one per discovery.

    Why remember: on an R470 driver every versioned call fails the same way, and a MIG node asks
    up to 27 of them per MIG device.
    """

    def __init__(self, nvml: Any):
        self.nvml = nvml
        #: pynvml function -> the version that works (2 until the driver says otherwise).
        self.version = dict.fromkeys(_PROFILE_CALLS, 2)

    def __call__(self, name: str, *args: Any) -> Any:
        nvml = self.nvml
        not_found = getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)
        while True:
            version = self.version[name]
            try:
                return getattr(nvml, name)(*args, version=version)
            except nvml.NVMLError as e:
                if getattr(e, "value", None) != not_found:
                    raise
            versioned, plain = _PROFILE_CALLS[name]
            if version == 1:
                raise MigDriverError(
                    f"nvml: the driver's NVML has neither {versioned} nor {plain}, which name MIG devices "
                    f"(fix: MIG needs NVIDIA driver {MIN_MIG_DRIVER} or later; update the driver, or turn MIG "
                    "mode off on this node's GPUs)")
            log.info("NVML lacks a versioned MIG call (driver older than %s); using the unversioned one",
                     _VERSIONED_SINCE, extra={"missing": versioned, "using": plain})
            self.version[name] = 1

#: GPU-instance profile index -> (GPU slices, attributes), as go-nvlib's `NewMigProfile`.
GI_PROFILES: dict[int, tuple[int, str]] = {
    0: (1, ""), 1: (2, ""), 2: (3, ""), 3: (4, ""), 4: (7, ""), 5: (8, ""), 6: (6, ""),
    7: (1, "+me"), 8: (2, "+me"), 9: (1, ""), 10: (1, "+gfx"), 11: (2, "+gfx"), 12: (4, "+gfx"),
    13: (1, "-me"), 14: (2, "-me"), 15: (1, "+me.all"), 16: (2, "+me.all"), 17: (3, "+gfx"),
}
#: Compute-instance profile index -> compute slices.
CI_PROFILES: dict[int, int] = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6, 7: 1, 8: 7}
_GI_COUNT = 18
_CI_COUNT = 9
_CI_ENGINE_COUNT = 1
#: NVIDIA's numbering of capability minors (/proc/driver/nvidia-caps/mig-minors): 1 config, 2 monitor,
#: then per GPU minor 15 GPU instances of 9 minors each (the GI's own, then CI 0..7).
_CAPS_PER_GI = 9
_GIS_PER_GPU = 15


def profile_name(gi_profile: int, ci_profile: int, mig_memory_mib: int, gpu_memory_bytes: int) -> str:
    """The NVIDIA profile name of a MIG device (`3g.40gb`, `1c.3g.40gb`, `1g.10gb+me`)."""
    g, attrs = GI_PROFILES[gi_profile]
    c = CI_PROFILES[ci_profile]
    gb = memory_gb(mig_memory_mib, gpu_memory_bytes)
    head = f"{g}g.{gb}gb" if c == g else f"{c}c.{g}g.{gb}gb"
    return head + attrs


def memory_gb(mig_memory_mib: int, gpu_memory_bytes: int) -> int:
    """The `gb` of a profile name: the MIG share in eighths (rounded up) times the GPU's whole GiB."""
    share = math.ceil(mig_memory_mib * 1024 * 1024 / gpu_memory_bytes * 8) / 8
    total_gb = -(-gpu_memory_bytes // (1 << 30))
    return math.floor(share * total_gb + 0.5)  # Go's math.Round: halves away from zero


def cap_minors(gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
    """NVIDIA's capability minors of a GPU instance and its compute instance (mig-minors numbering)."""
    base = 3 + gpu_minor * _GIS_PER_GPU * _CAPS_PER_GI + gi * _CAPS_PER_GI
    return base, base + 1 + ci


def caps_attribute(gi_minor: int, ci_minor: int) -> str:
    return f"/dev/nvidia-caps/nvidia-cap{gi_minor},/dev/nvidia-caps/nvidia-cap{ci_minor}"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


class CapsReader:
    """Capability device minors and the nvidia-caps major, read once per discovery from procfs."""

    def __init__(self, proc_root: str):
        self.proc_root = proc_root
        table = _read(os.path.join(proc_root, "driver", "nvidia-caps", "mig-minors")) or ""
        self.table = {k: int(v) for k, v in (line.split() for line in table.splitlines() if len(line.split()) == 2)
                      if v.isdigit()}
        devices = _read(os.path.join(proc_root, "devices")) or ""
        majors = [line.split()[0] for line in devices.splitlines() if line.split()[1:] == ["nvidia-caps"]]
        self.major = majors[0] if majors and majors[0].isdigit() else None
        #: A missing minor was logged (once per discovery).
        self.warned = False

    def minor(self, gpu_minor: int, gi: int, ci: int | None) -> int | None:
        rel = f"gpu{gpu_minor}/mig/gi{gi}" + (f"/ci{ci}" if ci is not None else "")
        text = _read(os.path.join(self.proc_root, "driver", "nvidia", "capabilities", rel, "access"))
        m = re.search(r"^DeviceFileMinor:\s*(\d+)\s*$", text or "", re.M)
        if m:
            return int(m.group(1))
        return self.table.get(f"gpu{gpu_minor}/gi{gi}" + (f"/ci{ci}" if ci is not None else "") + "/access")


def _profile(nvml: Any, calls: ProfileCalls, parent: Any, mig: Any, gi_id: int, ci_id: int, mem_mib: int,
             gpu_bytes: int) -> str:
    gi = nvml.nvmlDeviceGetGpuInstanceById(parent, gi_id)
    ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
    gi_profile_id = nvml.nvmlGpuInstanceGetInfo(gi).profileId
    ci_profile_id = nvml.nvmlComputeInstanceGetInfo(ci).profileId
    skip = {getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3), getattr(nvml, "NVML_ERROR_INVALID_ARGUMENT", 2)}
    for i in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", _GI_COUNT))):
        try:
            if calls("nvmlDeviceGetGpuInstanceProfileInfo", parent, i).id != gi_profile_id:
                continue
        except nvml.NVMLError as e:
            if getattr(e, "value", None) in skip:
                continue
            raise
        for j in range(int(getattr(nvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", _CI_COUNT))):
            for k in range(int(getattr(nvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT", _CI_ENGINE_COUNT))):
                try:
                    if calls("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, j, k).id != ci_profile_id:
                        continue
                except nvml.NVMLError as e:
                    if getattr(e, "value", None) in skip:
                        continue
                    raise
                return profile_name(i, j, mem_mib, gpu_bytes)
    raise ValueError(f"no GPU/compute instance profile matches IDs {gi_profile_id}/{ci_profile_id}")


def mig_mode(nvml: Any, handle: Any) -> bool:
    """Whether MIG mode is on (False for a GPU that cannot do MIG)."""
    try:
        current = nvml.nvmlDeviceGetMigMode(handle)[0]
    except nvml.NVMLError:
        return False
    return current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)


def discover_migs(nvml: Any, handle: Any, gpu: Device, caps: CapsReader,
                  calls: ProfileCalls | None = None) -> tuple[Device, list[Device]]:
    """(`gpu` marked with its MIG mode, its MIG devices) for one GPU; no MIG devices when MIG is off.

    `calls` is shared by the GPUs of one discovery (a new one when None). Raises MigDriverError
    when the driver's NVML lacks the calls that name MIG devices.
    """
    if not mig_mode(nvml, handle):
        return gpu, []
    calls = calls if calls is not None else ProfileCalls(nvml)
    gpu = replace(gpu, attributes={**gpu.attributes, "mig_mode": "enabled"})
    minor = gpu.minor if gpu.minor is not None else gpu.index
    not_found = getattr(nvml, "NVML_ERROR_NOT_FOUND", 6)
    try:
        gpu_bytes = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except nvml.NVMLError as e:
        log.error("MIG devices not read: NVML does not answer for the GPU", extra={"gpu": gpu.name, "reason": str(e)})
        return gpu, []
    out: list[Device] = []
    for slot in range(slots):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError as e:
            if getattr(e, "value", None) != not_found:
                log.error("MIG device skipped: NVML has no handle", extra={"gpu": gpu.name, "slot": slot,
                                                                             "reason": str(e)})
            continue
        try:
            uuid = nvml.nvmlDeviceGetUUID(mig)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
            ci_id = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
            mem_mib = int(nvml.nvmlDeviceGetAttributes(mig).memorySizeMB)
            profile = _profile(nvml, calls, handle, mig, gi_id, ci_id, mem_mib, gpu_bytes)
        except (nvml.NVMLError, ValueError, KeyError) as e:
            log.error("MIG device skipped: NVML cannot describe it", extra={"gpu": gpu.name, "slot": slot,
                                                                              "reason": str(e)})
            continue
        attrs = {"profile": profile, "gi": str(gi_id), "ci": str(ci_id), "index": f"{gpu.index}:{slot}"}
        gi_minor, ci_minor = caps.minor(minor, gi_id, None), caps.minor(minor, gi_id, ci_id)
        if gi_minor is not None and ci_minor is not None:
            attrs["caps"] = caps_attribute(gi_minor, ci_minor)
        elif not caps.warned:
            caps.warned = True
            log.warning("MIG capability device minors not found in procfs; MIG devices get no caps nodes",
                        extra={"gpu": gpu.name, "gi": gi_id, "ci": ci_id, "proc_root": caps.proc_root})
        if caps.major:
            attrs["caps_major"] = caps.major
        out.append(Device(
            name=f"{gpu.name}-mig{slot}", kind=DeviceKind.MIG, index=slot, numa=gpu.numa, health=gpu.health,
            uuid=uuid, pci_bus_id=gpu.pci_bus_id, model=gpu.model, minor=gpu.minor, memory_mib=mem_mib,
            attributes=attrs, parent=gpu.name,
        ))
    return gpu, out
