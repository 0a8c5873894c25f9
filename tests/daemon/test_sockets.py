"""The daemon's sockets in a hostile or broken device-plugin directory (issue 9, defects 5, 9, 10).

Real daemon process, real inotify (watchdog) in the test to react the moment a
socket appears, real /proc to see the daemon's umask and listening sockets.
"""

from __future__ import annotations

import os
import stat
import threading

from daemon_testlib import GPU, NIC, until
from watchdog.events import FileSystemEventHandler
from watchdog.observers import Observer

from topo_testkit.kubelet_standin import KubeletStandin

GPU_SOCKET = "topo-nvidia.com-gpu.sock"


async def registered(kubelet, resource: str, n: int = 1, timeout: float = 20.0) -> None:
    await kubelet.wait_for(lambda: len(kubelet.registrations_of(resource)) >= n
                           and bool(kubelet.clients.get(resource)) and bool(kubelet.clients[resource].devices),
                           timeout=timeout)


async def test_a_directory_at_one_socket_path_does_not_block_the_other_resources(kubelet, start_daemon, plugin_dir):
    blocked = os.path.join(plugin_dir, GPU_SOCKET)
    os.mkdir(blocked)
    daemon = start_daemon()
    await registered(kubelet, NIC)  # the NIC resource is served although the GPU socket cannot be
    assert GPU not in kubelet.clients
    await until(lambda: "cannot serve resource" in daemon.log(), 20, "the failure to be logged")
    line = next(x for x in daemon.log().splitlines() if "cannot serve resource" in x)
    assert GPU in line and blocked in line and "retry_in_s=" in line
    os.rmdir(blocked)  # the operator removes the obstacle: the GPU resource comes up on its own retry
    await registered(kubelet, GPU, timeout=60)
    assert len(kubelet.registrations_of(NIC)) == 1 and kubelet.live_streams == {GPU: 1, NIC: 1}
    assert stat.S_ISSOCK(os.lstat(blocked).st_mode)
    assert "world-writable" not in daemon.log()


class _Interferer(FileSystemEventHandler):
    """Each time the GPU socket appears: note its mode, then swap it for a symlink to `canary`."""

    def __init__(self, path: str, canary: str, rounds: int):
        self.path, self.canary, self.rounds = path, canary, rounds
        self.seen: list[tuple[bool, int]] = []
        self.swaps = 0

    def _appeared(self, path: str) -> None:
        if path != self.path:
            return
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            return  # our own symlink
        self.seen.append((stat.S_ISSOCK(st.st_mode), stat.S_IMODE(st.st_mode)))
        if self.swaps < self.rounds:
            self.swaps += 1
            link = self.path + ".evil"
            os.symlink(self.canary, link)
            os.rename(link, self.path)  # atomic: the socket is replaced by a symlink

    def on_created(self, event) -> None:
        self._appeared(os.fsdecode(event.src_path))

    def on_moved(self, event) -> None:
        self._appeared(os.fsdecode(event.dest_path))


