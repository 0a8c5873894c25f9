#!/usr/bin/env python3
"""Record what real NVML answers on a GPU machine, for tests/nvml/recorded/.

Why: the MIG code is tested against our NVML double; a recording from a real driver is what keeps
the double and our profile naming honest (tests/nvml/test_recorded_hardware.py). It only reads:
MIG mode is not changed, nothing is reset.

Usage (on the GPU machine; needs nvidia-ml-py, nothing else of the project):
    python3 scripts/nvml_probe.py [GPU_INDEX] > tests/nvml/recorded/<model>-driver-<major>.json

Where NVML cannot answer a call the recording needs (no driver, no such GPU) it prints one line
naming the call and NVML's error on stderr, writes nothing on stdout, and exits 1.
"""

from __future__ import annotations

import ctypes
import datetime
import json
import sys
from typing import Any

try:
    import pynvml as nvml
except ImportError:  # reported by main() in one line
    nvml = None


class ProbeError(Exception):
    """A call the recording cannot do without failed; the message names the call and NVML's error."""


def _must(fn: Any, *args: Any) -> Any:
    """The call's value; an NVML error becomes a `ProbeError` naming the call, the error code and its text."""
    try:
        return fn(*args)
    except nvml.NVMLError as e:
        names = [k for k in dir(nvml) if k.startswith("NVML_ERROR_") and getattr(nvml, k) == e.value]
        code = f"{names[0]} ({e.value})" if names else str(e.value)
        raise ProbeError(f"{fn.__name__} failed: {code}: {e}") from None


def _text(value: Any) -> Any:
    """NVML's char arrays arrive as bytes or str, depending on the nvidia-ml-py version."""
    return value.decode() if isinstance(value, bytes) else value


def _answer(fn: Any, *args: Any) -> Any:
    """The call's value, or the NVML error it raised as `"NVMLError(<code>: <text>)"`."""
    try:
        return _text(fn(*args))
    except nvml.NVMLError as e:
        return f"NVMLError({e.value}: {e})"


def _profile(info: Any) -> Any:
    if isinstance(info, str):
        return info
    return {"id": info.id, "sliceCount": info.sliceCount, "instanceCount": info.instanceCount,
            "memorySizeMB": info.memorySizeMB, "multiprocessorCount": info.multiprocessorCount,
            "name": _text(getattr(info, "name", ""))}


def _placements(handle: Any, profile_index: int) -> Any:
    """[(start, size), ...] NVML allows for the profile, or the NVML error as text."""
    try:
        return _placement_list(handle, profile_index)
    except Exception as e:  # noqa: BLE001 - a binding older than the call must not lose the recording
        return f"{type(e).__name__}: {e}"


def _placement_list(handle: Any, profile_index: int) -> Any:
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_index)
    slots = (nvml.c_nvmlGpuInstancePlacement_t * 8)()  # 8 memory slices: at most 8 placements
    count = ctypes.c_uint(8)
    answer = _answer(nvml.nvmlDeviceGetGpuInstancePossiblePlacements, handle, info.id, slots, ctypes.byref(count))
    if isinstance(answer, str):
        return answer
    return [[slots[i].start, slots[i].size] for i in range(count.value)]


def _read(path: str, lines: int | None = None) -> Any:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read().splitlines()
    except OSError as e:
        return str(e)
    return text[:lines] if lines else text


def record(index: int) -> dict[str, Any]:
    _must(nvml.nvmlInit)
    try:
        h = _must(nvml.nvmlDeviceGetHandleByIndex, index)
        # "00000000:3B:00.0" -> "0000:3b:00.0", as sysfs names it
        bdf = _text(_must(nvml.nvmlDeviceGetPciInfo, h).busId).lower()[-12:]
        count = int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 18))
        numa = _read(f"/sys/bus/pci/devices/{bdf}/numa_node")
        return {
            "_what": f"Answers of real NVML recorded by scripts/nvml_probe.py on {datetime.date.today()}: "
                     "the inputs of MIG profile naming and the error codes of profile indexes the GPU lacks.",
            "driver": _answer(nvml.nvmlSystemGetDriverVersion),
            "nvml": _answer(nvml.nvmlSystemGetNVMLVersion),
            "name": _answer(nvml.nvmlDeviceGetName, h),
            "memory_total_bytes": _must(nvml.nvmlDeviceGetMemoryInfo, h).total,
            "mig_mode": _answer(nvml.nvmlDeviceGetMigMode, h),
            "max_mig_device_count": _answer(nvml.nvmlDeviceGetMaxMigDeviceCount, h),
            "sysfs_numa_node": numa[0] if isinstance(numa, list) and numa else numa,
            "gpu_instance_profiles": {str(p): _profile(_answer(nvml.nvmlDeviceGetGpuInstanceProfileInfo, h, p))
                                      for p in range(count)},
            # Where each offered profile may sit (NVML answers only in MIG mode; the error is recorded
            # otherwise), and how many more fit now: what partitionable DRA devices are built from.
            "gpu_instance_placements": {str(p): _placements(h, p) for p in range(count)
                                        if not isinstance(_answer(nvml.nvmlDeviceGetGpuInstanceProfileInfo, h, p), str)},
            "mig_minors_head": _read("/proc/driver/nvidia-caps/mig-minors", 12),
            "proc_devices": [line for line in _read("/proc/devices") if "nvidia" in line],
        }
    finally:
        nvml.nvmlShutdown()


def main(argv: list[str]) -> int:
    if nvml is None:
        print("nvml_probe.py: the NVML bindings are missing (fix: pip install nvidia-ml-py)", file=sys.stderr)
        return 1
    try:
        index = int(argv[0]) if argv else 0
    except ValueError:
        print(f"nvml_probe.py: GPU_INDEX must be a whole number, not {argv[0]!r}", file=sys.stderr)
        return 2
    try:
        data = record(index)
    except ProbeError as e:
        print(f"nvml_probe.py: {e} (fix: run it on a machine with the NVIDIA driver, for a GPU index "
              "nvidia-smi lists)", file=sys.stderr)
        return 1
    json.dump(data, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
