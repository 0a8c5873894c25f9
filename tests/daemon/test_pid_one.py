"""As its container's PID 1, a `serve` that is told to stop while it is still starting stops.

The kernel drops a signal sent to a namespace's PID 1 while its disposition is the default, so before
plugin/entry.py a SIGTERM that reached the daemon before its event loop's handlers were installed
was lost: a daemon pod deleted in its first seconds waited out its whole grace period (30 s) for the
SIGKILL. Here the real console script runs as PID 1 of a new PID namespace (`unshare --pid --fork`,
as a container's runtime starts it) and is held at a known point of its start: its `--config` is a
FIFO, so it blocks reading the config until we write. Then SIGTERM, from outside the namespace as the
runtime sends it: it must end the process (exit 143) while it is still blocked there; without the
early handler it would block for ever (the test's deadline then fails it).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(os.path.dirname(sys.executable), "topo-device-plugin")


def _child_of(pid: int) -> int | None:
    """The one child of `pid` (unshare's forked child, PID 1 in the new namespace), by /proc."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
    except FileNotFoundError:
        return None
    return int(kids[0]) if kids else None


def _wait_until(what: str, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _reader_opened(fifo: str) -> int | None:
    """A write end of the FIFO, once the daemon has opened it for reading (ENXIO before)."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENXIO:
            return None
        raise


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a new PID namespace needs root and util-linux's unshare")
def test_sigterm_while_starting_as_pid_1_ends_the_daemon(tmp_path):
    assert os.access(SCRIPT, os.X_OK), f"the console script is not installed beside {sys.executable}"
    fifo = str(tmp_path / "config.yaml")
    os.mkfifo(fifo)
    log = open(tmp_path / "daemon.log", "wb")
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", SCRIPT, "serve", "--config", fifo,
                             "--simulate", "dgx-a100", "--device-plugin-path", str(tmp_path)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    writer = None
    try:
        daemon = _wait_until("unshare's child", lambda: _child_of(proc.pid))
        with open(f"/proc/{daemon}/status") as f:
            nspid = next(line.split()[-1] for line in f if line.startswith("NSpid:"))
        assert nspid == "1", f"the daemon is PID {nspid} in its namespace, not 1"
        writer = _wait_until("the daemon to open its config", lambda: _reader_opened(fifo))
        os.kill(daemon, signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("SIGTERM to the starting daemon (PID 1) was ignored: still running after 60 s\n"
                                 + (tmp_path / "daemon.log").read_text(errors="replace")) from None
        # unshare exits with its child's status; a signal's death would show as 128 + 15 too, but the log
        # says which: Python's early handler ends it without a traceback.
        assert rc == 128 + signal.SIGTERM, (rc, (tmp_path / "daemon.log").read_text(errors="replace"))
    finally:
        if writer is not None:
            os.close(writer)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
