"""The MPS control daemon's supervisor with the stand-in control program (a real executable, real processes).

What an operator would notice: the daemon gets its defaults before it counts as ready; a control
daemon that dies is noticed and restarted; one that cannot start is retried and reported with the fix;
stop quits it. Waits are on conditions with generous deadlines, never on timings.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import stat

import pytest

from plugin.backoff import Backoff
from plugin.config import ConfigError, parse_config
from plugin.mps.control import DaemonSpec, MpsControl, MpsControlError, default_commands
from plugin.mps.supervisor import MpsSupervisor

STANDIN = str(pathlib.Path(__file__).resolve().parents[1] / "support" / "mps_standin" / "nvidia-cuda-mps-control")


def spec(tmp_path: pathlib.Path) -> DaemonSpec:
    return DaemonSpec(name="nvidia.com/gpu", pipe_dir=str(tmp_path / "r" / "pipe"), log_dir=str(tmp_path / "r" / "log"),
                      gpus=("GPU-a", "GPU-b"), defaults=default_commands([(0, 1024), (1, None)], 50))


def told(s: DaemonSpec) -> list[dict]:
    path = os.path.join(s.log_dir, "standin.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


async def until(predicate, timeout: float = 60.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met within the deadline")


def fast() -> Backoff:
    return Backoff(0.01, 0.05)


async def test_ready_after_defaults_restarted_when_it_dies_and_quit_at_stop(tmp_path):
    s = spec(tmp_path)
    changes: list[bool] = []
    sup = MpsSupervisor(MpsControl(STANDIN), [s], lambda name, ready: changes.append(ready), 0.05, fast)
    task = asyncio.create_task(sup.run())
    try:
        await until(lambda: sup.ready(s.name))
        first = told(s)
        assert first[0]["event"] == "start" and first[0]["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
        assert [r["command"] for r in first if r["event"] == "command" and r["command"] != "get_server_list"] == [
            "set_default_device_pinned_mem_limit 0 1024M", "set_default_active_thread_percentage 50"]
        assert os.path.exists(s.ready_file)
        os.kill(first[0]["pid"], signal.SIGKILL)
        await until(lambda: changes[-2:] == [False, True] and sup.starts[s.name] == 2)
        assert [r["pid"] for r in told(s) if r["event"] == "start"][1] != first[0]["pid"]
    finally:
        await sup.stop()
        task.cancel()
    assert told(s)[-1]["event"] == "quit" and not os.path.exists(s.ready_file)
    assert changes[-1] is False


async def test_a_program_that_cannot_start_is_retried_and_never_ready(tmp_path, caplog):
    broken = tmp_path / "mps-control"
    broken.write_text("#!/bin/sh\necho 'An instance of this daemon is already running' >&2\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    s = spec(tmp_path)
    sup = MpsSupervisor(MpsControl(str(broken)), [s], probe_interval_s=0.05, backoff=fast)
    task = asyncio.create_task(sup.run())
    try:
        await until(lambda: sup.starts[s.name] >= 3)
        assert not sup.ready(s.name)
    finally:
        task.cancel()
    reasons = [getattr(r, "reason", "") for r in caplog.records if "stay unhealthy" in r.getMessage()]
    assert reasons and "already running" in reasons[0] and "exited 1" in reasons[0], reasons


def test_the_clients_shared_memory_directory_is_writable_by_any_user(tmp_path):
    """Found on the cluster: a client container running as its image's non-root user could not create its
    segments in /dev/shm (`<mps root>/shm`), which the chart's hostPath had made 0755 before the daemon ran."""
    s = spec(tmp_path)
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o755)
    control = MpsControl(STANDIN)
    control.start(s)
    try:
        assert stat.S_IMODE(shm.stat().st_mode) == 0o1777
    finally:
        control.quit(s)


def test_a_missing_program_names_the_option_to_fix(tmp_path):
    with pytest.raises(MpsControlError) as e:
        MpsControl(str(tmp_path / "nowhere")).start(spec(tmp_path))
    assert "not found" in str(e.value) and "--mps-control-binary" in str(e.value)


