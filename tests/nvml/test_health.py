"""GPU health: the monitor thread on the NVML double: XIDs by bucket, recovery on evidence, failures back off.

Real (small) time values: the monitor is a real thread on the fake NVML's
blocking event wait. Nothing here sleeps through a quiet period to prove a
GPU went unhealthy, and nothing asserts how fast anything happened
(benchmarks/health_bench.py measures that).
"""

from __future__ import annotations

import asyncio
import queue
import time

import pynvml
import pytest

from allocator.topology import HEALTHY, UNHEALTHY
from plugin.health.catalog import OLD_APPLICATION_XIDS
from plugin.health.monitor import GpuHealthMonitor
from plugin.health.options import GpuHealthOptions
from plugin.backoff import Backoff
from plugin.sources import load_simulated
from topo_testkit.fake_nvml import FakeNvml
from plugin.sources.nvml_gpus import NvmlGpuSource

FAST = {"wait_timeout_ms": 20}


class Recorder:
    """Collects `on_change` snapshots (called in the monitor thread) with their arrival time."""

    def __init__(self) -> None:
        self.q: queue.Queue = queue.Queue()
        self.seen: list[tuple[float, dict[str, str]]] = []

    def __call__(self, health) -> None:
        self.reasons = {n: h.reason for n, h in health.items()}
        self.q.put((time.monotonic(), {n: h.health for n, h in health.items()}))

    def wait_for(self, pred, timeout: float = 3.0) -> tuple[float, dict[str, str]]:
        deadline = time.monotonic() + timeout
        while True:
            for t, h in self.seen:
                if pred(h):
                    self.seen.remove((t, h))
                    return t, h
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no health change matched within {timeout}s; seen {self.seen}")
            try:
                self.seen.append(self.q.get(timeout=left))
            except queue.Empty:
                pass


@pytest.fixture
def rig(tmp_path):
    """(fake, gpus, start(options) -> (monitor, recorder)); monitors are stopped afterwards."""
    fake = FakeNvml(load_simulated("dgx-a100"))
    gpus = NvmlGpuSource(nvml=fake, sysfs_root=str(tmp_path)).load().gpus
    monitors: list[GpuHealthMonitor] = []

    def start(options: GpuHealthOptions | None = None, register: bool = True):
        rec = Recorder()
        mon = GpuHealthMonitor(fake, gpus, options or GpuHealthOptions(**FAST), rec)
        monitors.append(mon)
        mon.start()
        if register:
            assert fake.wait_registered(timeout=5.0), "monitor never registered the GPUs"
        return mon, rec

    yield fake, gpus, start
    for m in monitors:
        assert m.stop(timeout=5.0)
    assert fake.init_count == 0, "the monitor must shut NVML down"
    assert fake.live_event_sets == 0, "the monitor must free its event set"


def unhealthy(name):
    return lambda h: h[name] == UNHEALTHY


def healthy(name):
    return lambda h: h[name] == HEALTHY


def test_critical_xid_marks_the_gpu_unhealthy_at_once(rig):
    fake, _, start = rig
    mon, rec = start(GpuHealthOptions(quiet_period_s=60, **FAST))
    assert fake.inject_xid("GPU3", 79) == 1
    _, h = rec.wait_for(unhealthy("GPU3"))
    assert [n for n, v in h.items() if v != HEALTHY] == ["GPU3"]
    assert mon.health()["GPU3"] == UNHEALTHY
    assert rec.reasons["GPU3"].startswith("xid-79: restart node (XID 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")


def test_catalog_application_xids_change_nothing_but_109_needs_a_reset(rig):
    fake, _, start = rig
    mon, rec = start()
    assert OLD_APPLICATION_XIDS == {13, 31, 43, 45, 68, 109}
    for xid in sorted(OLD_APPLICATION_XIDS - {109}):
        fake.inject_xid("GPU0", xid)
    fake.inject_xid("GPU1", 109)  # events are handled in order: once GPU1 is marked, the others were seen
    _, h = rec.wait_for(unhealthy("GPU1"))
    assert h["GPU0"] == HEALTHY
    assert mon.stats.ignored_events == len(OLD_APPLICATION_XIDS) - 1
    assert rec.reasons["GPU1"].startswith("xid-109: reset GPU")
    assert mon.xid_counts[("GPU0", 13, "RESTART_APP")] == 1 and mon.xid_counts[("GPU1", 109, "RESET_GPU")] == 1


