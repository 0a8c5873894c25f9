"""A `serve` process imports only what its configured modes use, and imports it at start-up.

The daemon is the real CLI in a child process, launched through `topo_testkit.with_module_log`
(which writes the process's `sys.modules` when it exits) and `topo_testkit.with_fake_nvml` (NVML
answered by the double; its node is `nvidia-smi topo -m` text, which the double reads without
any schema validation, so whatever jsonschema the daemon holds is its own). Why it matters: the
DRA client (lightkube), schema validation (jsonschema) and the HTTP server (h11) cost resident
memory on every node (benchmarks/memory_bench.py, docs/deployment.md "Memory").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from daemon_testlib import GPU, until
from topo_testkit import pythonpath_env

from test_metrics_health import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE = os.path.join(ROOT, "tests", "sources", "topo_outputs", "older-driver-4gpu-tab-aligned.txt")
#: Top-level packages a daemon imports only for a mode that uses them.
DRA = ("lightkube", "plugin.dra")
SCHEMA = ("jsonschema",)
HTTP = ("h11", "plugin.observability.http_server", "plugin.observability.health_endpoint")


async def serve_and_list_modules(kubelet, plugin_dir: str, tmp_path, *args: str, preferred: bool) -> set[str]:
    """Run `serve` until registered (and, with `preferred`, one GetPreferredAllocation answered); its modules."""
    out = tmp_path / "modules.txt"
    log = open(tmp_path / "daemon.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "topo_testkit.with_module_log", str(out), "topo_testkit.with_fake_nvml", NODE,
         "serve", "--device-plugin-path", plugin_dir, "--device-id-strategy", "index", *args],
        cwd=ROOT, env=pythonpath_env(dict(os.environ)), stdout=log, stderr=subprocess.STDOUT)
    try:
        await kubelet.wait_for(lambda: bool(kubelet.devices(GPU)), timeout=60)
        if preferred:
            ids = sorted(kubelet.devices(GPU))
            assert len(await kubelet.preferred(GPU, ids, [], 2)) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, (tmp_path / "daemon.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    return set(out.read_text().split())


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return [n for n in names if n in modules or any(m.startswith(n + ".") for m in modules)]


async def test_device_plugin_mode_never_imports_dra_schema_or_http(kubelet, plugin_dir, tmp_path):
    modules = await serve_and_list_modules(kubelet, plugin_dir, tmp_path, preferred=True)
    assert "plugin.runtime.daemon" in modules and "pynvml" in modules  # the daemon ran, on (fake) NVML
    assert loaded(modules, DRA + SCHEMA + HTTP) == []


@pytest.mark.parametrize("what", ["config", "metrics"])
async def test_a_configured_part_is_imported_at_start_up_before_any_request(kubelet, plugin_dir, tmp_path, what):
    if what == "config":
        config = tmp_path / "config.yaml"
        config.write_text("version: v1\nflags:\n  deviceIdStrategy: index\n")
        args, wanted = ("--config", str(config)), SCHEMA
    else:
        args, wanted = ("--metrics-address", f"127.0.0.1:{free_port()}"), HTTP
    # no request at all: what is loaded was loaded by start-up
    modules = await serve_and_list_modules(kubelet, plugin_dir, tmp_path, *args, preferred=False)
    assert loaded(modules, wanted) == list(wanted)
    assert loaded(modules, DRA) == []


async def test_the_first_re_registration_loads_nothing_later_ones_do_not(kubelet, plugin_dir, tmp_path):
    """A kubelet restart re-registers with what start-up already loaded: no module and no thread is
    added by the first re-registration (lazy set-up there would make the first restart the slow one)."""
    out = tmp_path / "modules.txt"
    log = open(tmp_path / "daemon.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "topo_testkit.with_module_log", str(out), "topo_testkit.with_fake_nvml", NODE,
         "serve", "--device-plugin-path", plugin_dir, "--device-id-strategy", "index"],
        cwd=ROOT, env=pythonpath_env(dict(os.environ)), stdout=log, stderr=subprocess.STDOUT)

    async def snapshot(n: int) -> tuple[set[str], int]:
        proc.send_signal(signal.SIGUSR1)
        path = tmp_path / f"modules.txt.{n}"
        await until(path.exists, 30, f"the daemon's module list {n}")
        return set(path.read_text().split()), len(os.listdir(f"/proc/{proc.pid}/task"))

    try:
        await kubelet.wait_for(lambda: bool(kubelet.devices(GPU)), timeout=60)
        resources = sorted(kubelet.clients)
        loaded_at_start, threads_at_start = await snapshot(1)
        states = []
        for n in range(2):
            await kubelet.restart()
            await kubelet.wait_for(lambda: all(len(kubelet.registrations_of(r)) >= n + 2 for r in resources)
                                   and all(c.devices for c in kubelet.clients.values()), timeout=60)
            states.append(await snapshot(n + 2))
        (after_first, threads_first), (after_second, threads_second) = states
        assert sorted(after_first - loaded_at_start) == []
        assert sorted(after_second - after_first) == []
        assert threads_first == threads_at_start == threads_second
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, (tmp_path / "daemon.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
