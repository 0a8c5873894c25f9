"""A simulated GPU's driver facts (`driver:` in a node file) give the health the NVML policy gives.

The file is edited between loads as the driver would change its answers; a fake clock stands
for time (the quiet period). What is checked is what the kubelet and the DRA slice get: the
GPU's health and reason (the taint value is formatted from the reason).
"""

from __future__ import annotations

import asyncio

import pytest

from plugin.health.options import GpuHealthOptions
from plugin.health.policy import taint_value
from plugin.sources import TopologyError
from plugin.sources.simulated import load_simulated, load_simulated_with_driver
from plugin.sources.simulated.driver_health import SimulatedHealth
from plugin.sources.simulated.source import SimulatedSource

HEAD = "apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\n"
QUIET = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Node:
    """A node file with two GPUs; `edit(driver0, boot)` rewrites GPU0's `driver:` block and the boot ID."""

    def __init__(self, tmp_path, options: GpuHealthOptions | None = None):
        self.path = tmp_path / "node.yaml"
        self.clock = Clock()
        self.health = SimulatedHealth(options or GpuHealthOptions(quiet_period_s=QUIET), clock=self.clock)

    def edit(self, driver0: str | None, boot: str = "boot-1") -> None:
        gpu0 = "{name: GPU0}" if driver0 is None else f"{{name: GPU0, driver: {driver0}}}"
        self.path.write_text(f"{HEAD}bootId: {boot}\ngpus:\n  - {gpu0}\n  - {{name: GPU1}}\n")

    def see(self, driver0: str | None = None, boot: str = "boot-1", after_s: float = 0.0) -> tuple[str, str]:
        """Edit, let `after_s` pass, load: GPU0's (health, reason)."""
        self.edit(driver0, boot)
        self.clock.now += after_s
        topo = self.health.apply(*load_simulated_with_driver(str(self.path)))
        gpu1 = topo.device("GPU1")
        assert (gpu1.health, gpu1.health_reason) == ("Healthy", "")  # never touched by GPU0's faults
        d = topo.device("GPU0")
        return d.health, d.health_reason


HEALTHY = ("Healthy", "")
XID48 = "xid-48: reset GPU (XID 48 (ROBUST_CHANNEL_GPU_ECC_DBE, bucket WORKFLOW_XID_48))"


def test_reset_gpu_xid_without_the_field_needs_the_pending_remap_applied(tmp_path):
    n = Node(tmp_path)
    assert n.see("{xids: [], remapPending: false}") == HEALTHY
    assert n.see("{xids: [48], remapPending: true}") == ("Unhealthy", XID48)
    assert taint_value(XID48) == "xid-48.reset-gpu"
    # Past the quiet period, with NVML answering: still Unhealthy (the rule HAMi reverted).
    assert n.see("{xids: [48], remapPending: true}", after_s=QUIET * 10) == ("Unhealthy", XID48)
    # The remap applied (a reset happened): Healthy again.
    assert n.see("{xids: [48], remapPending: false}", after_s=1) == HEALTHY


def test_evidence_inside_the_quiet_period_waits_for_it_to_end(tmp_path):
    n = Node(tmp_path)
    health, reason = n.see("{xids: [109], lost: true}")
    assert health == "Unhealthy" and reason.startswith("xid-109: reset GPU")
    assert n.see("{xids: [109]}", after_s=1)[0] == "Unhealthy"  # came back, but the quiet period runs
    assert n.see("{xids: [109]}", after_s=QUIET) == HEALTHY


def test_the_recovery_action_field_decides_where_the_driver_has_it(tmp_path):
    n = Node(tmp_path)
    assert n.see("{xids: [48], recoveryAction: 1}")[0] == "Unhealthy"
    assert n.see("{xids: [48], recoveryAction: 1}", after_s=QUIET * 2)[0] == "Unhealthy"
    assert n.see("{xids: [48], recoveryAction: 0, remapPending: true}", after_s=1)[0] == "Unhealthy"
    assert n.see("{xids: [48], recoveryAction: 0, remapPending: false}", after_s=1) == HEALTHY


def test_the_driver_field_alone_marks_a_gpu(tmp_path):
    n = Node(tmp_path)
    health, reason = n.see("{recoveryAction: 2}")
    assert health == "Unhealthy" and reason.startswith("driver: restart node")


