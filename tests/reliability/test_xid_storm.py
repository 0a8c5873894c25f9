"""A storm of 10,000 XIDs of mixed buckets across 8 GPUs: absorbed with bounded memory and log volume.

The monitor thread runs on the NVML double with a state directory, as the daemon runs it. Each
GPU gets its own mix (applications' XIDs everywhere, plus the faults of one bucket on six of them),
so the final state is what docs/gpu-discovery.md "Health" says: the most severe action seen, and
the GPUs that only saw application errors still Healthy. Memory: what the monitor holds (XID
counts, rate-limiter windows, faults) is bounded by GPUs × XIDs, not by events, and the Python heap
grows by less than a megabyte over the storm. Log: per-event lines go through the rate limiter
(3 per GPU and cause per minute); one line per transition.
"""

from __future__ import annotations

import logging
import os
import pathlib
import random
import time
import tracemalloc

from topo_testkit.fake_nvml import FakeNvml

from allocator.topology import HEALTHY, UNHEALTHY
from plugin.health.catalog import Action
from plugin.health.monitor import GpuHealthMonitor
from plugin.health.options import GpuHealthOptions
from plugin.sources import load_simulated
from plugin.sources.nvml_gpus import NvmlGpuSource

APP = [13, 31, 43, 8, 94, 45, 63]  # RESTART_APP, IGNORE and the application-side workflow entries
FAULTS = {"GPU2": [48, 95], "GPU3": [109, 119, 120], "GPU4": [79, 46], "GPU5": [79],
          "GPU6": [57, 48], "GPU7": [61, 79, 62]}
WANT = {"GPU0": Action.NONE, "GPU1": Action.NONE, "GPU2": Action.RESET_GPU, "GPU3": Action.RESET_GPU,
        "GPU4": Action.RESTART_NODE, "GPU5": Action.RESTART_NODE, "GPU6": Action.CONTACT_SUPPORT,
        "GPU7": Action.CONTACT_SUPPORT}
EVENTS = 10_000
PLUGIN_DIR = str(pathlib.Path(__file__).resolve().parents[2] / "plugin")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _plugin_heap() -> int:
    """Bytes live now that were allocated by the product's code (plugin/): the monitor's state, not what pytest,
    its workers' channel or this test's own log handler keep (those share the process and are not bounded here)."""
    snap = tracemalloc.take_snapshot().filter_traces([
        tracemalloc.Filter(True, f"{PLUGIN_DIR}{os.sep}*", all_frames=True),
        # Log records are kept by this test's handler; the log's bound is the record count asserted below.
        tracemalloc.Filter(False, f"*{os.sep}logging{os.sep}*", all_frames=True)])
    return sum(s.size for s in snap.statistics("filename"))


def test_a_storm_of_ten_thousand_xids_ends_as_the_table_says(tmp_path):
    fake = FakeNvml(load_simulated("dgx-a100"))
    gpus = NvmlGpuSource(nvml=fake, sysfs_root=str(tmp_path / "sys")).load().gpus
    FakeNvml.write_boot_id(str(tmp_path / "proc"), "boot-1")
    opts = GpuHealthOptions(quiet_period_s=3600, wait_timeout_ms=50, state_directory=str(tmp_path / "state"),
                            proc_root=str(tmp_path / "proc"))
    changes: list[dict] = []
    mon = GpuHealthMonitor(fake, gpus, opts, changes.append)
    lines = Lines()
    logger = logging.getLogger("plugin.health")
    logger.addHandler(lines)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    rng = random.Random(29)
    plan = []
    for i in range(EVENTS):
        gpu = f"GPU{i % 8}"
        xids = APP + FAULTS.get(gpu, [])
        plan.append((gpu, rng.choice(xids)))
    for gpu, xids in FAULTS.items():  # every fault XID at least once, whatever the draw
        plan += [(gpu, x) for x in xids]
    try:
        mon.start()
        assert fake.wait_registered(timeout=10.0)
        tracemalloc.start(25)
        before = _plugin_heap()
        for gpu, xid in plan:
            assert fake.inject_xid(gpu, xid) == 1
        deadline = time.monotonic() + 300
        while mon.stats.events < len(plan):
            assert time.monotonic() < deadline, f"{mon.stats.events} of {len(plan)} events handled"
            time.sleep(0.05)
        grown = _plugin_heap() - before
        tracemalloc.stop()
    finally:
        assert mon.stop(timeout=10.0)
        logger.removeHandler(lines)
        logger.setLevel(old_level)
    got = mon.health_map()
    assert {n: h.action for n, h in got.items()} == WANT
    assert {n for n, h in got.items() if h.health == UNHEALTHY} == {n for n, a in WANT.items() if a.unhealthy}
    assert all(got[n].health == HEALTHY for n in ("GPU0", "GPU1"))
    # Bounded state: counts by (GPU, XID), never by event.
    assert len(mon.xid_counts) <= sum(len(APP) + len(FAULTS.get(f"GPU{i}", [])) for i in range(8))
    assert sum(mon.xid_counts.values()) == len(plan)
    assert grown < 1 << 20, f"the heap grew by {grown} bytes over the storm"
    # Bounded log: per-event lines rate-limited per (GPU, cause), transitions once each, suppression summaries.
    causes = {(g, x) for g, x in plan}
    assert len(lines.records) <= 3 * len(causes) + 3 * 8 + len(causes), len(lines.records)
    transitions = [r for r in lines.records if r.getMessage() in ("GPU marked Unhealthy", "GPU needs more than before")]
    assert len(transitions) <= 3 * 6
    # And what the servers were told: a handful of changes, not one per event.
    assert len(changes) <= 3 * 6
