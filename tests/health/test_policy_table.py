"""The health table: every bucket × driver capability (recovery-action field present or absent) × event order.

Each case runs the real monitor thread on the NVML double with a state directory and a boot ID
file, as the daemon does, and checks what the servers would publish for the faulted GPU (and that
no other GPU moved). "No recovery" is checked after the monitor has read the GPU's evidence past
its quiet period twice (`stats.evaluations`), never after a sleep.

The orders:
- fault: one XID; repeat: the same XID again (nothing more than once);
- reset: the GPU is reset (the driver's field back to none, pending repairs applied, volatile ECC
  counts zeroed); only `reset GPU` faults end;
- restart: the daemon restarts on the same boot: a fault is restored from the state directory;
- reboot: the daemon restarts with a new boot ID: every fault ends;
- clear: the operator's `health clear` file entry: every fault ends, at once;
- override: the config moves the XID to the other side (`xidBuckets` to IGNORE for a fault,
  `criticalXids` for a Healthy bucket).
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass

import pytest
from topo_testkit.fake_nvml import FakeNvml

from allocator.topology import HEALTHY, UNHEALTHY
from plugin.health import store
from plugin.health.catalog import Action, Bucket, load_catalog
from plugin.health.monitor import GpuHealthMonitor
from plugin.health.options import GpuHealthOptions
from plugin.sources import load_simulated
from plugin.sources.nvml_gpus import NvmlGpuSource

GPU = "GPU2"


@dataclass(frozen=True)
class Row:
    bucket: Bucket
    xid: int
    #: What a driver with the field reads after this XID (the action it asks for).
    field: int
    #: What else the driver shows after it (a DBE: a pending row remap and a volatile ECC count).
    facts: dict


ROWS = [
    Row(Bucket.IGNORE, 43, 0, {}),
    Row(Bucket.RESTART_APP, 13, 0, {}),
    Row(Bucket.RESET_GPU, 95, 1, {"volatile_dbe": 1}),
    Row(Bucket.WORKFLOW_XID_48, 48, 1, {"volatile_dbe": 1, "remap_pending": True}),
    Row(Bucket.RESTART_BM, 79, 2, {}),
    Row(Bucket.CONTACT_SUPPORT, 57, 0, {}),
]
ORDERS = ["fault", "repeat", "reset", "restart", "reboot", "clear", "override"]


def expected(row: Row, order: str, field: bool = False) -> tuple[str, Action]:
    """The table of docs/gpu-discovery.md "Health": what the GPU is after `order`.

    `criticalXids` on an XID the driver asks nothing for: where the driver has the field, its "none"
    is the evidence, so the GPU is back after the quiet period; without the field it waits for a reset."""
    action = {Bucket.IGNORE: Action.NONE, Bucket.RESTART_APP: Action.NONE, Bucket.RESET_GPU: Action.RESET_GPU,
              Bucket.WORKFLOW_XID_48: Action.RESET_GPU, Bucket.RESTART_BM: Action.RESTART_NODE,
              Bucket.CONTACT_SUPPORT: Action.CONTACT_SUPPORT}[row.bucket]
    if order == "override":
        action = Action.RESET_GPU if action is Action.NONE else Action.NONE
    if order in ("reboot", "clear") or (order == "reset" and action is Action.RESET_GPU):
        action = Action.NONE
    if order == "override" and action is Action.RESET_GPU and field:
        action = Action.NONE
    return (HEALTHY if action is Action.NONE else UNHEALTHY), action


class Seen:
    def __init__(self) -> None:
        self.q: queue.Queue = queue.Queue()
        self.last: dict = {}

    def __call__(self, health) -> None:
        self.q.put(dict(health))

    def wait(self, pred, timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while not (self.last and pred(self.last)):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no health change matched; last {self.last}")
            try:
                self.last = self.q.get(timeout=left)
            except queue.Empty:
                pass
        return self.last


@pytest.fixture
def rig(tmp_path):
    topo = load_simulated("dgx-a100")
    proc = tmp_path / "proc"
    state = tmp_path / "state"
    FakeNvml.write_boot_id(str(proc), "boot-1")
    made: list[GpuHealthMonitor] = []

    def fake_for(field: bool) -> tuple[FakeNvml, list]:
        fake = FakeNvml(topo, recovery_field=field)
        gpus = NvmlGpuSource(nvml=fake, sysfs_root=str(tmp_path / "sys")).load().gpus
        return fake, gpus

    def start(fake: FakeNvml, gpus, **kw) -> tuple[GpuHealthMonitor, Seen]:
        seen = Seen()
        opts = GpuHealthOptions(quiet_period_s=0.2, wait_timeout_ms=20, probe_interval_s=0.05,
                                state_directory=str(state), proc_root=str(proc), **kw)
        mon = GpuHealthMonitor(fake, gpus, opts, seen)
        made.append(mon)
        mon.start()
        assert fake.wait_registered(timeout=10.0)
        return mon, seen

    def stop(mon: GpuHealthMonitor) -> None:
        assert mon.stop(timeout=10.0)

    yield fake_for, start, stop, proc, state
    for m in made:
        assert m.stop(timeout=10.0)


def settle(mon: GpuHealthMonitor) -> None:
    """Wait until the monitor has judged the faulted GPU's evidence past its quiet period twice."""
    if GPU not in mon.faults():
        return
    start = mon.stats.evaluations
    deadline = time.monotonic() + 20
    while mon.stats.evaluations < start + 2 and GPU in mon.faults():
        assert time.monotonic() < deadline, "the monitor never re-read the GPU's evidence"
        time.sleep(0.01)


