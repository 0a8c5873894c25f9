"""What NVML says of a GPU's health beyond events: the driver's recovery action, pending repairs, resets, NVLinks.

Every call is optional: a driver without it (NOT_SUPPORTED, FUNCTION_NOT_FOUND,
pynvml without the function or constant) gives None for that fact, the older
rule applies (docs/gpu-discovery.md "Supported drivers"), and it is logged once
per call and process, not per GPU and poll. A GPU that is lost (GPU_IS_LOST, or
no handle) reads `answers=False`.

- Recovery action: `nvmlDeviceGetFieldValues` with field
  NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230; R550-era drivers and newer), values
  0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, 5 recover
  IMEX domain, 6 bus reset, 7 system reboot. A field answered with a non-success
  `nvmlReturn` counts as absent.
- Pending repairs: `nvmlDeviceGetRemappedRows` (Ampere and newer: the pending and
  failure flags) and `nvmlDeviceGetRetiredPagesPendingStatus` (page retirement,
  older GPUs).
- Reset detection where the field is absent: volatile uncorrectable ECC counts
  (`nvmlDeviceGetTotalEccErrors`, volatile; a reset sets them to zero), plus what
  `policy.observe` derives from pending flags clearing and a lost GPU coming back.
- The node's boot ID: `<proc_root>/sys/kernel/random/boot_id`.
- NVLink states: `nvmlDeviceGetNvLinkState` per link, the set of active links.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from .policy import Evidence

log = logging.getLogger(__name__)

__all__ = ["EvidenceReader", "read_boot_id"]

RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS
_ABSENT_NAMES = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT")
_LOST_NAMES = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_NOT_FOUND")


def read_boot_id(proc_root: str = "/proc") -> str | None:
    """The kernel's boot ID (a new one after each boot), None where it cannot be read."""
    try:
        with open(os.path.join(proc_root, "sys", "kernel", "random", "boot_id"), encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


class EvidenceReader:
    """Reads `Evidence` through an NVML module (pynvml or the test double); thread-safe, logs absences once."""

    def __init__(self, nvml: Any):
        self.nvml = nvml
        self._absent_logged: set[str] = set()
        self._lock = threading.Lock()
        codes = [getattr(nvml, n, None) for n in _ABSENT_NAMES]
        self._absent = {c for c in codes if c is not None}
        self._lost = {c for c in (getattr(nvml, n, None) for n in _LOST_NAMES) if c is not None}

    # -- helpers ---------------------------------------------------------------
    def _missing(self, call: str, why: str) -> None:
        with self._lock:
            if call in self._absent_logged:
                return
            self._absent_logged.add(call)
        log.info("this NVML driver cannot say; the older health rule applies for it",
                 extra={"call": call, "reason": why})

    def _call(self, name: str, *args: Any) -> tuple[bool, Any]:
        """(ok, value); (False, None) and one log line when the driver lacks the call; raises on loss."""
        fn = getattr(self.nvml, name, None)
        if fn is None:
            self._missing(name, "the NVML bindings have no such function")
            return False, None
        try:
            return True, fn(*args)
        except self.nvml.NVMLError as e:
            code = getattr(e, "value", None)
            if code in self._lost:
                raise
            self._missing(name, str(e))
            return False, None

    # -- the facts ---------------------------------------------------------------
    def recovery_action(self, handle: Any) -> int | None:
        ok, values = self._call("nvmlDeviceGetFieldValues", handle, [RECOVERY_ACTION_FIELD])
        if not ok or not values:
            return None
        v = values[0]
        if int(getattr(v, "nvmlReturn", 0)) != 0:
            self._missing("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", f"field answered nvmlReturn {v.nvmlReturn}")
            return None
        value = getattr(v, "value", None)
        return int(getattr(value, "uiVal", value))  # type: ignore[arg-type]  # a c_nvmlValue_t or a plain int

    def remapped_rows(self, handle: Any) -> tuple[bool | None, bool | None]:
        ok, rows = self._call("nvmlDeviceGetRemappedRows", handle)
        if not ok:
            return None, None
        return bool(rows[2]), bool(rows[3])

    def retired_pending(self, handle: Any) -> bool | None:
        ok, value = self._call("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        return None if not ok else bool(value)

    def volatile_dbe(self, handle: Any) -> int | None:
        uncorrected = getattr(self.nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        volatile = getattr(self.nvml, "NVML_VOLATILE_ECC", 0)
        ok, value = self._call("nvmlDeviceGetTotalEccErrors", handle, uncorrected, volatile)
        return None if not ok else int(value)

    def read(self, uuid: str) -> Evidence:
        """Everything at once for the GPU with this UUID; `answers=False` when NVML cannot reach it."""
        nvml = self.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            nvml.nvmlDeviceGetMemoryInfo(handle)
            remap_pending, remap_failed = self.remapped_rows(handle)
            return Evidence(recovery_action=self.recovery_action(handle), remap_pending=remap_pending,
                            remap_failed=remap_failed, retired_pending=self.retired_pending(handle),
                            volatile_dbe=self.volatile_dbe(handle))
        except nvml.NVMLError:
            return Evidence(answers=False)

    def active_links(self, handle: Any) -> frozenset[int] | None:
        """The NVLinks NVML reports active (None: the GPU has no NVLink or the call is absent)."""
        enabled = getattr(self.nvml, "NVML_FEATURE_ENABLED", 1)
        fn = getattr(self.nvml, "nvmlDeviceGetNvLinkState", None)
        if fn is None:
            return None
        active: set[int] = set()
        for link in range(_MAX_LINKS):
            try:
                if fn(handle, link) == enabled:
                    active.add(link)
            except self.nvml.NVMLError as e:
                if getattr(e, "value", None) in self._lost:
                    raise
                if link == 0:
                    return None  # NOT_SUPPORTED on link 0: no NVLink at all
                continue  # past the GPU's last link, or a link this GPU does not have
        return frozenset(active)
