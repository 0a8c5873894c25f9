"""GPU health: an NVML event loop in its own thread, feeding the asyncio loop; devices recover.

Why this shape (NVIDIA's `internal/rm/health.go` is the anchor, and where it
fails, `../shared/research/nvidia-device-plugin.md` §1.5):

- `nvmlEventSetWait` blocks, so it runs in a thread; changes reach the event
  loop through `loop.call_soon_threadsafe`, and the daemon pushes the new
  list on every open ListAndWatch stream at once.
- Critical XID events and double-bit ECC errors mark a GPU Unhealthy. XIDs
  that are application errors (13, 31, 43, 45, 68, 109) are ignored by
  default, as NVIDIA does; the list is configurable, and `critical_xids`
  wins over it.
- NVIDIA's devices never come back ("FIXME: there is no way to recover from
  the Unhealthy state"). Here an Unhealthy GPU returns to Healthy once no
  new event has come for `quiet_period_s` AND NVML answers for it again
  (handle by UUID plus a memory query); a GPU that still does not answer is
  probed again later and stays Unhealthy meanwhile.
- NVIDIA's loop spins at 100 % CPU when the wait keeps failing (HAMi #2321).
  Here every failure backs off exponentially (capped), probes every GPU (one
  that does not answer is Unhealthy; a failing wait alone proves nothing
  about a GPU), and after a few failures the event set is rebuilt. A wait
  that "times out" far too early counts as a failure too: no busy loop.
- A GPU whose handle cannot be obtained is Unhealthy; one whose driver
  cannot deliver events (NOT_SUPPORTED) is logged and left Healthy, as NVIDIA
  does.

The thread stops within about one wait timeout of `stop()`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocator.topology import HEALTHY, UNHEALTHY, Device

from ..heap import release_free_heap

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_IGNORED_XIDS",
    "Backoff",
    "GpuHealthMonitor",
    "GpuHealthOptions",
    "HealthStats",
    "watch_gpu_health",
]

#: Application errors, not GPU faults (NVIDIA's defaults).
DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_DBE_EVENT = 0x2  # nvmlEventTypeDoubleBitEccError


@dataclass(frozen=True)
class GpuHealthOptions:
    """How GPU health is watched. `from_config` reads the config file's `gpus.health`."""

    enabled: bool = True
    #: XIDs that never mark a GPU unhealthy (replaces the default list when given).
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    #: XIDs that always do, even when also in `ignored_xids`.
    critical_xids: frozenset[int] = frozenset()
    #: Double-bit ECC errors mark the GPU unhealthy.
    double_bit_ecc: bool = True
    #: Seconds without a new event (and NVML answering) before an Unhealthy GPU is Healthy again.
    quiet_period_s: float = 60.0
    #: `nvmlEventSetWait` timeout: also the longest `stop()` waits for the thread.
    wait_timeout_ms: int = 1000
    #: Backoff after a failing wait: initial, doubled each time, capped.
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    #: Rebuild the event set after this many failed waits in a row.
    rebuild_after_errors: int = 3
    #: How often a GPU past its quiet period that does not answer is probed again (default: min(quiet, 5 s)).
    probe_interval_s: float | None = None

    def __post_init__(self) -> None:
        if self.quiet_period_s < 0:
            raise ValueError("GPU health quiet period must be >= 0 seconds")
        if self.wait_timeout_ms <= 0:
            raise ValueError("GPU health wait timeout must be > 0 ms")
        if self.backoff_initial_s <= 0 or self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("GPU health backoff needs 0 < initial <= max")
        object.__setattr__(self, "ignored_xids", frozenset(int(x) for x in self.ignored_xids))
        object.__setattr__(self, "critical_xids", frozenset(int(x) for x in self.critical_xids))

    def is_critical_xid(self, xid: int) -> bool:
        return xid in self.critical_xids or xid not in self.ignored_xids

    @property
    def probe_every_s(self) -> float:
        if self.probe_interval_s is not None:
            return self.probe_interval_s
        return max(min(self.quiet_period_s, 5.0), self.wait_timeout_ms / 1000.0)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None, **overrides: Any) -> GpuHealthOptions:
        """From the config file's `gpus.health` mapping (`disabled`, `ignoredXids`,
        `criticalXids`, `recoveryQuietPeriodSeconds`); keyword overrides win."""
        cfg = cfg or {}
        kw: dict[str, Any] = {}
        if "disabled" in cfg:
            kw["enabled"] = not bool(cfg["disabled"])
        if cfg.get("ignoredXids") is not None:
            kw["ignored_xids"] = frozenset(cfg["ignoredXids"])
        if cfg.get("criticalXids") is not None:
            kw["critical_xids"] = frozenset(cfg["criticalXids"])
        if cfg.get("recoveryQuietPeriodSeconds") is not None:
            kw["quiet_period_s"] = float(cfg["recoveryQuietPeriodSeconds"])
        kw.update(overrides)
        return cls(**kw)


