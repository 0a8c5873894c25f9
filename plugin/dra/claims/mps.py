"""MPS for DRA claims: `GpuConfig` `sharing.strategy: MPS`, one control daemon per GPU, and what containers get.

The config is NVIDIA's DRA driver's (dra-driver-nvidia-gpu, `resource.nvidia.com/v1beta1`
`sharing.go`: `MpsConfig`):

    sharing:
      strategy: MPS
      mpsConfig:
        defaultActiveThreadPercentage: 50          # 0..100, every client
        defaultPinnedDeviceMemoryLimit: 10Gi       # a Kubernetes quantity, every GPU
        defaultPerDevicePinnedMemoryLimit:         # per GPU, by UUID or index; over the default
          "0": 5Gi

Why one control daemon per GPU and not per claim: two claims can hold one GPU
(consumable capacity, admin access), and MPS clients of one GPU must meet in
one daemon to share it; so the set of claims sharing a GPU shares its daemon.
The first claim's prepare starts it (`<mps root>/dra-<UUID>/pipe`, `/log`, with
`CUDA_VISIBLE_DEVICES` the GPU) and sets its defaults; later claims join it
(their own limits still reach their containers through the env); the last
claim's unprepare quits it. Who holds which daemon, and the daemon itself
(directories, GPUs, defaults), is kept in `mps-daemons.json` beside the
checkpoint, so a restarted driver still quits a daemon with its last claim.

MIG devices (`MigDeviceConfig` `sharing.strategy: MPS`, NVIDIA's kind; static
and dynamic MIG) get a daemon of their own in the same way, keyed by the MIG
device's UUID and started with `CUDA_VISIBLE_DEVICES=<MIG UUID>` (NVIDIA's
driver also names the MIG device UUIDs there); a per-device pinned limit names
a MIG device by its UUID only (an index would be ambiguous between a GPU's
slots and the node's GPUs).

Supervised (`plugin.mps.supervisor.MpsSupervisor`, the device plugin's): between
the first claim and the last, the daemon is probed; one that stops answering is
restarted with backoff and given its defaults again, and while it is down its
device is reported unhealthy (`down`, applied by the driver to the topology its
slices and health stream are built from: the slice taint `<driver>/unhealthy`
with value `mps-daemon-down`, and DRAResourceHealth Unhealthy for the pods
holding it). A restarted driver takes the daemons of the claims still in its
checkpoint over (`start`): one that answers is kept and given its defaults
again, one that died meanwhile is started; a holder the checkpoint does not
know (a crash between the daemon's start and the checkpoint write) is dropped,
and a daemon left without holders quits. Stopping the driver leaves the daemons
running (`detach`): the claims' containers keep using them.

Containers get, through the claim's CDI spec for that GPU: the pipe directory
mounted at `/mps/dra-<UUID>/pipe`, `<mps root>/shm` at `/dev/shm`, `CUDA_MPS_PIPE_DIRECTORY`, and the claim's
`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` / `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M`
(one GPU per CDI device, so ordinal 0) where the config sets them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from allocator.topology import Device, DeviceKind

from ...atomic_file import replace_file
from ...model.cdi.spec import Edits, Mount
from ...model.mps_allocate import SHM_DIR
from ...backoff import Backoff
from ...mps.control import DaemonSpec, MpsControl, MpsControlError, default_commands
from ...mps.supervisor import DEFAULT_PROBE_INTERVAL_S, MpsSupervisor

log = logging.getLogger(__name__)

STATE_FILE = "mps-daemons.json"
#: The health reason of a device whose control daemon is down (the slice taint's value: `mps-daemon-down`).
DOWN_REASON = "mps-daemon-down (its MPS control daemon does not answer; the DRA driver restarts it)"
CONTAINER_ROOT = "/mps"
_FIELDS = ("defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit", "defaultPerDevicePinnedMemoryLimit",
           "multiUser")
_QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_FACTORS = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


class MpsConfigError(ValueError):
    """A bad `mpsConfig`; the message names the field and the fix."""


class MpsDaemonConflict(MpsControlError):
    """The claim asks its device's running daemon for a mode it does not run in (`multiUser`); names the fix."""


