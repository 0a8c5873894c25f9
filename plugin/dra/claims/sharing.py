"""GPU time-slicing for DRA claims: which interval each GPU of a claim gets, one setting per GPU, and applying it.

Why here and how it fits the preparer (plugin/dra/kubelet/prepare.py):
- `wanted(claim, allocated)` reads the claim's GpuConfigs (gpu_config.py) while
  the claim is read, so a bad config fails the claim before anything is
  written;
- `admit(...)` runs under the checkpoint lock, where every prepared claim is
  known: a GPU has ONE time-slice setting, so a claim asking another interval
  than the claims already holding that GPU (two claims can hold one GPU through
  admin access or consumable capacity) is refused naming the holder; asking the
  same is fine and changes nothing. The interval is then recorded per device in
  the checkpoint (`PreparedDevice.timeslice`), which is what survives restarts;
- `release(...)` after an unprepare sets a GPU back to Default once no prepared
  claim holds a setting for it any more (a later claim without config must not
  inherit an old one).

How a setting reaches the GPU (`TimeSliceBackend`):
- `SimulatedTimeSlice`: simulated nodes keep their GPUs' settings in a JSON
  file next to the checkpoint (`simulated-gpu-settings.json`: UUID -> index,
  computeMode, timeslice), which tests and operators can read;
- `NvidiaSmiTimeSlice`: real GPUs. NVML has no call for the compute time-slice
  (pynvml offers compute modes, not time-slices); `nvidia-smi compute-policy
  -i <UUID> --set-timeslice=<0..3>` is the driver's one interface for it, and is
  what NVIDIA's DRA driver runs too. It needs nvidia-smi in the daemon's
  container and root on the node (the chart's DaemonSet is privileged).
  NVML's part is the compute mode: it is read (`nvmlDeviceGetComputeMode`) and a
  GPU not in DEFAULT refuses the time-slice, naming the mode and the fix. Unlike
  NVIDIA's driver we do not force it to DEFAULT: we run no MPS, so nothing of
  ours ever changes it, and an operator's EXCLUSIVE_PROCESS stays theirs.

Containers see the setting through the claim's CDI spec:
`TOPO_DEV_<DEVICE>_TIMESLICE=<interval>` beside the device's UUID variable.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from allocator.topology import Device, DeviceKind

from ...atomic_file import replace_file
from .claim import Claim
from .gpu_config import KIND as GPU_KIND
from .gpu_config import GpuConfigError, Interval, config_for_request, gpu_configs

log = logging.getLogger(__name__)


def _uuid(gpu: Device) -> str:
    """The GPU's UUID: every GPU the driver serves has one (NVML's, or model/identity.py's when simulated)."""
    return cast(str, gpu.uuid)


#: The simulated backend's file, beside the checkpoint in the driver's plugin directory.
SIMULATED_STATE_FILE = "simulated-gpu-settings.json"


class SharingRefused(ValueError):
    """A claim's sharing cannot be granted (bad config, or another interval on a GPU already set)."""


class TimeSliceApplyError(RuntimeError):
    """The GPU's setting could not be changed; the message says why and what to fix."""


class TimeSliceBackend(Protocol):
    """Sets a GPU's compute time-slice (blocking; called under the checkpoint lock, in a worker thread)."""

    def apply(self, gpu: Device, interval: Interval) -> None: ...


