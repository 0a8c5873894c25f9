"""Hostile config and node files at start-up: a clean exit 2 naming the file and the problem, in bounded memory.

Each command runs as a real child process; its peak RSS is the kernel's high-water mark of
its own memory (`VmHWM`), so the bound is what a container memory limit would see. The bound
is 128 MiB, two thirds of the chart's limit (192 MiB); the daemon itself needs about 50.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tempfile

import pytest
from topo_testkit.hostile_yaml import HOSTILE_INPUT_RSS_BOUND_KIB, billion_laughs, config_with, nested, node_with

ROOT = pathlib.Path(__file__).resolve().parents[2]


#: Runs the CLI in a fresh interpreter under an address-space cap and reports its own peak RSS
#: (VmHWM) on the way out. Why not the kernel's `ru_maxrss` from `wait4`: it keeps the largest
#: RSS across exec, and a child forked from pytest starts with pytest's RSS (over 128 MiB late in
#: a full run), so it measured the test runner, not the daemon.
_LAUNCHER = """
import resource, runpy, sys
cap, report = int(sys.argv[1]), sys.argv[2]
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
sys.argv = ["topo-device-plugin", *sys.argv[3:]]
try:
    runpy.run_module("plugin", run_name="__main__", alter_sys=True)
finally:
    with open("/proc/self/status") as f:
        hwm = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(report, "w") as f:
        f.write(hwm)
"""


def run_cli(*args: str, address_space: int = 1 << 30) -> tuple[int, str, int]:
    """(exit code, output, peak RSS in KiB) of `python -m plugin ARGS` (address space capped to protect the host)."""
    with tempfile.NamedTemporaryFile(prefix="tdp-peak-") as report:
        proc = subprocess.run([sys.executable, "-c", _LAUNCHER, str(address_space), report.name, *args], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        peak = report.read().decode().strip()
    assert peak, "the CLI's peak RSS was not reported"
    return proc.returncode, proc.stdout.decode(errors="replace"), int(peak)


def discover(tmp_path: pathlib.Path, kind: str, text: str) -> tuple[str, int, str, int]:
    """Write `text` as a config (`kind` "config") or node file and run `discover` on it:
    (path, exit code, output, peak RSS in KiB)."""
    path = str(tmp_path / f"{kind}.yaml")
    with open(path, "w") as f:
        f.write(text)
    args = ["--simulate", "dgx-a100", "--config", path] if kind == "config" else ["--simulate", path]
    return (path, *run_cli("discover", *args))


def assert_clean_input_error(code: int, out: str, path: str, *words: str) -> None:
    assert code == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert path in out and all(w in out for w in words), out[-3000:]


NESTED = {"config": config_with(nested()), "node": node_with("metadata", nested())}
BOMB = {"config": config_with("{cdiVendor: " + billion_laughs() + "}"), "node": node_with("gpus", billion_laughs())}


@pytest.mark.parametrize("kind", ["config", "node"])
def test_deeply_nested_file_exits_2_naming_the_file(tmp_path, kind):
    path, code, out, _ = discover(tmp_path, kind, NESTED[kind])
    assert_clean_input_error(code, out, path, "nested deeper than")


@pytest.mark.parametrize("kind", ["config", "node"])
def test_alias_bomb_is_refused_in_bounded_memory(tmp_path, kind):
    assert len(BOMB[kind]) < 500
    path, code, out, peak_kib = discover(tmp_path, kind, BOMB[kind])
    assert_clean_input_error(code, out, path, "aliases")
    assert peak_kib < HOSTILE_INPUT_RSS_BOUND_KIB, f"peak RSS {peak_kib} KiB"


def test_huge_node_file_is_refused_unread(tmp_path):
    text = node_with("gpus", "[{name: GPU0}]") + "# " + "x" * (8 << 20) + "\n"
    path, code, out, peak_kib = discover(tmp_path, "node", text)
    assert_clean_input_error(code, out, path, "1 MiB")
    assert peak_kib < HOSTILE_INPUT_RSS_BOUND_KIB, f"peak RSS {peak_kib} KiB"


def test_schema_error_quotes_a_huge_value_in_short(tmp_path):
    path, code, out, _ = discover(tmp_path, "config", config_with("{deviceIdStrategy: " + "y" * 200_000 + "}"))
    assert_clean_input_error(code, out, path, "flags.deviceIdStrategy")
    assert len(out) < 2000, f"{len(out)} characters of error output"
