"""Fixtures for end-to-end daemon tests: a real daemon process, a kubelet stand-in, real sockets."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import pytest

from topo_testkit import pythonpath_env

from topo_testkit.kubelet_standin import KubeletStandin

ROOT = __import__('pathlib').Path(__file__).resolve().parents[2]
# --import-mode=importlib keeps test directories off sys.path; the helper module lives here.
if str(ROOT / "tests" / "daemon") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests" / "daemon"))


@pytest.fixture
def plugin_dir(short_tmp: str) -> str:
    """The kubelet's device-plugin directory: short, for its unix sockets (tests/conftest.py)."""
    return short_tmp


@pytest.fixture
async def kubelet(plugin_dir: str) -> AsyncIterator[KubeletStandin]:
    k = KubeletStandin(plugin_dir)
    await k.start()
    yield k
    await k.stop()


class DaemonProcess:
    """`python -m plugin serve ...` as a real child process, with its log captured.

    `fake_nvml`: a simulated node whose GPUs NVML reports (through
    `topo_testkit.with_fake_nvml`; everything else is the shipped code path).
    """

    def __init__(self, args: list[str], log_path: str, fake_nvml: str | None = None):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        env = pythonpath_env(dict(os.environ, PYTHONUNBUFFERED="1"))
        launcher = ["topo_testkit.with_fake_nvml", fake_nvml] if fake_nvml else ["plugin"]
        self.proc = subprocess.Popen([sys.executable, "-m", *launcher, "serve", *args], cwd=ROOT,
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    async def terminate(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return await self.wait(timeout)

    async def wait(self, timeout: float = 10.0) -> int:
        for _ in range(int(timeout / 0.05)):
            if self.proc.poll() is not None:
                break
            await asyncio.sleep(0.05)
        else:
            self.proc.kill()
            raise AssertionError(f"daemon did not exit within {timeout}s; log:\n{self.log()}")
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture
def start_daemon(plugin_dir: str, tmp_path) -> Iterator:
    procs: list[DaemonProcess] = []

    def start(*args: str, simulate: str = "dgx-a100", strategy: str = "index", raw: bool = False,
              fake_nvml: str | None = None) -> DaemonProcess:
        argv = list(args) if raw else [
            "--simulate", simulate, "--device-plugin-path", plugin_dir, "--device-id-strategy", strategy,
            "--log-level", "debug", *args]
        p = DaemonProcess(argv, str(tmp_path / f"daemon-{len(procs)}.log"), fake_nvml)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