class Backoff:
    """Exponential delays: initial, 2x, 4x ... capped at `cap`; `reset()` after a success."""

    def __init__(self, initial: float, cap: float):
        self.initial = initial
        self.cap = cap
        self._next = initial

    def next(self) -> float:
        d = self._next
        self._next = min(self._next * 2, self.cap)
        return d

    def reset(self) -> None:
        self._next = self.initial


@dataclass
class HealthStats:
    """Counters for tests, logs and metrics."""

    wait_calls: int = 0
    wait_errors: int = 0
    events: int = 0
    ignored_events: int = 0
    recoveries: int = 0
    rebuilds: int = 0
    #: Backoff delays slept, in order (the last 64).
    backoffs: list[float] = field(default_factory=list)


def _str(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class GpuHealthMonitor:
    """Watches `gpus` through NVML in a thread; `on_change({name: health})` after each change.

    `on_change` is called in the monitor thread with the health of every GPU it
    watches; `watch_gpu_health` hops it onto the event loop. Devices without a
    UUID cannot be watched and keep their health.
    """

    def __init__(
        self,
        nvml: Any,
        gpus: Sequence[Device],
        options: GpuHealthOptions,
        on_change: Callable[[dict[str, str]], None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.nvml = nvml
        self.options = options
        self.on_change = on_change
        self.clock = clock
        self.stats = HealthStats()
        self._uuids = {d.name: d.uuid for d in gpus if d.uuid}
        self._names = {u: n for n, u in self._uuids.items()}
        self._health = {d.name: d.health for d in gpus}
        self._published = dict(self._health)
        now = clock()
        self._last_bad = {n: now for n, h in self._health.items() if h != HEALTHY}
        self._next_probe: dict[str, float] = {}
        self._registered: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._err = lambda name, default: getattr(nvml, name, default)

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
        return not t.is_alive()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def health(self) -> dict[str, str]:
        with self._lock:
            return dict(self._health)

    # -- state ---------------------------------------------------------------
    def _bad(self, name: str, reason: str) -> None:
        now = self.clock()
        with self._lock:
            was = self._health.get(name)
            self._health[name] = UNHEALTHY
            self._last_bad[name] = now
            self._next_probe.pop(name, None)
        if was != UNHEALTHY:
            log.warning("GPU marked Unhealthy", extra={"gpu": name, "uuid": self._uuids.get(name), "reason": reason})
        else:
            log.info("GPU still Unhealthy; quiet period restarted", extra={"gpu": name, "reason": reason})

    def _good(self, name: str) -> None:
        with self._lock:
            self._health[name] = HEALTHY
            self._last_bad.pop(name, None)
            self._next_probe.pop(name, None)
        self.stats.recoveries += 1
        log.warning("GPU recovered: Healthy again", extra={"gpu": name, "uuid": self._uuids.get(name),
                                                           "quiet_period_s": self.options.quiet_period_s})

    def _flush(self) -> None:
        with self._lock:
            snap = dict(self._health)
            if snap == self._published:
                return
            self._published = dict(snap)
        try:
            self.on_change(snap)
        except Exception:  # noqa: BLE001 - a bad callback must not kill health watching
            log.exception("GPU health callback failed")

    # -- NVML ----------------------------------------------------------------
    def _code(self, e: BaseException) -> int | None:
        return getattr(e, "value", None)

    def _probe(self, name: str) -> bool:
        """NVML answers for this GPU: a handle by UUID and a memory query succeed."""
        nvml = self.nvml
        try:
            h = nvml.nvmlDeviceGetHandleByUUID(self._uuids[name])
            nvml.nvmlDeviceGetMemoryInfo(h)
        except nvml.NVMLError:
            return False
        return True

    def _probe_all(self, reason: str) -> None:
        for name in self._uuids:
            if not self._probe(name):
                self._bad(name, f"NVML does not answer for it ({reason})")

    def _register(self, name: str, event_set: Any) -> bool:
        """Register `name` in `event_set`; False (and Unhealthy) when that fails for a real reason."""
        nvml = self.nvml
        wanted = int(getattr(nvml, "nvmlEventTypeXidCriticalError", _XID_EVENT))
        if self.options.double_bit_ecc:
            wanted |= int(getattr(nvml, "nvmlEventTypeDoubleBitEccError", _DBE_EVENT))
        try:
            h = nvml.nvmlDeviceGetHandleByUUID(self._uuids[name])
        except nvml.NVMLError as e:
            self._bad(name, f"no NVML handle: {e}")
            return False
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
            self._bad(name, f"cannot register health events: {e}")
            return False
        self._registered.add(name)
        return True

    def _build_set(self) -> Any:
        es = self.nvml.nvmlEventSetCreate()
        self._registered = set()
        for name in self._uuids:
            self._register(name, es)
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
        quiet = self.options.quiet_period_s
        with self._lock:
            due = [n for n, t in self._last_bad.items()
                   if n in self._uuids and now - t >= quiet and now >= self._next_probe.get(n, 0.0)]
        for name in due:
            ok = self._probe(name)
            if ok and name not in self._registered and self._event_set is not None:
                ok = self._register(name, self._event_set)
                if not ok:
                    continue  # _register restarted its quiet period
            if ok:
                self._good(name)
            else:
                with self._lock:
                    self._next_probe[name] = now + self.options.probe_every_s

    def _handle(self, data: Any) -> None:
        nvml = self.nvml
        self.stats.events += 1
        etype = int(data.eventType)
        xid_bit = int(getattr(nvml, "nvmlEventTypeXidCriticalError", _XID_EVENT))
        dbe_bit = int(getattr(nvml, "nvmlEventTypeDoubleBitEccError", _DBE_EVENT))
        if etype & xid_bit:
            xid = int(data.eventData)
            if not self.options.is_critical_xid(xid):
                self.stats.ignored_events += 1
                log.info("XID ignored (application error)", extra={"xid": xid})
                return
            reason = f"XID {xid}"
        elif etype & dbe_bit:
            if not self.options.double_bit_ecc:
                self.stats.ignored_events += 1
                return
            reason = "double-bit ECC error"
        else:
            self.stats.ignored_events += 1
            return
        try:
            uuid = _str(nvml.nvmlDeviceGetUUID(data.device))
        except (nvml.NVMLError, AttributeError, TypeError) as e:
            # NVIDIA does the same: an event we cannot pin on a GPU condemns them all.
            for name in self._uuids:
                self._bad(name, f"{reason} on a GPU NVML cannot name ({e})")
            return
        name = self._names.get(uuid)
        if name is None:
            log.info("health event for a GPU this plugin does not serve", extra={"uuid": uuid, "reason": reason})
            return
        self._bad(name, reason)

    # -- the thread ------------------------------------------------------------
    def _sleep_backoff(self, backoff: Backoff) -> None:
        d = backoff.next()
        self.stats.backoffs.append(d)
        del self.stats.backoffs[:-64]
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
                                self._bad(name, f"nvmlInit failed: {e}")
                            self._flush()
                            self._sleep_backoff(backoff)
                            continue
                    if self._event_set is None:
                        self._event_set = self._build_set()
                        self._flush()
                        release_free_heap("NVML event registration")
                    self._check_recovery()
                    self._flush()
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
                except Exception:  # noqa: BLE001 - the thread must survive anything and not spin
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


async def watch_gpu_health(
    nvml: Any,
    gpus: Sequence[Device],
    options: GpuHealthOptions,
    on_health: Callable[[dict[str, str]], None],
    *,
    started: Callable[[GpuHealthMonitor], None] | None = None,
) -> None:
    """Run a `GpuHealthMonitor` until cancelled; `on_health` runs on this event loop at each change.

    `started` (optional) receives the monitor once its thread runs (tests use it).
    Cancelling stops and joins the thread.
    """
    if not options.enabled or not any(d.uuid for d in gpus):
        await asyncio.Event().wait()
        return
    loop = asyncio.get_running_loop()

    def forward(health: dict[str, str]) -> None:
        try:
            loop.call_soon_threadsafe(on_health, health)
        except RuntimeError:  # loop closed while shutting down
            pass

    monitor = GpuHealthMonitor(nvml, gpus, options, forward)
    monitor.start()
    if started is not None:
        started(monitor)
    try:
        await asyncio.Event().wait()
    finally:
        monitor.request_stop()
        await asyncio.shield(asyncio.to_thread(monitor.stop))