def test_a_pipe_directory_too_deep_for_its_socket_names_the_option_to_fix(tmp_path):
    deep = tmp_path / ("d" * 120)
    s = DaemonSpec(name="nvidia.com/gpu", pipe_dir=str(deep / "pipe"), log_dir=str(deep / "log"))
    with pytest.raises(MpsControlError) as e:
        MpsControl(STANDIN).start(s)
    assert "past the 107" in str(e.value) and "--mps-root" in str(e.value)
    assert not deep.exists(), "nothing is created for a daemon that cannot start"


def test_a_bad_mps_entry_names_its_field():
    with pytest.raises(ConfigError) as e:
        parse_config("version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 1}\n",
                     "c.yaml")
    assert "c.yaml:5" in str(e.value) and "sharing.mps.resources[0].replicas" in str(e.value)


def pids_started(s: DaemonSpec) -> list[int]:
    return [r["pid"] for r in told(s) if r["event"] == "start"]


async def test_a_daemon_ensured_from_a_thread_is_supervised_until_discarded_and_not_restarted_after(short_tmp):
    """DRA's use: the first claim's prepare (a worker thread) brings the daemon up, the supervisor keeps it
    up, the last claim's unprepare lets it go, and nothing starts it again behind the claim's back."""
    s = spec(pathlib.Path(short_tmp))
    changes: list[tuple[str, bool]] = []
    sup = MpsSupervisor(MpsControl(STANDIN), (), lambda name, ready: changes.append((name, ready)), 0.05, fast)
    sup.start()
    try:
        await asyncio.to_thread(sup.ensure, s)
        assert len(pids_started(s)) == 1 and os.path.exists(s.ready_file), "up, with its defaults, at once"
        await asyncio.to_thread(sup.ensure, s)  # a second claim joins: no second start
        assert len(pids_started(s)) == 1
        os.kill(pids_started(s)[0], signal.SIGKILL)
        await until(lambda: len(pids_started(s)) == 2 and sup.ready(s.name))
        assert (s.name, False) in changes and changes[-1] == (s.name, True)
        await asyncio.to_thread(sup.discard, s.name)
        assert told(s)[-1]["event"] == "quit" and s.name not in sup.specs
    finally:
        await sup.detach()
    assert len(pids_started(s)) == 2 and not sup.control.probe(s), "let go: quit, and not started again"


async def test_a_watched_daemon_that_answers_is_kept_and_detach_leaves_it_running(short_tmp):
    """A restarted DRA driver: the daemon of a prepared claim still answers; it is kept (its containers keep
    their server) and given its defaults again; stopping the driver again leaves it running."""
    s = spec(pathlib.Path(short_tmp))
    control = MpsControl(STANDIN)
    control.start(s)
    sup = MpsSupervisor(control, (), probe_interval_s=0.05, backoff=fast)
    sup.start()
    try:
        sup.watch(s)
        await until(lambda: sup.ready(s.name))
        assert len(pids_started(s)) == 1 and sup.starts[s.name] == 0
        assert [r["command"] for r in told(s) if r["event"] == "command" and r["command"] != "get_server_list"] == [
            "set_default_device_pinned_mem_limit 0 1024M", "set_default_active_thread_percentage 50"]
        await sup.detach()
        assert control.probe(s), "detach quits nothing"
    finally:
        control.quit(s)


async def test_a_dead_daemon_no_longer_wanted_is_let_go_not_started_again(short_tmp):
    """A rolling update of the DRA driver: the other instance unprepared the last claim of the daemon (and
    quit it); this instance finds it gone, asks whether it is still wanted, and lets it go."""
    s = spec(pathlib.Path(short_tmp))
    wanted = {"yes": True}
    sup = MpsSupervisor(MpsControl(STANDIN), (), probe_interval_s=0.05, backoff=fast,
                        wanted=lambda _spec: wanted["yes"])
    sup.start()
    try:
        await asyncio.to_thread(sup.ensure, s)
        wanted["yes"] = False
        sup.control.quit(s)  # as the other instance did
        await until(lambda: s.name not in sup.specs)
    finally:
        await sup.detach()
    assert len(pids_started(s)) == 1 and not sup.control.probe(s)
