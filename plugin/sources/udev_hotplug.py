"""Hot-plug: udev events (and, optionally, NIC link changes) trigger a debounced rescan.

Why rescan-and-diff rather than applying events: one `echo 8 >
sriov_numvfs` produces dozens of uevents (8 PCI adds, 8 binds, 8 netdev
adds, renames, RDMA adds) and their order is not ours to rely on. So every
relevant event only "kicks" a debouncer; once the bus has been quiet for
`debounce_s` (or `max_delay_s` after the first event, so a storm cannot
starve it) one full rescan runs in a worker thread, and a new topology is
published only when it differs from the last one (the Intel device plugin
framework's Notifier model). Rescan errors are logged and the last good
topology stays.

Where udev cannot be used (no libudev, no netlink socket in the container,
pyudev missing) the watcher logs why and falls back to a slow periodic
rescan; tests replace the monitor (`monitor_factory`: udev is the hardware
boundary, `tests/support/topo_testkit/fake_udev.py`) and need no udev at all.

Link state is not a uevent (carrier changes arrive over rtnetlink), so with
`link_poll_s` set the watcher polls the operstate of the NICs' netdevs (a few
small sysfs reads) and kicks a rescan when one changes: the rescan then
marks NICs on a down link unhealthy (see `sysfs_nics.discover_nics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from allocator.topology import NodeTopology

from ..watch.event_wait import wait_event
from .base import Publish

log = logging.getLogger(__name__)

SUBSYSTEMS = ("pci", "net", "infiniband")
#: Actions that may change what we discover. bind/unbind: a VF moved to vfio-pci; move: a netdev rename.
ACTIONS = frozenset({"add", "remove", "change", "bind", "unbind", "move", "online", "offline"})


@dataclass(frozen=True)
class HotplugEvent:
    action: str
    subsystem: str
    sys_path: str = ""

    def __str__(self) -> str:
        return f"{self.subsystem} {self.action} {self.sys_path}".rstrip()


class UdevUnavailable(RuntimeError):
    """udev cannot be monitored here; the message says why."""


class UdevMonitor:
    """A pyudev netlink monitor on some subsystems, readable from an event loop."""

    def __init__(self, subsystems: Sequence[str] = SUBSYSTEMS):
        try:
            import pyudev  # noqa: PLC0415 (pyudev optional: no udev, no hot-plug)
        except ImportError as e:  # pragma: no cover - pyudev is a dependency
            raise UdevUnavailable(f"pyudev is not installed ({e})") from None
        try:
            self._context = pyudev.Context()
            self._monitor = pyudev.Monitor.from_netlink(self._context)
            for s in subsystems:
                self._monitor.filter_by(s)
            self._monitor.start()
        except Exception as e:  # noqa: BLE001 (libudev missing, netlink refused (no CAP_NET_ADMIN / no host netns)...)
            raise UdevUnavailable(f"{type(e).__name__}: {e}") from None

    def fileno(self) -> int:
        return self._monitor.fileno()

    def read(self) -> list[HotplugEvent]:
        """Every event queued now (non-blocking)."""
        out: list[HotplugEvent] = []
        while True:
            dev = self._monitor.poll(timeout=0)
            if dev is None:
                return out
            out.append(HotplugEvent(dev.action or "", dev.subsystem or "", dev.sys_path or ""))

    def close(self) -> None:
        # pyudev has no stop(): dropping the last reference unrefs the libudev monitor and its socket.
        self._monitor = None
        self._context = None


MonitorFactory = Callable[[Sequence[str]], Any]


class HotplugWatcher:
    """Turns device events into debounced rescans and publishes changed topologies."""

    def __init__(
        self,
        rescan: Callable[[], NodeTopology],
        publish: Publish,
        *,
        debounce_s: float = 0.5,
        max_delay_s: float = 5.0,
        fallback_interval_s: float = 30.0,
        periodic_s: float | None = None,
        link_poll_s: float | None = None,
        link_states: Callable[[], Mapping[str, str]] | None = None,
        use_udev: bool = True,
        monitor_factory: MonitorFactory = UdevMonitor,
        subsystems: Sequence[str] = SUBSYSTEMS,
    ):
        """`rescan` is blocking (it runs in a worker thread); `publish` is called on the loop.

        `periodic_s`: also rescan this often with udev working (None: only on events).
        `fallback_interval_s`: how often to rescan when udev is unavailable (or `use_udev` off).
        `link_poll_s` + `link_states`: poll link states and rescan when one changes.
        """
        self._rescan_fn = rescan
        self._publish = publish
        self.debounce_s = debounce_s
        self.max_delay_s = max_delay_s
        self.fallback_interval_s = fallback_interval_s
        self.periodic_s = periodic_s
        self.link_poll_s = link_poll_s
        self._link_states = link_states
        self.use_udev = use_udev
        self._factory = monitor_factory
        self.subsystems = tuple(subsystems)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kick: asyncio.Event | None = None
        self._reasons: list[str] = []
        #: "udev" or "polling" once running; why udev is not used, if it is not.
        self.mode = "stopped"
        self.udev_error: str | None = None
        self.rescans = 0
        self.published = 0
        self.current: NodeTopology | None = None

    # -- events ------------------------------------------------------------
    def _on_event(self, ev: HotplugEvent) -> None:
        if ev.subsystem not in self.subsystems or ev.action not in ACTIONS:
            return
        log.debug("hot-plug event: %s", ev)
        self.kick(str(ev))

    def kick(self, reason: str) -> None:
        """Ask for a rescan (on the loop thread)."""
        self._reasons.append(reason)
        if self._kick is not None:
            self._kick.set()

    # -- main loop ------------------------------------------------------------
    async def run(self, current: NodeTopology) -> None:
        """Run until cancelled. `current` is the topology already being served."""
        self._loop = asyncio.get_running_loop()
        self._kick = asyncio.Event()
        self.current = current
        monitor = self._open_monitor()
        tasks: list[asyncio.Task] = []
        if self.link_poll_s and self._link_states is not None:
            tasks.append(asyncio.create_task(self._poll_links(), name="nic-link-poll"))
        try:
            while True:
                interval = self.periodic_s if monitor is not None else self.fallback_interval_s
                if interval:
                    if not await wait_event(self._kick, interval):
                        self._reasons.append("periodic rescan")
                else:
                    await self._kick.wait()
                await self._debounce()
                reasons, self._reasons = self._reasons, []
                await self._rescan(reasons)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            if monitor is not None:
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(monitor.fileno())
                monitor.close()
            self.mode = "stopped"

    def _open_monitor(self) -> Any | None:
        assert self._loop is not None
        if not self.use_udev:
            self.mode = "polling"
            log.info("udev hot-plug off: rescanning every %ss", self.fallback_interval_s)
            return None
        try:
            monitor = self._factory(self.subsystems)
            self._loop.add_reader(monitor.fileno(), self._on_readable, monitor)
        except Exception as e:  # noqa: BLE001 (no udev events: fall back to polling)
            self.udev_error = str(e)
            self.mode = "polling"
            log.warning("udev is not available (%s): hot-plug falls back to a rescan every %ss",
                        e, self.fallback_interval_s)
            return None
        self.mode = "udev"
        log.info("watching udev %s events for hot-plug", "/".join(self.subsystems))
        return monitor

    def _on_readable(self, monitor: Any) -> None:
        try:
            events = monitor.read()
        except Exception as e:  # noqa: BLE001 (a broken socket must not kill the loop)
            log.warning("reading udev events failed: %s", e)
            self.kick("udev read error")
            return
        for ev in events:
            self._on_event(ev)

    async def _debounce(self) -> None:
        """Wait until events stop for `debounce_s` (at most `max_delay_s` after the first)."""
        assert self._kick is not None
        start = time.monotonic()
        self._kick.clear()
        while True:
            left = self.max_delay_s - (time.monotonic() - start)
            if left <= 0:
                return
            if not await wait_event(self._kick, min(self.debounce_s, left)):
                return
            self._kick.clear()

    async def _rescan(self, reasons: list[str]) -> None:
        self.rescans += 1
        try:
            topology = await asyncio.to_thread(self._rescan_fn)
        except Exception as e:
            log.error("rescan after %s failed, keeping the last topology: %s",
                      _summary(reasons), e, exc_info=log.isEnabledFor(logging.DEBUG))
            return
        if topology == self.current:
            log.debug("rescan after %s: no change", _summary(reasons))
            return
        log.info("rescan after %s: topology changed", _summary(reasons))
        self.current = topology
        self.published += 1
        self._publish(topology)

    async def _poll_links(self) -> None:
        assert self._link_states is not None and self.link_poll_s
        last: Mapping[str, str] | None = None
        while True:
            states: Mapping[str, str] | None
            try:
                states = await asyncio.to_thread(self._link_states)
            except Exception as e:  # noqa: BLE001 (keep the last states; the next poll tries again)
                log.warning("reading NIC link states failed: %s", e)
                states = last
            if last is not None and states != last:
                changed = sorted(k for k in set(states or {}) | set(last) if (states or {}).get(k) != last.get(k))
                self.kick("link state of " + ", ".join(changed))
            last = states
            await asyncio.sleep(self.link_poll_s)


def _summary(reasons: list[str]) -> str:
    if not reasons:
        return "a request"
    if len(reasons) == 1:
        return reasons[0]
    return f"{len(reasons)} events ({reasons[0]}, ...)"
