"""GPU health: an NVML event loop in its own thread that applies the catalog policy and waits for evidence.

Why this shape (NVIDIA's `internal/rm/health.go` is the anchor; where it fails,
`../shared/research/nvidia-device-plugin.md` §1.5):

- `nvmlEventSetWait` blocks, so it runs in a thread; changes reach the event
  loop through `loop.call_soon_threadsafe`, and the daemon pushes the new list
  on every open ListAndWatch stream at once.
- What an XID does is NVIDIA's XID catalog (`catalog.py`, overrides in
  `options.py`); what brings a GPU back is the driver's evidence
  (`policy.py`, read by `evidence.py`), never NVML merely answering again.
- An event is pinned on its GPU by the device handle it carries, compared with
  the handles obtained at registration: a GPU that fell off the bus (XID 79)
  refuses `nvmlDeviceGetUUID`, and NVIDIA's plugin then condemns every GPU. An
  event no handle matches is logged and every GPU is probed; only those NVML
  cannot reach are marked.
- NVLink XIDs (74, 144–150) leave the GPU Healthy; its links are read again and
  `on_links` is told when the set of active links changed (the hardware source
  rescans, so a dead link leaves the topology), and again when it returns.
- Logging: one structured line per transition (Unhealthy, action raised,
  Healthy again); per-event lines go through a rate limiter keyed by GPU and
  XID, so a storm of XIDs costs a bounded log. XID counts per (GPU, XID) are
  kept for the metrics.
- NVIDIA's loop spins at 100 % CPU when the wait keeps failing (HAMi #2321).
  Here every failure backs off exponentially (capped), probes every GPU, and
  after a few failures the event set is rebuilt. A wait that "times out" far
  too early counts as a failure too: no busy loop.

The thread stops within about one wait timeout of `stop()`.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocator.topology import HEALTHY, Device

from ..heap import release_free_heap
from ..observability.ratelimited_log import RateLimitedLog
from ..backoff import Backoff
from . import store
from .catalog import Action, load_catalog
from .evidence import EvidenceReader, read_boot_id
from .options import GpuHealthOptions
from .policy import (
    Evidence,
    Fault,
    GpuHealth,
    driver_action,
    observe,
    on_fault,
    recovery,
)

log = logging.getLogger(__name__)

__all__ = ["GpuHealthMonitor", "HealthStats"]

_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_DBE_EVENT = 0x2  # nvmlEventTypeDoubleBitEccError
_RECOVERY_EVENT = 0x8000  # nvmlEventTypeGpuRecoveryAction (newer drivers)


@dataclass
class HealthStats:
    """Counters for tests, logs and metrics."""

    wait_calls: int = 0
    wait_errors: int = 0
    events: int = 0
    #: Events that left every GPU as it was (IGNORE/RESTART_APP buckets, unknown GPUs).
    ignored_events: int = 0
    recoveries: int = 0
    rebuilds: int = 0
    transitions: int = 0
    #: Evidence reads of Unhealthy GPUs past their quiet period (tests wait on it to see "no recovery").
    evaluations: int = 0
    #: Backoff delays slept, in order (the last 64), and the ceiling each was drawn under (full jitter:
    #: the delay is uniform in [0, ceiling], the ceiling doubles up to the cap).
    backoffs: list[float] = field(default_factory=list)
    backoff_ceilings: list[float] = field(default_factory=list)


def _str(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def handle_key(handle: Any) -> int:
    """What identifies an NVML device handle: the C pointer's address (pynvml hands out a fresh Python
    object per call), or the object itself (the test double's handles are plain objects)."""
    try:
        address = ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return id(handle)
    return address if address is not None else id(handle)


class GpuHealthMonitor:
    """Watches `gpus` through NVML in a thread; `on_change({name: GpuHealth})` after each change.

    `on_change` is called in the monitor thread (or in `clear`'s caller) with every watched GPU;
    `watch_gpu_health` hops it onto the event loop. `on_links(gpu, why)` is called when a GPU's set of
    active NVLinks changed. Devices without a UUID cannot be watched and keep their health.
    """

    def __init__(
        self,
        nvml: Any,
        gpus: Sequence[Device],
        options: GpuHealthOptions,
        on_change: Callable[[dict[str, GpuHealth]], None],
        *,
        on_links: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.nvml = nvml
        self.options = options
        self.on_change = on_change
        self.on_links = on_links
        self.clock = clock
        self.stats = HealthStats()
        self.evidence = EvidenceReader(nvml)
        self.limited = RateLimitedLog(log, burst=3, window_s=60.0, max_keys=256, clock=clock)
        #: (gpu, xid, bucket) -> events seen; bounded by GPUs × XIDs.
        self.xid_counts: Counter[tuple[str, int, str]] = Counter()
        self._uuids = {d.name: d.uuid for d in gpus if d.uuid}
        self._names = {u: n for n, u in self._uuids.items()}
        self._faults: dict[str, Fault] = {}
        self._published: dict[str, GpuHealth] = {}
        self._saved: dict[str, tuple[str, str]] = {}
        self._handles: dict[int, str] = {}
        self._links: dict[str, frozenset[int]] = {}
        self._links_down: set[str] = set()
        #: The active links first seen per GPU: a link missing from it is down.
        self._link_baseline: dict[str, frozenset[int]] = {}
        self._next_probe: dict[str, float] = {}
        self._registered: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._err = lambda name, default: getattr(nvml, name, default)
        self.boot_id = read_boot_id(options.proc_root)
        self._seen_clears: set[str] = set()
        now = clock()
        for d in gpus:  # a GPU the source already saw as Unhealthy: NVML could not reach it at discovery
            if d.uuid and d.health != HEALTHY:
                self._faults[d.name] = Fault(Action.RESET_GPU, "lost", "NVML could not reach it at discovery",
                                             now, self.boot_id, seen_lost=True)
        # What the servers show now: the source's own verdict; a restored fault differs and is published.
        self._published = {d.name: GpuHealth(d.health, d.health_reason) for d in gpus if d.uuid}
        self._restore()

    # -- public ------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("GPU health monitor already started")
        self._thread = threading.Thread(target=self._run, name="gpu-health", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the thread and join it; True when it has exited."""
        self._stop.set()
        t = self._thread
        if t is None:
            return True
        t.join(timeout if timeout is not None else self.options.wait_timeout_ms / 1000.0 * 2 + 5.0)
        self.limited.flush(force=True)
        return not t.is_alive()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def health_map(self) -> dict[str, GpuHealth]:
        with self._lock:
            return {n: GpuHealth.of(self._faults.get(n)) for n in self._uuids}

    def health(self) -> dict[str, str]:
        return {n: h.health for n, h in self.health_map().items()}

    def faults(self) -> dict[str, Fault]:
        with self._lock:
            return dict(self._faults)

    def clear(self, gpus: Iterable[str], why: str = "operator clear") -> list[str]:
        """End the faults of these GPUs (names, UUIDs or `all`); returns the names cleared."""
        wanted = set(gpus)
        done = []
        with self._lock:
            for name in list(self._faults):
                if "all" in wanted or name in wanted or self._uuids.get(name) in wanted:
                    fault = self._faults.pop(name)
                    self._next_probe.pop(name, None)
                    done.append((name, fault))
        for name, fault in done:
            self._transition(name, fault, None, why)
        if done:
            self._flush()
        return [n for n, _ in done]

    def apply_clear_file(self, initial: bool = False) -> list[str]:
        """Read the clear file; apply the entries not seen yet (`initial`: only remember what is there)."""
        directory = self.options.state_directory
        if directory is None:
            return []
        fresh = [c for c in store.read_clears(directory) if c.id not in self._seen_clears]
        self._seen_clears.update(c.id for c in fresh)
        if initial or not fresh:
            return []
        return self.clear([c.gpu for c in fresh])

    # -- state ---------------------------------------------------------------
    def _restore(self) -> None:
        directory = self.options.state_directory
        if directory is None:
            return
        now = self.clock()
        for uuid, saved in store.load_faults(directory).items():
            name = self._names.get(uuid)
            if name is None:
                continue
            if saved.boot_id and self.boot_id and saved.boot_id != self.boot_id:
                log.warning("GPU fault from before the node rebooted dropped: the reboot is its evidence",
                            extra={"gpu": name, "uuid": uuid, "reason": f"{saved.cause}: {saved.action.value}"})
                continue
            self._faults[name] = Fault(saved.action, saved.cause, saved.detail, now, saved.boot_id or self.boot_id)
            log.warning("GPU fault restored from before the daemon restarted",
                        extra={"gpu": name, "uuid": uuid, "reason": f"{saved.cause}: {saved.action.value}"})
        self._saved = {n: (f.action.value, f.cause) for n, f in self._faults.items()}

    def _save(self) -> None:
        directory = self.options.state_directory
        if directory is None:
            return
        with self._lock:
            now = {n: (f.action.value, f.cause) for n, f in self._faults.items()}
            if now == self._saved:
                return
            self._saved = now
            faults = {self._uuids[n]: store.SavedFault(self._uuids[n], f.action, f.cause, f.detail, f.boot_id)
                      for n, f in self._faults.items()}
        store.save_faults(directory, faults)

    def _transition(self, name: str, old: Fault | None, new: Fault | None, why: str) -> None:
        """The one log line of a health transition."""
        self.stats.transitions += 1
        base = {"gpu": name, "uuid": self._uuids.get(name)}
        if new is None and old is not None:
            self.stats.recoveries += 1
            log.warning("GPU Healthy again", extra={**base, "was": old.reason, "evidence": why})
        elif new is not None and old is None:
            log.warning("GPU marked Unhealthy", extra={**base, "reason": new.reason, "detail": new.detail,
                                                       "required_action": new.action.value})
        elif new is not None and old is not None:
            log.warning("GPU needs more than before", extra={**base, "reason": new.reason, "was": old.reason,
                                                            "required_action": new.action.value})

    def _fault(self, name: str, action: Action, cause: str, detail: str, evidence: Evidence | None = None) -> None:
        now = self.clock()
        with self._lock:
            old = self._faults.get(name)
            new = on_fault(old, action, cause, detail, now, self.boot_id, evidence)
            self._faults[name] = new
            self._next_probe.pop(name, None)
        if old is None or old.action is not new.action:
            self._transition(name, old, new, detail)

    def _flush(self) -> None:
        snap = self.health_map()
        with self._lock:
            if snap == self._published:
                return
            self._published = dict(snap)
        self._save()
        try:
            self.on_change(snap)
        except Exception:
            log.exception("GPU health callback failed")

    # -- NVML ----------------------------------------------------------------
    def _code(self, e: BaseException) -> int | None:
        return getattr(e, "value", None)

    def _read(self, name: str) -> Evidence:
        return self.evidence.read(self._uuids[name])

    def _probe_all(self, reason: str) -> None:
        for name in self._uuids:
            ev = self._read(name)
            if not ev.answers:
                self._fault(name, Action.RESET_GPU, "lost", f"NVML cannot reach it ({reason})", ev)

    def _check_driver(self, name: str, ev: Evidence, cause: str) -> None:
        """A GPU the driver says needs an action is Unhealthy, with or without an XID."""
        drv = driver_action(ev.recovery_action)
        if drv is not None and drv.unhealthy:
            self._fault(name, drv, cause, f"the driver's recovery action reads {ev.recovery_action} "
                                          f"({drv.value})", ev)

    def _register(self, name: str, event_set: Any) -> bool:
        """Register `name` in `event_set`; False (and Unhealthy) when that fails for a real reason."""
        nvml = self.nvml
        wanted = int(getattr(nvml, "nvmlEventTypeXidCriticalError", _XID_EVENT))
        wanted |= int(getattr(nvml, "nvmlEventTypeGpuRecoveryAction", _RECOVERY_EVENT))
        if self.options.double_bit_ecc:
            wanted |= int(getattr(nvml, "nvmlEventTypeDoubleBitEccError", _DBE_EVENT))
        try:
            h = nvml.nvmlDeviceGetHandleByUUID(self._uuids[name])
        except nvml.NVMLError as e:
            self._fault(name, Action.RESET_GPU, "lost", f"no NVML handle: {e}", Evidence(answers=False))
            return False
        self._handles[handle_key(h)] = name
        if name not in self._links:
            try:
                links = self.evidence.active_links(h)
            except nvml.NVMLError:
                links = None
            if links is not None:
                self._links[name] = links
                self._link_baseline.setdefault(name, links)
        mask = wanted
        try:
            mask &= int(nvml.nvmlDeviceGetSupportedEventTypes(h))
        except nvml.NVMLError:
            pass
        if not mask:
            log.warning("GPU supports no health events; it is not watched", extra={"gpu": name})
            self._registered.add(name)
            return True
        try:
            nvml.nvmlDeviceRegisterEvents(h, mask, event_set)
        except nvml.NVMLError as e:
            if self._code(e) == self._err("NVML_ERROR_NOT_SUPPORTED", 3):
                log.warning("GPU cannot deliver health events (driver too old?); it is not watched",
                            extra={"gpu": name})
                self._registered.add(name)
                return True
            self._fault(name, Action.RESET_GPU, "no-events", f"cannot register health events: {e}")
            return False
        self._registered.add(name)
        return True

    def _build_set(self) -> Any:
        es = self.nvml.nvmlEventSetCreate()
        self._registered = set()
        self._handles = {}
        for name in self._uuids:
            if self._register(name, es):
                self._check_driver(name, self._read(name), "driver")
        return es

    def _free_set(self) -> None:
        es, self._event_set = self._event_set, None
        self._registered = set()
        if es is None:
            return
        try:
            self.nvml.nvmlEventSetFree(es)
        except Exception as e:  # noqa: BLE001
            log.debug("nvmlEventSetFree failed", extra={"reason": str(e)})

    def _check_recovery(self) -> None:
        now = self.clock()
        every = self.options.probe_every_s
        with self._lock:
            due = [n for n in self._faults if n in self._uuids and now >= self._next_probe.get(n, 0.0)]
            for n in due:
                self._next_probe[n] = now + every
        for name in due:
            ev = self._read(name)
            with self._lock:
                fault = self._faults.get(name)
                if fault is None:
                    continue
                fault = self._faults[name] = observe(fault, ev)
            drv = driver_action(ev.recovery_action)
            if drv is not None and drv.rank > fault.action.rank:  # the driver asks for more: a new fault
                self._check_driver(name, ev, "driver")
                continue
            why = recovery(fault, ev, now, self.options.quiet_period_s, read_boot_id(self.options.proc_root))
            if now - fault.at >= self.options.quiet_period_s:
                self.stats.evaluations += 1
            if why is None:
                continue
            if name not in self._registered and self._event_set is not None and not self._register(
                    name, self._event_set):
                continue
            with self._lock:
                self._faults.pop(name, None)
                self._next_probe.pop(name, None)
            self._transition(name, fault, None, why)
        self._poll_links(now)

    # -- NVLinks -----------------------------------------------------------------
    def _read_links(self, name: str, why: str) -> None:
        nvml = self.nvml
        try:
            h = nvml.nvmlDeviceGetHandleByUUID(self._uuids[name])
            links = self.evidence.active_links(h)
        except nvml.NVMLError:
            return
        if links is None:
            return
        before = self._links.get(name)
        if before is None:
            self._links[name] = links
            return
        if links == before:
            return
        gone, back = sorted(before - links), sorted(links - before)
        self._links[name] = links
        if self._link_baseline.setdefault(name, before) - links:
            self._links_down.add(name)
        else:
            self._links_down.discard(name)
        log.warning("GPU NVLinks changed; the topology is read again",
                    extra={"gpu": name, "down": gone, "up": back, "cause": why})
        if self.on_links is not None:
            try:
                self.on_links(name, f"NVLinks of {name} changed ({why})")
            except Exception:
                log.exception("GPU link callback failed")

    def _poll_links(self, now: float) -> None:
        for name in sorted(self._links_down):
            if now >= self._next_probe.get(f"links:{name}", 0.0):
                self._next_probe[f"links:{name}"] = now + self.options.probe_every_s
                self._read_links(name, "polled while a link is down")

    # -- events ------------------------------------------------------------------
    def _gpu_of(self, data: Any) -> str | None:
        """The GPU an event is about: by its handle first, by UUID second (a lost GPU answers no UUID)."""
        name = self._handles.get(handle_key(data.device)) if data.device is not None else None
        if name is not None:
            return name
        nvml = self.nvml
        try:
            uuid = _str(nvml.nvmlDeviceGetUUID(data.device))
        except (nvml.NVMLError, AttributeError, TypeError):
            return None
        return self._names.get(uuid, "")

    def _handle(self, data: Any) -> None:
        nvml = self.nvml
        self.stats.events += 1
        etype = int(data.eventType)
        xid_bit = int(getattr(nvml, "nvmlEventTypeXidCriticalError", _XID_EVENT))
        dbe_bit = int(getattr(nvml, "nvmlEventTypeDoubleBitEccError", _DBE_EVENT))
        rec_bit = int(getattr(nvml, "nvmlEventTypeGpuRecoveryAction", _RECOVERY_EVENT))
        name = self._gpu_of(data)
        if name == "":
            self.stats.ignored_events += 1
            self.limited.warning(("other-gpu",), "health event for a GPU this plugin does not serve", {})
            return
        if etype & xid_bit:
            xid = int(data.eventData)
            bucket = self.options.bucket(xid)
            action = self.options.action(xid)
            entry = load_catalog().get(xid)
            mnemonic = entry.mnemonic if entry is not None else "not in the catalog"
            detail = f"XID {xid} ({mnemonic}, bucket {bucket.value})"
            cause = f"xid-{xid}"
        elif etype & dbe_bit:
            if not self.options.double_bit_ecc:
                self.stats.ignored_events += 1
                return
            xid, bucket, action, cause = -1, None, Action.RESET_GPU, "ecc-dbe"
            detail = "double-bit ECC error"
        elif etype & rec_bit:
            xid, bucket, action, cause, detail = 154, None, Action.READ_DRIVER, "xid-154", "recovery action changed"
        else:
            self.stats.ignored_events += 1
            return
        if name is None:
            # No handle matches and NVML cannot name it: the GPU it came from is likely lost. Probe all;
            # only those NVML cannot reach are marked, never every GPU.
            self.limited.warning(("unnamed", cause), "health event on a GPU NVML cannot name; probing every GPU",
                                 {"cause": cause, "detail": detail})
            self._probe_all(detail)
            return
        if xid >= 0:
            self.xid_counts[(name, xid, bucket.value if bucket is not None else "")] += 1
        self.limited.warning((name, cause), "GPU health event", {"gpu": name, "cause": cause, "detail": detail,
                                                               "required_action": action.value})
        if action is Action.READ_DRIVER:
            self._check_driver(name, self._read(name), cause)
            self.stats.ignored_events += 0 if name in self._faults else 1
            return
        if action is Action.CHECK_LINKS:
            self.stats.ignored_events += 1
            self._read_links(name, cause)
            return
        if not action.unhealthy:
            self.stats.ignored_events += 1
            return
        self._fault(name, action, cause, detail, self._read(name))

    # -- the thread ------------------------------------------------------------
    def _sleep_backoff(self, backoff: Backoff) -> None:
        self.stats.backoff_ceilings.append(backoff.ceiling)
        d = backoff.next()
        self.stats.backoffs.append(d)
        del self.stats.backoffs[:-64], self.stats.backoff_ceilings[:-64]
        self._stop.wait(d)

    def _run(self) -> None:
        nvml = self.nvml
        timeout_code = self._err("NVML_ERROR_TIMEOUT", 10)
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        backoff = Backoff(self.options.backoff_initial_s, self.options.backoff_max_s)
        initialised = False
        errors = 0
        try:
            while not self._stop.is_set():
                try:
                    if not initialised:
                        try:
                            nvml.nvmlInit()
                            initialised = True
                        except nvml.NVMLError as e:
                            for name in self._uuids:
                                self._fault(name, Action.RESET_GPU, "lost", f"nvmlInit failed: {e}",
                                            Evidence(answers=False))
                            self._flush()
                            self._sleep_backoff(backoff)
                            continue
                    if self._event_set is None:
                        self._event_set = self._build_set()
                        self._flush()
                        release_free_heap("NVML event registration")
                    self._check_recovery()
                    self._flush()
                    self.limited.flush()
                    self.stats.wait_calls += 1
                    started = self.clock()
                    try:
                        data = wait(self._event_set, self.options.wait_timeout_ms)
                    except nvml.NVMLError as e:
                        if self._code(e) == timeout_code:
                            errors = 0
                            if self.clock() - started < self.options.wait_timeout_ms / 2000.0:
                                self._sleep_backoff(backoff)  # a "timeout" that did not wait: no spinning
                            else:
                                backoff.reset()
                            continue
                        errors += 1
                        self.stats.wait_errors += 1
                        if errors & (errors - 1) == 0:  # 1, 2, 4, 8...: do not flood the log
                            log.warning("waiting for GPU health events failed; backing off",
                                        extra={"reason": str(e), "failures": errors})
                        self._probe_all(f"event wait failed: {e}")
                        self._flush()
                        if errors % max(1, self.options.rebuild_after_errors) == 0:
                            self.stats.rebuilds += 1
                            self._free_set()
                        self._sleep_backoff(backoff)
                        continue
                    errors = 0
                    backoff.reset()
                    self._handle(data)
                    self._flush()
                except Exception:
                    log.exception("GPU health loop error; backing off")
                    self._free_set()
                    self._sleep_backoff(backoff)
        finally:
            self._free_set()
            if initialised:
                try:
                    nvml.nvmlShutdown()
                except Exception as e:  # noqa: BLE001
                    log.debug("nvmlShutdown failed", extra={"reason": str(e)})