def _umask(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        return next(line.split()[1] for line in f if line.startswith("Umask:"))


def _listening_unix_sockets(pid: int) -> int:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    with open("/proc/net/unix") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    # Flags 00010000 is __SO_ACCEPTCON: a listening socket
    return sum(1 for r in rows if r[6] in inodes and int(r[3], 16) & 0x10000)


async def test_socket_swapped_at_birth_is_never_followed_nor_left_wide_open(plugin_dir, start_daemon, tmp_path):
    # no kubelet fixture: without a kubelet the daemon only serves, so every swap is answered at once
    canary = tmp_path / "canary"
    canary.write_text("do not touch\n")
    os.chmod(canary, 0o644)
    spy = _Interferer(os.path.join(plugin_dir, GPU_SOCKET), str(canary), rounds=30)
    observer = Observer()
    observer.schedule(spy, plugin_dir, recursive=False)
    observer.start()
    daemon = start_daemon()
    umasks: set[str] = set()
    polling = True

    def poll_umask() -> None:  # umask is process-wide: the daemon must never change it
        while polling and daemon.proc.poll() is None:
            try:
                umasks.add(_umask(daemon.pid))
            except (FileNotFoundError, StopIteration):
                pass

    poller = threading.Thread(target=poll_umask, daemon=True)
    poller.start()
    try:
        await until(lambda: spy.swaps == 30, 120, "30 sockets swapped for a symlink")
        path = os.path.join(plugin_dir, GPU_SOCKET)
        await until(lambda: os.path.exists(path) and stat.S_ISSOCK(os.lstat(path).st_mode), 30,
                    "the daemon to serve its socket again")
    finally:
        polling = False
        observer.stop()
        observer.join(5)
        poller.join(5)
    # the socket never existed at its path with any mode but 0600
    assert spy.seen and set(spy.seen) == {(True, 0o600)}, spy.seen
    # the symlinks were replaced, never followed: the target kept its mode and content
    assert stat.S_IMODE(os.stat(canary).st_mode) == 0o644 and canary.read_text() == "do not touch\n"
    assert len(umasks) == 1, f"the daemon's umask changed while it served: {sorted(umasks)}"
    log = daemon.log()
    assert "Traceback" not in log, log[-3000:]
    # no server was dropped while still listening: one listening socket per resource
    assert _listening_unix_sockets(daemon.pid) == 2
    assert not [n for n in os.listdir(plugin_dir) if n.startswith(".topo-bind-")]
    kubelet = KubeletStandin(plugin_dir)
    await kubelet.start()
    try:
        await registered(kubelet, GPU)
        await registered(kubelet, NIC)
        assert kubelet.live_streams == {GPU: 1, NIC: 1}
    finally:
        await kubelet.stop()


async def test_a_symlink_planted_at_the_socket_path_is_replaced(kubelet, start_daemon, plugin_dir, tmp_path):
    canary = tmp_path / "canary"
    canary.write_text("do not touch\n")
    os.chmod(canary, 0o644)
    path = os.path.join(plugin_dir, GPU_SOCKET)
    os.symlink(canary, path)
    start_daemon()
    await registered(kubelet, GPU)
    st = os.lstat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(canary).st_mode) == 0o644 and canary.read_text() == "do not touch\n"


async def test_a_world_writable_plugin_directory_is_reported_once(kubelet, start_daemon, plugin_dir):
    os.chmod(plugin_dir, 0o777)
    daemon = start_daemon()
    await registered(kubelet, GPU)
    await kubelet.restart()
    await registered(kubelet, GPU, n=2)
    lines = [x for x in daemon.log().splitlines() if "world-writable" in x]
    assert len(lines) == 1, lines
    assert plugin_dir in lines[0] and f"chmod o-w {plugin_dir}" in lines[0]


async def test_bind_directories_left_by_a_killed_run_are_removed_at_start(kubelet, start_daemon, plugin_dir):
    # A daemon killed mid-bind (SIGKILL between mkdtemp and the rename) leaves `.topo-bind-*` behind;
    # each restart that way would add one for good. A young one may be a bind in progress: it stays.
    old = os.path.join(plugin_dir, ".topo-bind-killed")
    os.mkdir(old, 0o700)
    open(os.path.join(old, "s"), "w").close()
    os.utime(old, (0, 0))
    young = os.path.join(plugin_dir, ".topo-bind-in-progress")
    os.mkdir(young, 0o700)
    daemon = start_daemon()
    await registered(kubelet, GPU)
    assert not os.path.exists(old)
    assert os.path.isdir(young)
    assert "removed bind directories left by a killed run" in daemon.log() and ".topo-bind-killed" in daemon.log()
    # and its own binds leave nothing behind
    assert sorted(n for n in os.listdir(plugin_dir) if n.startswith(".topo-bind-")) == [".topo-bind-in-progress"]