@dataclass(frozen=True)
class MpsSettings:
    """One claim's MPS limits: the thread share, the pinned memory (MiB) by default and per GPU."""

    active_thread_percentage: int | None = None
    pinned_mib: int | None = None
    #: By GPU UUID or index, as written.
    per_device_pinned_mib: Mapping[str, int] = field(default_factory=dict)
    #: `multiUser`: the daemon is started with `-M`, so clients of different UIDs share it.
    multi_user: bool = False

    def pinned_for(self, gpu: Device) -> int | None:
        keys = (gpu.uuid or "",) if gpu.kind is DeviceKind.MIG else (gpu.uuid or "", str(gpu.index))
        for key in keys:
            if key in self.per_device_pinned_mib:
                return self.per_device_pinned_mib[key]
        return self.pinned_mib


def _mib(value: Any, where: str) -> int:
    m = _QUANTITY.match(str(value)) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if m is None:
        raise MpsConfigError(f"{where}: {value!r} is not a memory quantity (fix: a Kubernetes quantity such as "
                             "512Mi, 10Gi or 4G)")
    mib = int(m.group(1)) * _FACTORS[m.group(2)] // (1 << 20)
    if mib < 1:
        raise MpsConfigError(f"{where}: {value!r} is less than 1 MiB (fix: a limit of at least 1Mi)")
    return mib


def parse_mps_config(obj: Any, where: str) -> MpsSettings:
    """`mpsConfig` (None: no limits, NVIDIA's default) -> `MpsSettings`; raises `MpsConfigError`."""
    if obj is None:
        return MpsSettings()
    if not isinstance(obj, dict):
        raise MpsConfigError(f"{where}: must be an object, not {type(obj).__name__}")
    unknown = sorted(set(obj) - set(_FIELDS))
    if unknown:
        raise MpsConfigError(f"{where}: unknown field {unknown[0]!r} (fix: use only {', '.join(_FIELDS)})")
    pct = obj.get("defaultActiveThreadPercentage")
    if pct is not None and (isinstance(pct, bool) or not isinstance(pct, int) or not 0 <= pct <= 100):
        raise MpsConfigError(f"{where}.defaultActiveThreadPercentage: {pct!r} is not a percentage "
                             "(fix: an integer from 0 to 100)")
    multi = obj.get("multiUser")
    if multi is not None and not isinstance(multi, bool):
        raise MpsConfigError(f"{where}.multiUser: {multi!r} is not a boolean (fix: multiUser: true or false)")
    pinned = obj.get("defaultPinnedDeviceMemoryLimit")
    per = obj.get("defaultPerDevicePinnedMemoryLimit") or {}
    if not isinstance(per, dict):
        raise MpsConfigError(f"{where}.defaultPerDevicePinnedMemoryLimit: must map GPU UUIDs or indexes to "
                             "quantities (fix: {\"0\": 5Gi})")
    return MpsSettings(
        active_thread_percentage=pct or None,
        pinned_mib=_mib(pinned, f"{where}.defaultPinnedDeviceMemoryLimit") if pinned is not None else None,
        per_device_pinned_mib={str(k): _mib(v, f"{where}.defaultPerDevicePinnedMemoryLimit[{k!r}]")
                               for k, v in per.items()},
        multi_user=bool(multi))


def _dir_name(gpu: Device) -> str:
    return "dra-" + re.sub(r"[^A-Za-z0-9_.-]", "_", gpu.uuid or gpu.name)