class SimulatedTimeSlice:
    """A simulated node's GPU settings, kept in one JSON file: {UUID: {index, computeMode, timeslice}}."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()

    def state(self) -> dict[str, Any]:
        try:
            with open(self.path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return {}

    def apply(self, gpu: Device, interval: Interval) -> None:
        with self._lock:
            try:
                state = self.state()
            except ValueError:  # an unreadable file (edited by hand): start it afresh, it only mirrors settings
                state = {}
            if interval is Interval.DEFAULT:
                state.pop(_uuid(gpu), None)
            else:
                state[_uuid(gpu)] = {"index": gpu.index, "computeMode": "Default", "timeslice": interval.value}
            try:
                replace_file(self.path, json.dumps(state, indent=2, sort_keys=True) + "\n", mode=0o644,
                             prefix=".gpu-settings-", durable=False)
            except OSError as e:
                raise TimeSliceApplyError(f"cannot write {self.path}: {e.strerror or e} (fix: make the driver's "
                                          "plugin directory writable)") from None


#: NVML's compute modes by value (nvmlComputeMode_t), for messages.
COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}


class NvidiaSmiTimeSlice:
    """Real GPUs: `nvidia-smi compute-policy -i <UUID> --set-timeslice=<code>` (see the module docstring).

    With `nvml` (the pynvml module) a GPU's compute mode is read first: time-slicing between the
    containers of several pods needs DEFAULT, and a GPU an operator set to EXCLUSIVE_PROCESS (one
    process at a time) or PROHIBITED (none) would let the claim's second pod fail at its first CUDA
    call, far from the cause. Such a claim is refused at prepare, naming the mode and the fix; the
    mode itself is the operator's and is never changed here. An NVML that cannot answer (not
    started, GPU not found, call not supported) skips the check.
    """

    def __init__(self, nvidia_smi: str = "nvidia-smi", timeout_s: float = 30.0, nvml: Any | None = None):
        self.nvidia_smi = nvidia_smi
        self.timeout_s = timeout_s
        self.nvml = nvml

    def compute_mode(self, gpu: Device) -> int | None:
        """The GPU's NVML compute mode; None when NVML cannot tell."""
        nv = self.nvml
        if nv is None:
            return None
        try:
            nv.nvmlInit()
        except Exception as e:  # noqa: BLE001 (no NVML: no check, nvidia-smi will say what is wrong)
            log.debug("NVML did not start; compute mode not checked", extra={"reason": str(e)})
            return None
        try:
            return int(nv.nvmlDeviceGetComputeMode(nv.nvmlDeviceGetHandleByUUID(gpu.uuid)))
        except Exception as e:  # noqa: BLE001 (as above)
            log.debug("compute mode not checked", extra={"gpu": gpu.name, "reason": str(e)})
            return None
        finally:
            try:
                nv.nvmlShutdown()
            except Exception:  # noqa: BLE001 (nothing to undo)
                pass

    def command(self, gpu: Device, interval: Interval) -> list[str]:
        return [self.nvidia_smi, "compute-policy", "-i", _uuid(gpu), f"--set-timeslice={interval.code}"]

    def apply(self, gpu: Device, interval: Interval) -> None:
        if interval is not Interval.DEFAULT:
            mode = self.compute_mode(gpu)
            if mode is not None and mode != 0:
                raise TimeSliceApplyError(
                    f"{gpu.name} is in compute mode {COMPUTE_MODES.get(mode, mode)}, which lets "
                    f"{'no process' if mode == 2 else 'one process at a time'} use it: the claim's containers "
                    f"cannot take turns on it (fix: nvidia-smi -i {gpu.uuid} -c DEFAULT on the node, or a GPU "
                    "in DEFAULT mode)")
        exe = shutil.which(self.nvidia_smi)
        if exe is None:
            raise TimeSliceApplyError(
                f"setting {gpu.name}'s time-slice to {interval.value} needs {self.nvidia_smi}, which is not in "
                "the DRA driver's PATH (fix: mount the NVIDIA driver's nvidia-smi into the daemon's container, "
                "or remove sharing.timeSlicingConfig from the claim)")
        cmd = [exe, *self.command(gpu, interval)[1:]]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise TimeSliceApplyError(f"{' '.join(cmd)} did not finish within {self.timeout_s:g} s "
                                      "(fix: check the GPU and its driver with nvidia-smi)") from None
        if done.returncode != 0:
            out = (done.stderr or done.stdout).strip().splitlines()
            raise TimeSliceApplyError(f"{' '.join(cmd)} failed (exit {done.returncode}): "
                                      f"{out[-1] if out else 'no output'} (fix: run it on the node as root to "
                                      "see why; the GPU's driver must support compute-policy)")


def state_path(checkpoint_path: str) -> str:
    """Where the simulated backend keeps its file: beside the driver's checkpoint."""
    return os.path.join(os.path.dirname(checkpoint_path), SIMULATED_STATE_FILE)


def device_settings(wanted: Mapping[str, Interval]) -> dict[str, dict[str, str]]:
    """What the claim's CDI spec tells each container about its GPUs' sharing: {device: {env suffix: value}}
    (`TOPO_DEV_GPU_0_TIMESLICE=Short`; plugin/dra/kubelet/cdi.py builds the names)."""
    return {name: {"TIMESLICE": interval.value} for name, interval in wanted.items()}


@dataclass(frozen=True)
class Holder:
    """A prepared claim that holds a GPU with a time-slice setting."""

    claim: str  # namespace/name
    uid: str
    interval: Interval