def test_configured_xids(rig):
    fake, _, start = rig
    opts = GpuHealthOptions.from_config({"ignoredXids": [79], "criticalXids": [13],
                                         "xidBuckets": {"31": "restart_bm"}}, **FAST)
    mon, rec = start(opts)
    fake.inject_xid("GPU0", 79)  # ignored now
    fake.inject_xid("GPU1", 31)  # the bucket override
    fake.inject_xid("GPU2", 13)  # critical wins over the catalog's RESTART_APP
    _, h = rec.wait_for(lambda h: h["GPU1"] == h["GPU2"] == UNHEALTHY)
    assert h["GPU0"] == HEALTHY
    assert rec.reasons["GPU1"].startswith("xid-31: restart node") and rec.reasons["GPU2"].startswith("xid-13: reset GPU")


def test_double_bit_ecc_marks_unhealthy_unless_disabled(rig):
    fake, _, start = rig
    _, rec = start()
    fake.inject_double_bit_ecc("GPU5")
    rec.wait_for(unhealthy("GPU5"))


def test_double_bit_ecc_can_be_ignored(rig):
    fake, _, start = rig
    mon, rec = start(GpuHealthOptions(double_bit_ecc=False, **FAST))
    assert fake.inject_double_bit_ecc("GPU5") == 0  # not even registered for it
    fake.inject_xid("GPU6", 79)
    _, h = rec.wait_for(unhealthy("GPU6"))
    assert h["GPU5"] == HEALTHY


def test_recovers_after_the_quiet_period(rig):
    fake, _, start = rig
    mon, rec = start(GpuHealthOptions(quiet_period_s=0.3, **FAST))
    fake.inject_xid("GPU2", 48)  # reset GPU; the driver's recovery action reads none: healthy after the quiet period
    t1, _ = rec.wait_for(unhealthy("GPU2"))
    t2, h = rec.wait_for(healthy("GPU2"), timeout=10.0)
    assert t2 - t1 >= 0.3 - 0.05, "recovered before the quiet period"
    assert all(v == HEALTHY for v in h.values())
    assert mon.stats.recoveries == 1


def test_a_new_event_restarts_the_quiet_period(rig):
    fake, _, start = rig
    _, rec = start(GpuHealthOptions(quiet_period_s=0.4, **FAST))
    fake.inject_xid("GPU2", 46)
    t1, _ = rec.wait_for(unhealthy("GPU2"))
    time.sleep(0.25)
    t_again = time.monotonic()
    fake.inject_xid("GPU2", 62)
    t2, _ = rec.wait_for(healthy("GPU2"), timeout=10.0)
    assert t2 - t_again >= 0.4 - 0.05, "recovered before a full quiet period after the last event"


def test_no_recovery_while_nvml_does_not_answer(rig):
    fake, _, start = rig
    mon, rec = start(GpuHealthOptions(quiet_period_s=0.1, probe_interval_s=0.05, **FAST))
    fake.lose("GPU4")
    fake.inject_xid("GPU4", 46)
    rec.wait_for(unhealthy("GPU4"))
    time.sleep(0.5)  # several quiet periods: still lost
    assert mon.health()["GPU4"] == UNHEALTHY
    fake.restore("GPU4")  # back after being lost: a reset
    rec.wait_for(healthy("GPU4"), timeout=10.0)


def test_a_gpu_without_a_handle_at_start_is_unhealthy_then_recovers(rig):
    fake, _, start = rig
    fake.lose("GPU1")
    mon, rec = start(GpuHealthOptions(quiet_period_s=0.1, probe_interval_s=0.05, **FAST), register=False)
    rec.wait_for(unhealthy("GPU1"))
    fake.restore("GPU1")
    rec.wait_for(healthy("GPU1"), timeout=10.0)
    assert fake.wait_registered(["GPU1"], timeout=3.0), "a recovered GPU is watched again"


