"""Hostile config and node files at start-up: a clean exit 2 naming the file and the problem, in bounded memory.

Each command runs as a real child process; its peak RSS comes from the kernel
(`wait4`), so the bound is what a container memory limit would see. The bound
is the chart's limit (128 MiB); the daemon itself needs about 50.
"""

from __future__ import annotations

import os
import pathlib
import resource
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART_MEMORY_LIMIT_KIB = 128 * 1024
NODE_HEAD = "apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\n"


def run_cli(*args: str, address_space: int = 1 << 30) -> tuple[int, str, int]:
    """(exit code, output, peak RSS in KiB) of `python -m plugin ARGS` (address space capped to protect the host)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    proc = subprocess.Popen([sys.executable, "-m", "plugin", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, preexec_fn=limit)
    out = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, out, usage.ru_maxrss


def billion_laughs(levels: int = 8) -> str:
    """A flow list whose item k is nine aliases of item k-1: 9**levels strings from ~400 bytes.

    All of it sits in one field the schema checks, so a reader that expands
    aliases builds the whole thing (and quotes it in its error message)."""
    items = ['&l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    items += [f"&l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


def nested(depth: int = 3000) -> str:
    return "{a: " * depth + "1" + "}" * depth


@pytest.fixture
def files(tmp_path: pathlib.Path):
    def write(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


def assert_clean_input_error(code: int, out: str, path: str, *words: str) -> None:
    assert code == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert path in out and all(w in out for w in words), out[-3000:]


@pytest.mark.parametrize("kind", ["config", "node"])
def test_deeply_nested_file_exits_2_naming_the_file(files, kind):
    if kind == "config":
        path = files("config.yaml", "version: v1\nflags: " + nested() + "\n")
        args = ["discover", "--simulate", "dgx-a100", "--config", path]
    else:
        path = files("node.yaml", NODE_HEAD + "metadata: " + nested() + "\n")
        args = ["discover", "--simulate", path]
    code, out, _ = run_cli(*args)
    assert_clean_input_error(code, out, path, "nested deeper than")


@pytest.mark.parametrize("kind", ["config", "node"])
def test_alias_bomb_is_refused_in_bounded_memory(files, kind):
    if kind == "config":
        path = files("config.yaml", "version: v1\nflags:\n  cdiVendor: " + billion_laughs() + "\n")
        args = ["discover", "--simulate", "dgx-a100", "--config", path]
    else:
        path = files("node.yaml", NODE_HEAD + "gpus: " + billion_laughs() + "\n")
        args = ["discover", "--simulate", path]
    assert os.path.getsize(path) < 500
    code, out, peak_kib = run_cli(*args)
    assert_clean_input_error(code, out, path, "aliases")
    assert peak_kib < CHART_MEMORY_LIMIT_KIB, f"peak RSS {peak_kib} KiB"


def test_huge_node_file_is_refused_unread(files, tmp_path):
    path = str(tmp_path / "big.yaml")
    with open(path, "w") as f:
        f.write(NODE_HEAD + "metadata: {name: big}\ngpus: [{name: GPU0}]\n")
        f.write("# " + "x" * (8 << 20) + "\n")
    code, out, peak_kib = run_cli("discover", "--simulate", path)
    assert_clean_input_error(code, out, path, "1 MiB")
    assert peak_kib < CHART_MEMORY_LIMIT_KIB, f"peak RSS {peak_kib} KiB"


def test_schema_error_quotes_a_huge_value_in_short(files):
    path = files("config.yaml", "version: v1\nflags:\n  deviceIdStrategy: " + "y" * 200_000 + "\n")
    code, out, _ = run_cli("discover", "--simulate", "dgx-a100", "--config", path)
    assert_clean_input_error(code, out, path, "flags.deviceIdStrategy")
    assert len(out) < 2000, f"{len(out)} characters of error output"