def inject(fake: FakeNvml, row: Row, field: bool) -> None:
    fake.set_health_facts(GPU, **row.facts)
    fake.inject_xid(GPU, row.xid, recovery_action=row.field if field else None)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("field", [True, False], ids=["field", "no-field"])
@pytest.mark.parametrize("row", ROWS, ids=[r.bucket.value for r in ROWS])
def test_the_health_table(rig, row, field, order):
    fake_for, start, stop, proc, state = rig
    fake, gpus = fake_for(field)
    assert load_catalog()[row.xid].bucket is row.bucket
    kw: dict = {}
    if order == "override":
        kw = ({"critical_xids": {row.xid}} if expected(row, "fault")[0] == HEALTHY
              else {"xid_buckets": {row.xid: "IGNORE"}})
    mon, seen = start(fake, gpus, **kw)
    want_health, want_action = expected(row, order, field)
    inject(fake, row, field)
    if order == "repeat":
        inject(fake, row, field)
    # The event was handled once the stats count it (ignored ones publish nothing).
    deadline = time.monotonic() + 20
    while mon.stats.events < (2 if order == "repeat" else 1):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    fault_health, _ = expected(row, "override" if order == "override" else "fault")
    if fault_health == UNHEALTHY:
        seen.wait(lambda h: h[GPU].health == UNHEALTHY)
    settle(mon)
    if order == "reset":
        fake.reset_gpu(GPU)
    elif order in ("restart", "reboot"):
        stop(mon)
        if order == "reboot":
            FakeNvml.write_boot_id(str(proc), "boot-2")
            fake.reset_gpu(GPU)  # a reboot resets the GPU: repairs applied, the driver asks for nothing
        mon, seen = start(fake, gpus, **kw)
    elif order == "clear":
        store.add_clear(str(state), [fake.by_name[GPU].uuid])
        assert mon.apply_clear_file() == ([GPU] if fault_health == UNHEALTHY else [])
    if want_health == HEALTHY:
        deadline = time.monotonic() + 20
        while mon.health()[GPU] != HEALTHY:
            assert time.monotonic() < deadline, f"{GPU} never Healthy again; faults {mon.faults()}"
            time.sleep(0.01)
    else:
        settle(mon)
    got = mon.health_map()
    assert got[GPU].health == want_health, got[GPU]
    assert got[GPU].action is want_action
    if want_health == UNHEALTHY:
        assert got[GPU].reason.startswith(f"xid-{row.xid}: {want_action.value} (XID {row.xid} ")
    assert all(h.health == HEALTHY for n, h in got.items() if n != GPU)


def test_clear_entries_present_at_start_are_not_applied_again(rig, tmp_path):
    fake_for, start, _stop, _proc, state = rig
    store.add_clear(str(state), ["all"])
    fake, gpus = fake_for(True)
    mon, seen = start(fake, gpus)
    mon.apply_clear_file(initial=True)
    fake.inject_xid(GPU, 79, recovery_action=2)
    seen.wait(lambda h: h[GPU].health == UNHEALTHY)
    assert mon.apply_clear_file() == []  # the old entry is not a new clear
    assert mon.health()[GPU] == UNHEALTHY


def test_a_driver_asking_for_a_reset_without_any_xid_marks_the_gpu(rig):
    fake_for, start, _stop, _proc, _state = rig
    fake, gpus = fake_for(True)
    fake.set_health_facts("GPU5", recovery_action=4)  # drain and reset, seen at start
    _mon, seen = start(fake, gpus)
    h = seen.wait(lambda h: h["GPU5"].health == UNHEALTHY)
    assert h["GPU5"].reason.startswith("driver: reset GPU")
    fake.reset_gpu("GPU5")
    seen.wait(lambda h: h["GPU5"].health == HEALTHY)


def test_a_pending_repair_keeps_a_gpu_unhealthy_even_when_the_field_reads_none(rig):
    fake_for, start, _stop, _proc, _state = rig
    fake, gpus = fake_for(True)
    mon, seen = start(fake, gpus)
    fake.set_health_facts(GPU, remap_pending=True)
    fake.inject_xid(GPU, 48, recovery_action=0)
    seen.wait(lambda h: h[GPU].health == UNHEALTHY)
    settle(mon)
    assert mon.health()[GPU] == UNHEALTHY
    fake.set_health_facts(GPU, remap_pending=False)
    seen.wait(lambda h: h[GPU].health == HEALTHY)