def test_registration_errors(rig):
    fake, _, start = rig
    fake.register_error = {"GPU2": pynvml.NVML_ERROR_UNKNOWN, "GPU3": pynvml.NVML_ERROR_NOT_SUPPORTED}
    mon, rec = start(GpuHealthOptions(quiet_period_s=60, **FAST), register=False)
    _, h = rec.wait_for(unhealthy("GPU2"))
    assert h["GPU3"] == HEALTHY  # too old to deliver events: logged, not condemned (as NVIDIA)


def test_an_xid_79_on_a_lost_gpu_marks_that_gpu_only(rig):
    """The event carries the device handle: matched against the handles of registration, no UUID needed."""
    fake, _, start = rig
    mon, rec = start(GpuHealthOptions(quiet_period_s=60, **FAST))
    fake.lose("GPU5")  # nvmlDeviceGetUUID(handle) now fails with GPU_IS_LOST
    fake.inject_xid("GPU5", 79)
    _, h = rec.wait_for(unhealthy("GPU5"))
    assert [n for n, v in h.items() if v != HEALTHY] == ["GPU5"]


def test_an_event_no_handle_matches_probes_and_marks_only_the_lost_gpus(rig):
    fake, _, start = rig
    mon, rec = start(GpuHealthOptions(quiet_period_s=60, **FAST))
    fake.lose("GPU6")
    fake.inject_xid(None, 79)
    _, h = rec.wait_for(unhealthy("GPU6"))
    assert [n for n, v in h.items() if v != HEALTHY] == ["GPU6"]


def test_failing_wait_backs_off_and_never_spins(rig):
    fake, _, start = rig
    fake.fail_event_wait(pynvml.NVML_ERROR_UNKNOWN)  # until cleared
    mon, _ = start(GpuHealthOptions(**FAST))  # default backoff: 0.5 s, doubling, 30 s cap
    deadline = time.monotonic() + 10
    while fake.calls["nvmlEventSetWait"] < 1:  # the first wait, however loaded the machine
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.5)
    calls = fake.calls["nvmlEventSetWait"]
    assert calls <= 3, f"{calls} waits in about 0.5 s: a spinning loop"  # a loaded machine only makes fewer
    # A failing wait says nothing about the GPUs: they answer, so they stay healthy.
    assert all(v == HEALTHY for v in mon.health().values())


def test_backoff_doubles_up_to_the_cap_then_resumes(rig):
    fake, _, start = rig
    fake.fail_event_wait(pynvml.NVML_ERROR_UNKNOWN)
    mon, rec = start(GpuHealthOptions(backoff_initial_s=0.02, backoff_max_s=0.08, **FAST))
    deadline = time.monotonic() + 3
    while len(mon.stats.backoffs) < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert mon.stats.backoff_ceilings[:5] == [0.02, 0.04, 0.08, 0.08, 0.08]
    assert all(0 <= d <= c for d, c in zip(mon.stats.backoffs, mon.stats.backoff_ceilings)), "full jitter"
    assert mon.stats.rebuilds >= 1  # the event set is rebuilt after repeated failures
    fake.fail_event_wait(None)
    assert fake.wait_registered(timeout=3.0)
    fake.inject_xid("GPU7", 79)
    rec.wait_for(unhealthy("GPU7"))


def test_a_timeout_that_does_not_wait_is_no_busy_loop(rig):
    fake, _, start = rig
    fake.fail_event_wait(pynvml.NVML_ERROR_TIMEOUT)  # returns "timeout" at once, forever
    start(GpuHealthOptions(wait_timeout_ms=200))
    time.sleep(0.5)
    assert fake.calls["nvmlEventSetWait"] <= 3


def test_quiet_operation_is_one_wait_per_timeout(rig):
    fake, _, start = rig
    start(GpuHealthOptions(wait_timeout_ms=100))
    before = fake.calls["nvmlEventSetWait"]
    time.sleep(0.5)
    assert fake.calls["nvmlEventSetWait"] - before <= 7


def test_failing_wait_probes_the_gpus_and_marks_only_the_lost_one(rig):
    fake, _, start = rig
    mon, rec = start(GpuHealthOptions(quiet_period_s=60, **FAST))
    fake.lose("GPU0")  # no event says so; only the probe after a failed wait can tell
    fake.fail_event_wait(pynvml.NVML_ERROR_UNKNOWN, times=1)
    _, h = rec.wait_for(unhealthy("GPU0"))
    assert [n for n, v in h.items() if v != HEALTHY] == ["GPU0"]
    assert mon.stats.wait_errors == 1


