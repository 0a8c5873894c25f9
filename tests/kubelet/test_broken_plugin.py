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
    TAP_DIR,
    admission_run,
    check_preferred_calls,
    daemon_argv,
    machine_for,
    node_yaml,
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
    """The kubelet dials a plugin back inside Register; a daemon that registers before it
    serves gets that Register refused (after the kubelet's 10 s dial timeout) and must try
    again. test_harness.py requires exactly one registration per resource."""
    simulate = "dgx-a100"
    argv = daemon_argv(simulate, wrapper=[BROKEN, "register-before-serving"])
    steps = [start_kubelet("none"), start_plugin(argv),
             wait_resource(GPU, capacity=8, allocatable=8, timeout=120),
             {"op": "snapshot"}]
    run = harness.run(steps, machine_for(simulate), tmp_path)
    snap = run.ops("snapshot")[0]
    print(f"\nbroken plugin (Register before serving): kubelet Register calls for {GPU}: "
          f"{snap['registrations'].get(GPU)}")
    # The same check test_harness.py applies to the real daemon fails here.
    assert snap["registrations"].get(GPU, 0) >= 2


def test_reregistering_while_the_old_stream_is_open_is_caught(line_harness, tmp_path):
    """The scenario of test_reregistration_does_not_hit_kubernetes_121994, with a daemon that
    registers again before its old ListAndWatch stream has ended. The checks that pass for
    our daemon fail here on both lines, each in its own way:

    * 1.34 (kubernetes #121994): the new registration is accepted, and when the old stream
      ends 1.5 s later the kubelet disconnects the NEW client: 0 allocatable.
    * 1.37: the kubelet refuses the new registration ("device plugin already connected"),
      drops both clients, and keeps the old endpoint without a stream: the devices look
      healthy but our later updates never arrive, and every retry is refused again.
    """
    node = tmp_path / "node.yaml"
    node.write_text(node_yaml())
    argv = daemon_argv(str(node), wrapper=[BROKEN, "reregister-with-old-stream-open"])
    run = line_harness.run(reregistration_steps(argv, node), machine_for("dgx-a100"), tmp_path / "run",
                           allow_errors=True)
    hold, sick = run.ops("wait_resource")[1:3]
    last = run.ops("snapshot")[-1]
    works = run.admits().get("works", {})
    print(f"\nbroken plugin (re-register with the old stream open) on {line_harness}: after re-registering, "
          f"{GPU} {hold.get('error') or 'stayed healthy'}; a health change "
          f"{'arrived' if sick['ok'] else 'never arrived: ' + str(sick.get('error'))}; "
          f"kubelet Register calls {last['registrations'].get(GPU)}; pod admission: "
          f"{works.get('admit')} {works.get('reason', '')} {works.get('message', '')}")
    assert not (hold["ok"] and sick["ok"])
    if line_harness.has_121994_race:
        # The new client was disconnected: every device unhealthy.
        dropped = [s for s in (hold.get("broken_state"), sick) if s and s.get("allocatable") == 0]
        assert dropped, (hold, sick)
    else:
        # Frozen at the old stream's last list, and the retries were refused and counted.
        assert not sick["ok"] and sick.get("allocatable") == 8, sick
        assert last["registrations"][GPU] > 2, last["registrations"]
        daemon_log = "".join(p.read_text(errors="replace") for p in (tmp_path / "run").glob("plugin-*.log"))
        assert "device plugin already connected" in daemon_log