class GpuSharing:
    """The time-slice rules for one driver (see the module docstring); `backend` changes the GPUs."""

    def __init__(self, driver: str, backend: TimeSliceBackend):
        self.driver = driver
        self.backend = backend

    def wanted(self, claim: Claim, allocated: Sequence[tuple[str, Device, list[str]]]) -> dict[str, Interval]:
        """{slice device name: interval} for the claim's GPUs whose request has a GpuConfig with sharing.

        Raises `SharingRefused` for a bad config, or a config that names a request which got a NIC.
        """
        try:
            parsed = gpu_configs(claim.opaque(self.driver, kinds=(GPU_KIND,)))
        except GpuConfigError as e:
            raise SharingRefused(str(e)) from None
        if not parsed:
            return {}
        # The results' own request paths: a subrequest of a prioritized list (`gpu/fast`) may have a config of
        # its own, which the parent names `allocated` carries could not find.
        full: dict[str, list[str]] = {}
        for r in claim.results_of(self.driver):
            full.setdefault(str(r.device), []).append(r.request_path)
        out: dict[str, Interval] = {}
        for name, dev, requests in allocated:
            for request in full.get(name) or requests or [""]:
                found = config_for_request(parsed, request)
                if found is None:
                    continue
                entry, cfg = found
                timeslice = cfg.timeslice
                if timeslice is None:
                    continue
                if dev.kind is not DeviceKind.GPU:
                    if entry.requests:  # it names this request: a mistake worth saying
                        raise SharingRefused(
                            f"{cfg.where}: GpuConfig applies to request {request!r}, which got {name} "
                            f"({dev.kind.value}), not a full GPU (fix: list only GPU requests in its requests)")
                    continue  # a config for every request: NICs have nothing to time-slice
                if name in out and out[name] is not timeslice:
                    raise SharingRefused(f"{cfg.where}: {name} gets interval {timeslice.value} through request "
                                         f"{request!r} and {out[name].value} through another request of the claim "
                                         "(fix: one interval per GPU)")
                out[name] = timeslice
        return out

    def admit(self, uid: str, wanted: Mapping[str, Interval], devices: Mapping[str, Device],
              holders: Mapping[str, list[Holder]]) -> None:
        """Check `wanted` against the GPUs' current holders and apply what changes; raises `SharingRefused`
        (another interval is set) or `TimeSliceApplyError` (the backend failed)."""
        todo = []
        for name, interval in sorted(wanted.items()):
            others = [h for h in holders.get(name, []) if h.uid != uid]
            clash = [h for h in others if h.interval is not interval]
            if clash:
                h = clash[0]
                raise SharingRefused(
                    f"{name} ({devices[name].name}) is time-sliced with interval {h.interval.value} for claim "
                    f"{h.claim}; a GPU has one time-slice setting, this claim asks {interval.value} "
                    f"(fix: ask {h.interval.value}, or wait until {h.claim} is gone)")
            if not others:
                todo.append(name)
        done: list[str] = []
        for name in todo:
            try:
                self.backend.apply(devices[name], wanted[name])
            except Exception:
                # The claim fails whole: GPUs it already set go back, so nothing unrecorded stays behind.
                self.release({n: devices[n] for n in done}, holders)
                raise
            done.append(name)
            log.info("GPU time-slice set", extra={"device": name, "gpu": devices[name].name,
                                                  "interval": wanted[name].value})

    def release(self, freed: Mapping[str, Device], holders: Mapping[str, list[Holder]]) -> None:
        """GPUs an unprepared claim had set: back to Default where no other prepared claim holds a setting.
        Failures are logged, not raised: the claim is gone either way, and the next claim sets its own."""
        for name, dev in sorted(freed.items()):
            if holders.get(name):
                continue
            try:
                self.backend.apply(dev, Interval.DEFAULT)
                log.info("GPU time-slice back to Default", extra={"device": name, "gpu": dev.name})
            except Exception as e:  # noqa: BLE001 (unprepare must succeed; the setting is reported)
                log.warning("could not set the GPU's time-slice back to Default",
                            extra={"device": name, "gpu": dev.name, "reason": str(e)})


class Holders(dict[str, list[Holder]]):
    """{slice device name: the prepared claims holding a time-slice setting for it}.

    Built from the checkpoint once per batch and kept current as the batch records or drops claims,
    so a call of many claims costs one pass over the checkpoint, not one per claim.
    """

    @classmethod
    def of(cls, claims: Mapping[str, Any]) -> Holders:
        out = cls()
        for c in claims.values():
            out.add(c)
        return out

    def add(self, claim: Any) -> None:
        """Record the settings of a `PreparedClaim`."""
        for d in claim.devices:
            if d.timeslice:
                self.setdefault(d.device, []).append(
                    Holder(f"{claim.namespace}/{claim.name}", claim.uid, Interval(d.timeslice)))

    def drop(self, uid: str) -> None:
        for name in list(self):
            self[name] = [h for h in self[name] if h.uid != uid]
            if not self[name]:
                del self[name]