def test_nvml_init_failing_in_the_thread_condemns_all_until_it_works(rig):
    fake, _, start = rig
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    mon, rec = start(GpuHealthOptions(quiet_period_s=0.05, backoff_initial_s=0.05, backoff_max_s=0.05, **FAST),
                     register=False)
    rec.wait_for(lambda h: all(v == UNHEALTHY for v in h.values()))
    fake.init_error = None
    rec.wait_for(lambda h: all(v == HEALTHY for v in h.values()), timeout=10.0)


def test_stop_joins_the_thread(rig):
    fake, _, start = rig
    mon, _ = start(GpuHealthOptions(wait_timeout_ms=200))
    assert mon.stop(timeout=10.0)
    assert not mon.running


def test_stop_during_a_long_backoff_is_prompt(rig):
    fake, _, start = rig
    fake.fail_event_wait(pynvml.NVML_ERROR_UNKNOWN)
    mon, _ = start(GpuHealthOptions(backoff_initial_s=10, backoff_max_s=30, **FAST))
    deadline = time.monotonic() + 3
    while not mon.stats.backoffs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mon.stop(timeout=5.0), "stop waited for the 10 s backoff"


class _Ceiling:
    """A random source that always draws the top of the range: the backoff's ceilings themselves."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_backoff_sequence():
    b = Backoff(0.5, 30, rng=_Ceiling())
    assert [b.next() for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    b.reset()
    assert b.next() == 0.5


def test_options_from_config():
    assert GpuHealthOptions.from_config(None) == GpuHealthOptions()
    o = GpuHealthOptions.from_config({"disabled": True, "ignoredXids": [1, 2], "criticalXids": [2],
                                      "recoveryQuietPeriodSeconds": 5, "stateDirectory": "/var/lib/x"})
    assert (o.enabled, o.ignored_xids, o.critical_xids, o.quiet_period_s) == (False, {1, 2}, {2}, 5.0)
    assert o.state_directory == "/var/lib/x"
    assert o.is_critical_xid(2) and not o.is_critical_xid(1) and o.is_critical_xid(79)
    assert not GpuHealthOptions.from_config({"ignoredXids": []}).is_critical_xid(13)  # the catalog: RESTART_APP
    with pytest.raises(ValueError):
        GpuHealthOptions(quiet_period_s=-1)
    with pytest.raises(ValueError, match=r"gpus.health.xidBuckets.48: 'RESET_GUP' .*did you mean RESET_GPU"):
        GpuHealthOptions.from_config({"xidBuckets": {"48": "RESET_GUP"}})


async def test_source_watch_publishes_health_changes_at_once(tmp_path):
    fake = FakeNvml(load_simulated("dgx-h100"))
    src = NvmlGpuSource(nvml=fake, sysfs_root=str(tmp_path),
                        health=GpuHealthOptions(quiet_period_s=0.3, wait_timeout_ms=20))
    current = src.load()
    published: asyncio.Queue = asyncio.Queue()
    task = asyncio.create_task(src.watch(current, published.put_nowait))
    assert await asyncio.to_thread(fake.wait_registered, None, 5.0)
    fake.inject_xid("GPU6", 48)
    topo = await asyncio.wait_for(published.get(), 10)
    assert topo.device("GPU6").health == UNHEALTHY
    assert topo.device("GPU6").health_reason.startswith("xid-48: reset GPU")
    assert topo.links == current.links and [d.name for d in topo.devices] == [d.name for d in current.devices]
    topo = await asyncio.wait_for(published.get(), 10)
    assert topo.device("GPU6").health == HEALTHY and topo == current
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fake.init_count == 0 and fake.live_event_sets == 0


async def test_disabled_health_starts_no_thread(tmp_path):
    fake = FakeNvml(load_simulated("dgx-h100"))
    src = NvmlGpuSource(nvml=fake, sysfs_root=str(tmp_path), health=GpuHealthOptions(enabled=False))
    task = asyncio.create_task(src.watch(src.load(), lambda _: None))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fake.calls["nvmlEventSetCreate"] == 0
