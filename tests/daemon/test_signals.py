"""SIGHUP reloads the config, SIGQUIT shuts down like SIGTERM (issue 9, defect 8); no signal is lost."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import yaml
from daemon_testlib import GPU, NIC, until

from plugin.runtime.signals import LoopSignals


async def registered(kubelet, resource: str, timeout: float = 20.0) -> None:
    await kubelet.wait_for(lambda: bool(kubelet.clients.get(resource)) and bool(kubelet.clients[resource].devices),
                           timeout=timeout)


async def test_sigquit_sends_empty_lists_removes_sockets_and_exits_zero(kubelet, start_daemon, plugin_dir):
    daemon = start_daemon()
    await registered(kubelet, GPU)
    await registered(kubelet, NIC)
    sockets = [os.path.join(plugin_dir, r.endpoint) for r in kubelet.registrations]
    clients = [kubelet.client(GPU), kubelet.client(NIC)]
    updates = [c.updates for c in clients]
    daemon.proc.send_signal(signal.SIGQUIT)
    assert await daemon.wait() == 0
    await kubelet.wait_for(lambda: all(c.updates > u for c, u in zip(clients, updates)), timeout=10)
    assert [c.devices for c in clients] == [{}, {}]  # the kubelet drops the devices at once
    assert not [s for s in sockets if os.path.exists(s)]
    assert os.path.exists(kubelet.socket_path)


def rewrite_unseen(path, change) -> None:
    """Change the file in place keeping its inode, size and mtime: a change no file watcher can see.

    Why: the daemon also watches its config file; only a change the watcher misses shows that the
    SIGHUP itself applied it (as when an operator edits a file the watcher cannot follow).
    """
    st = os.stat(path)
    text = change(path.read_text())
    assert len(text.encode()) == st.st_size
    with open(path, "r+") as f:
        f.write(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


async def test_sighup_reloads_the_config(kubelet, start_daemon, plugin_dir, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"version": "v1", "flags": {
        "simulate": "dgx-a100", "deviceIdStrategy": "index", "gpuResourceName": "example.com/gpa"}}))
    daemon = start_daemon("--config", str(config), "--device-plugin-path", plugin_dir, raw=True)
    await registered(kubelet, "example.com/gpa")
    old = kubelet.client("example.com/gpa")
    rewrite_unseen(config, lambda text: text.replace("example.com/gpa", "example.com/gpb"))
    daemon.proc.send_signal(signal.SIGHUP)
    await registered(kubelet, "example.com/gpb")
    assert len(kubelet.devices("example.com/gpb")) == 8
    await kubelet.wait_for(lambda: old.devices == {}, timeout=10)  # the renamed resource said goodbye
    assert daemon.proc.poll() is None
    assert "SIGHUP received; reloading the configuration" in daemon.log()
    # the NIC resource, unchanged by the reload, kept its one registration and stream
    assert len(kubelet.registrations_of(NIC)) == 1 and kubelet.live_streams[NIC] == 1

    # a broken config on SIGHUP is reported and the running configuration stays
    rewrite_unseen(config, lambda text: text.replace("deviceIdStrategy: index", "deviceIdStrategy: inde?"))
    daemon.proc.send_signal(signal.SIGHUP)
    await until(lambda: "config change ignored" in daemon.log(), 20, "the broken config to be reported")
    assert daemon.proc.poll() is None
    assert len(kubelet.devices("example.com/gpb")) == 8 and len(kubelet.registrations_of("example.com/gpb")) == 1
    assert await daemon.terminate() == 0


def _flood_then_signal(loop, sig: signal.Signals, done: threading.Event) -> None:
    """From a worker thread while the loop is held up: fill the loop's self-pipe, then send `sig`."""
    for _ in range(20_000):  # far more one-byte writes than a unix socket buffer holds
        loop.call_soon_threadsafe(lambda: None)
    os.kill(os.getpid(), sig)
    done.set()


async def test_a_signal_arriving_while_the_loop_is_flooded_is_not_lost():
    """A stalled loop and busy worker threads fill asyncio's self-pipe, and asyncio's own
    signal handling (`loop.add_signal_handler`) then drops the signal (CPython #74224): the
    daemon missed a SIGTERM that way. `LoopSignals` records the signal itself and still runs
    the handler. (Swapping it for `loop.add_signal_handler` makes this test fail.)"""
    loop = asyncio.get_running_loop()
    got = asyncio.Event()
    signals = LoopSignals(loop, {signal.SIGUSR1: got.set})
    try:
        done = threading.Event()
        threading.Thread(target=_flood_then_signal, args=(loop, signal.SIGUSR1, done), daemon=True).start()
        # Hold the loop (no draining of its self-pipe) until the flood and the signal are in.
        assert done.wait(30)
        time.sleep(0.05)
        await asyncio.wait_for(got.wait(), timeout=10)
    finally:
        signals.close()
    # Closing restores the previous disposition: SIGUSR1 is no longer ours.
    assert signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None)
