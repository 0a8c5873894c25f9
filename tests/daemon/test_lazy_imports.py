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
from daemon_testlib import GPU
from topo_testkit import pythonpath_env

from test_metrics_health import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE = os.path.join(ROOT, "tests", "sources", "topo_outputs", "older-driver-4gpu-tab-aligned.txt")
#: Top-level packages a daemon imports only for a mode that uses them.
DRA = ("lightkube", "plugin.dra")
SCHEMA = ("jsonschema",)
HTTP = ("h11", "plugin.http_server", "plugin.health_endpoint")


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
    assert "plugin.daemon" in modules and "pynvml" in modules  # the daemon ran, on (fake) NVML
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