def test_restart_app_and_ignore_xids_change_nothing(tmp_path):
    n = Node(tmp_path)
    assert n.see("{xids: [13]}") == HEALTHY
    assert n.see("{xids: [13, 13, 43]}") == HEALTHY


def test_a_node_reboot_xid_needs_a_new_boot_id_not_a_reset(tmp_path):
    n = Node(tmp_path)
    health, reason = n.see("{xids: [62, 79], remapPending: true}")
    assert reason.startswith("xid-79: restart node")  # the more severe action wins
    assert n.see("{xids: [62, 79], remapPending: false}", after_s=QUIET * 2)[0] == "Unhealthy"
    assert n.see("{xids: [62, 79], remapPending: false}", boot="boot-2", after_s=1) == HEALTHY


def test_only_new_xids_are_events_and_removing_them_is_no_evidence(tmp_path):
    n = Node(tmp_path)
    assert n.see("{xids: [48], remapPending: true}")[0] == "Unhealthy"
    assert n.see("{xids: [], remapPending: true}", after_s=QUIET * 2)[0] == "Unhealthy"
    assert n.see(None, after_s=1)[0] == "Unhealthy"  # no driver block: no evidence either
    assert n.see("{remapPending: false}", after_s=1) == HEALTHY  # the pending remap seen applied: a reset


def test_a_repeat_xid_restarts_the_quiet_period_and_seen_entries_are_no_new_events(tmp_path):
    n = Node(tmp_path)
    assert n.see("{xids: [48], remapPending: true}")[0] == "Unhealthy"
    assert n.see("{xids: [48, 48], remapPending: true}", after_s=QUIET - 1)[0] == "Unhealthy"
    assert n.see("{xids: [48, 48], remapPending: false}", after_s=2)[0] == "Unhealthy"  # 2 s after the repeat
    assert n.see("{xids: [48, 48], remapPending: false}", after_s=QUIET) == HEALTHY
    assert n.see("{xids: [48, 48], remapPending: false}", after_s=QUIET) == HEALTHY


def test_config_overrides_apply(tmp_path):
    n = Node(tmp_path, GpuHealthOptions(quiet_period_s=QUIET, ignored_xids=frozenset({48}),
                                        critical_xids=frozenset({13})))
    health, reason = n.see("{xids: [48, 13]}")
    assert health == "Unhealthy" and reason.startswith("xid-13: reset GPU")


def test_a_plain_load_takes_listed_xids_as_faults(tmp_path):
    n = Node(tmp_path)
    n.edit("{xids: [13, 48]}")
    d = load_simulated(str(n.path)).device("GPU0")
    assert (d.health, d.health_reason) == ("Unhealthy", XID48)


@pytest.mark.parametrize("driver, field", [
    ("{xids: [0]}", "gpus[0].driver.xids[0]"),
    ("{recoveryAction: 9}", "gpus[0].driver.recoveryAction"),
    ("{remapPendig: true}", "gpus[0].driver"),
])
def test_bad_driver_facts_name_the_field(tmp_path, driver, field):
    n = Node(tmp_path)
    n.edit(driver)
    with pytest.raises(TopologyError) as e:
        load_simulated(str(n.path))
    assert field in str(e.value) and "node.yaml" in str(e.value)


def test_the_live_source_recovers_when_the_quiet_period_ends_without_an_edit(tmp_path):
    """The evidence is written inside the quiet period; no further edit comes; the probe publishes Healthy."""
    async def run() -> list[tuple[str, str]]:
        n = Node(tmp_path)
        n.edit("{xids: [48], remapPending: true}")
        src = SimulatedSource(str(n.path), debounce_s=0.01,
                              health=GpuHealthOptions(quiet_period_s=0.5, probe_interval_s=0.05))
        seen: list[tuple[str, str]] = []
        done = asyncio.Event()

        def publish(topo):
            d = topo.device("GPU0")
            seen.append((d.health, d.health_reason))
            if d.health == "Healthy":
                done.set()

        first = src.load()
        seen.append((first.device("GPU0").health, first.device("GPU0").health_reason))
        task = asyncio.create_task(src.watch(first, publish))
        await asyncio.sleep(0.1)  # let the watch start
        n.edit("{xids: [48], remapPending: false}")
        await asyncio.wait_for(done.wait(), 30)
        task.cancel()
        return seen

    seen = asyncio.run(run())
    assert seen[0] == ("Unhealthy", XID48) and seen[-1] == HEALTHY
