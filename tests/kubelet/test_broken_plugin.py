"""The real-kubelet checks must catch a broken plugin, not just pass a good one.

Each test runs a deliberately broken variant of our daemon (tests/kubelet/broken_plugin.py,
a monkeypatch in the daemon's process; the product has no such switch) through the same
harness scenario and the same checks as test_harness.py, and asserts that the checks
report the break. The findings are printed (run with -s to see them).
"""

from __future__ import annotations

import pathlib

import pytest
from kubelet_testlib import (
    ADMISSION_PODS,
    GPU,
    MAX_REGISTRATION_S,
    TAP_DIR,
    admission_run,
    check_preferred_calls,
    daemon_argv,
    machine_for,
    reregistration_steps,
    start_kubelet,
    start_plugin,
    wait_resource,
)

# The first test of a fresh machine builds the harness/kubelet (minutes on 2 cores;
# scripts/kubelet_tests.sh prepare does it up front). Each run below has its own timeout.
pytestmark = pytest.mark.timeout(1500)

BROKEN = str(pathlib.Path(__file__).resolve().parent / "broken_plugin.py")


def test_one_id_too_many_from_get_preferred_allocation_is_caught(harness, tmp_path):
    argv = daemon_argv("dgx-a100", plugin_dir=TAP_DIR, wrapper=[BROKEN, "preferred-one-too-many"])
    run, _ = admission_run(harness, tmp_path, "dgx-a100", "single-numa-node", "container", ADMISSION_PODS, argv=argv)
    problems = [p for step in run.admits().values() for p in check_preferred_calls(step)]
    print("\nbroken plugin (one ID too many), the harness reports:\n  " + "\n  ".join(problems))
    assert any("for allocation_size" in p for p in problems)
    # ... and the kubelet silently dropped part of the answer (an arbitrary subset is kept).
    assert problems


def test_registering_before_serving_is_caught(harness, tmp_path):
    simulate = "dgx-a100"
    argv = daemon_argv(simulate, wrapper=[BROKEN, "register-before-serving"])
    steps = [start_kubelet("none"), start_plugin(argv),
             wait_resource(GPU, capacity=8, allocatable=8, timeout=MAX_REGISTRATION_S),
             wait_resource(GPU, capacity=8, allocatable=8, timeout=30, may_fail=True),
             {"op": "snapshot"}]
    run = harness.run(steps, machine_for(simulate), tmp_path, allow_errors=True)
    first, eventually = run.ops("wait_resource")
    snap = run.ops("snapshot")[0]
    print(f"\nbroken plugin (Register before serving): registered within {MAX_REGISTRATION_S}s: {first['ok']} "
          f"({first.get('error')}); kubelet Register calls for {GPU}: {snap['registrations'].get(GPU)}; "
          f"registered after {first['elapsed_s'] + eventually.get('reached_s', float('nan')):.1f}s")
    # The same check test_harness.py applies to the real daemon fails here.
    assert not first["ok"]
    assert snap["registrations"].get(GPU, 0) >= 2


def test_reregistering_while_the_old_stream_is_open_is_caught(harness, tmp_path):
    """kubernetes #121994: the same scenario as test_reregistration_does_not_hit_kubernetes_121994,
    with a daemon that registers again before its old ListAndWatch stream has ended."""
    argv = daemon_argv("dgx-a100", wrapper=[BROKEN, "reregister-with-old-stream-open"])
    run = harness.run(reregistration_steps(argv), machine_for("dgx-a100"), tmp_path, allow_errors=True)
    hold = run.ops("wait_resource")[1]
    works = run.admits().get("works", {})
    print(f"\nbroken plugin (re-register with the old stream open): after re-registering, "
          f"{GPU} {hold.get('error') or 'stayed healthy'}; pod admission: "
          f"{works.get('admit')} {works.get('reason', '')} {works.get('message', '')}")
    assert not hold["ok"]
    assert hold.get("broken_state", {}).get("allocatable") == 0 or hold.get("timed_out")