class ClaimMpsDaemons:
    """The control daemons of DRA claims, one per GPU or MIG device, held by the claims that use it (module
    docstring). `acquire`/`release` block (they run in the checkpoint's worker thread); `start`/`detach` run
    on the driver's loop."""

    def __init__(self, state_dir: str, mps_root: str, control: MpsControl,
                 probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
                 backoff: Callable[[], Backoff] | None = None):
        self.path = os.path.join(state_dir, STATE_FILE)
        self.mps_root = mps_root
        self.control = control
        self.supervisor = MpsSupervisor(control, (), self._on_change, probe_interval_s, wanted=self._held,
                                        **({"backoff": backoff} if backoff is not None else {}))
        #: {topology device name: why}: the devices whose daemon is down now (read on the loop).
        self.down: dict[str, str] = {}
        #: Called on the loop when `down` changed (the driver re-publishes health).
        self.on_health: Callable[[], None] = lambda: None
        self._device_of: dict[str, str] = {}  # daemon name -> topology device name
        self._lock = threading.Lock()

    def _spec(self, gpu: Device, settings: MpsSettings) -> DaemonSpec:
        base = os.path.join(self.mps_root, _dir_name(gpu))
        return DaemonSpec(name=f"{gpu.name} ({gpu.uuid})", pipe_dir=os.path.join(base, "pipe"),
                          log_dir=os.path.join(base, "log"), gpus=(gpu.uuid or str(gpu.index),),
                          defaults=default_commands([(0, settings.pinned_for(gpu))], settings.active_thread_percentage),
                          multi_user=settings.multi_user)

    @staticmethod
    def _spec_of(key: str, entry: Mapping[str, Any]) -> DaemonSpec | None:
        """The daemon an entry of the state file describes (None: written by a version that kept no spec)."""
        if not entry.get("pipe_dir") or "name" not in entry:
            return None
        return DaemonSpec(name=str(entry["name"]), pipe_dir=str(entry["pipe_dir"]), log_dir=str(entry["log_dir"]),
                          gpus=tuple(entry.get("gpus") or ()), defaults=tuple(entry.get("defaults") or ()),
                          multi_user=bool(entry.get("multi_user")))

    def _held(self, spec: DaemonSpec) -> bool:
        """Whether a claim still holds the daemon of `spec`, by the state file (read without `_lock`: it is
        replaced whole, and the supervisor asks while holding the daemon's lock, which `acquire` takes
        inside `_lock`)."""
        try:
            state = self._state()
        except (OSError, ValueError):
            return True  # unreadable: keep the daemon rather than leave a claim without one
        return any(e.get("name") == spec.name and e.get("holders") for e in state.values())

    def _on_change(self, name: str, ready: bool) -> None:
        device = self._device_of.get(name)
        if device is None:
            return
        if ready:
            changed = self.down.pop(device, None) is not None
        else:
            changed = device not in self.down
            self.down[device] = DOWN_REASON
        if changed:
            log.warning("MPS control daemon down: its device is reported unhealthy" if not ready else
                        "MPS control daemon back: its device is healthy again", extra={"device": device})
            self.on_health()

    def _state(self) -> dict[str, dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return {}

    def _save(self, state: Mapping[str, Any]) -> None:
        replace_file(self.path, json.dumps(state, indent=1, sort_keys=True) + "\n", mode=0o600, prefix=".mps-", durable=True)

    def edits(self, gpu: Device, settings: MpsSettings) -> Edits:
        """What a container of the claim gets for `gpu`: the pipe directory and the claim's limits."""
        spec = self._spec(gpu, settings)
        inside = os.path.join(CONTAINER_ROOT, _dir_name(gpu), "pipe")
        env = [f"CUDA_MPS_PIPE_DIRECTORY={inside}"]
        if settings.active_thread_percentage:
            env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={settings.active_thread_percentage}")
        pinned = settings.pinned_for(gpu)
        if pinned:
            env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={pinned}M")
        # /dev/shm: where MPS clients meet their server (plugin.model.mps_allocate says why).
        return Edits(env=tuple(env), mounts=(Mount(spec.pipe_dir, inside),
                                             Mount(os.path.join(self.mps_root, "shm"), SHM_DIR)))

    def acquire(self, uid: str, wanted: Mapping[str, tuple[Device, MpsSettings]]) -> dict[str, Edits]:
        """The claim `uid` joins the daemon of each device in `wanted` (started if none runs); its CDI edits.

        Raises `MpsControlError` when a daemon cannot be started; devices the claim joined before are left again.
        """
        with self._lock:
            state = self._state()
            joined: list[str] = []
            try:
                for name, (gpu, settings) in sorted(wanted.items()):
                    key = gpu.uuid or name
                    entry = state.setdefault(key, {"device": name, "holders": []})
                    spec = self._spec(gpu, settings)
                    self._device_of[spec.name] = gpu.name
                    known = self.supervisor.specs.get(spec.name)
                    if known is not None and known.multi_user != spec.multi_user:
                        raise MpsDaemonConflict(
                            f"{gpu.name} ({gpu.uuid}): its MPS control daemon runs "
                            f"{'in' if known.multi_user else 'out of'} multi-user mode for the claims holding it "
                            f"({', '.join(entry['holders'])}); this claim asks multiUser: "
                            f"{str(spec.multi_user).lower()} (fix: ask multiUser: {str(known.multi_user).lower()}, "
                            "or wait until those claims are gone)")
                    self.supervisor.ensure(spec)  # a daemon running already keeps its own defaults
                    spec = known or spec
                    if uid not in entry["holders"]:
                        entry["holders"].append(uid)
                    entry.update(name=spec.name, gpu=gpu.name, pipe_dir=spec.pipe_dir, log_dir=spec.log_dir,
                                 gpus=list(spec.gpus), defaults=list(spec.defaults), multi_user=spec.multi_user)
                    joined.append(key)
            except (MpsControlError, OSError):
                self._leave(state, uid, joined)
                self._save(state)
                raise
            self._save(state)
        return {name: self.edits(gpu, settings) for name, (gpu, settings) in wanted.items()}

    def release(self, uid: str) -> None:
        """The claim `uid` is gone: each daemon it held and no other claim holds is asked to quit."""
        with self._lock:
            state = self._state()
            held = [k for k, e in state.items() if uid in e["holders"]]
            if held:  # most claims hold none: no write for them
                self._leave(state, uid, held)
                self._save(state)

    def _leave(self, state: dict[str, dict[str, Any]], uid: str, keys: list[str]) -> None:
        for key in keys:
            entry = state.get(key)
            if entry is None:
                continue
            entry["holders"] = [h for h in entry["holders"] if h != uid]
            if entry["holders"]:
                continue
            spec = self._spec_of(key, entry) or DaemonSpec(name=key, pipe_dir=entry.get("pipe_dir", ""),
                                                           log_dir=entry.get("log_dir", ""))
            try:
                if spec.name in self.supervisor.specs:
                    self.supervisor.discard(spec.name)  # not restarted any more, then asked to quit
                    log.info("MPS control daemon quit with its last claim", extra={"gpu": key})
                elif spec.pipe_dir:
                    self.control.quit(spec)
                    log.info("MPS control daemon quit with its last claim", extra={"gpu": key})
            except (MpsControlError, OSError) as e:  # unprepare must succeed; the daemon is reported
                log.warning("MPS control daemon did not quit", extra={"gpu": key, "reason": str(e)})
            del state[key]

    async def start(self, prepared: Collection[str]) -> None:
        """On the loop, at the driver's start: supervise the daemons of the claims in `prepared` (UIDs of the
        checkpoint); holders it does not know are dropped, and daemons left without one quit."""
        self.supervisor.start()
        with self._lock:
            state = self._state()
        orphans = {uid for e in state.values() for uid in e["holders"] if uid not in prepared}
        for uid in sorted(orphans):
            log.info("MPS daemon holder not in the checkpoint dropped", extra={"uid": uid})
            await asyncio.to_thread(self.release, uid)
        with self._lock:
            state = self._state()
        for key, entry in sorted(state.items()):
            spec = self._spec_of(key, entry)
            if spec is None:
                log.warning("MPS control daemon of a prepared claim not supervised: its entry predates the "
                            "daemon's spec (it still quits with its last claim)", extra={"gpu": key})
                continue
            self._device_of[spec.name] = str(entry.get("gpu", ""))
            self.supervisor.watch(spec)
            log.info("MPS control daemon of prepared claims taken over", extra={"gpu": key,
                                                                                "holders": entry["holders"]})

    async def detach(self) -> None:
        """The driver stops: supervision ends, the daemons keep serving their claims' containers."""
        await self.supervisor.detach()

    def holders(self) -> dict[str, list[str]]:
        """{GPU UUID: claim UIDs}: who holds which daemon, for tests and operators."""
        with self._lock:
            return {k: list(e["holders"]) for k, e in self._state().items()}
