"""What the commands print and how they end: a closed pipe, options from the environment, the built-ins listed
with what they model, and simulated GPUs' UUIDs in `discover`'s data."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import click
import pytest
import yaml

from plugin.cli import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILTINS = ROOT / "plugin" / "sources" / "builtins"
ENTRY = [sys.executable, "-m", "plugin"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*ENTRY, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


# -- a reader that closes the pipe ---------------------------------------------------------------------------------
CLOSED_PIPE_COMMANDS = [
    ["--help"],
    ["allocate", "--help"],
    ["discover", "--simulate", "dgx-a100"],
    ["discover", "--list-builtins"],
    ["allocate", "--simulate", "dgx-a100", "--size", "2"],
    ["explain", "--simulate", "dgx-a100", "--policy", "restricted", "--request", "nvidia.com/gpu=4"],
    ["demo", "--simulate", "pcie-2socket-4gpu-2nic"],
]


@pytest.mark.parametrize("args", CLOSED_PIPE_COMMANDS, ids=" ".join)
def test_a_closed_pipe_ends_the_command_quietly(args):
    """The reader is gone before the first line (as after `head -1`): exit 141, like a filter killed by SIGPIPE,
    and nothing on stderr (no traceback, no "internal error")."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([*ENTRY, *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.stderr == ""
    assert proc.returncode == 141


def test_demo_piped_into_head():
    """The issue's own line. Whether `head` exits before the demo is done writing depends on timing: either way
    the first line arrives and stderr stays empty."""
    proc = subprocess.run(["bash", "-c", 'set -o pipefail; "$@" | head -1; echo "status ${PIPESTATUS[0]}" >&2',
                           "bash", *ENTRY, "demo"], capture_output=True, text=True, timeout=120)
    assert proc.stdout.startswith("kubelet stand-in listening on ") and proc.stdout.count("\n") == 1
    assert proc.stderr in ("status 0\n", "status 141\n"), proc.stderr


def test_an_error_is_still_reported_when_stdout_is_closed(tmp_path):
    """Quiet is only for the pipe itself: a bad input file still exits 2 with its message on stderr."""
    bad = tmp_path / "node.txt"
    bad.write_text("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV9x\t0-1\nGPU1\tNV9x\t X \t0-1\n")
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([*ENTRY, "discover", "--simulate", str(bad)], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 2 and f"{bad}:2" in proc.stderr


# -- every option from the environment -----------------------------------------------------------------------------
def test_allocate_reads_its_own_options_from_the_environment():
    env = {"TOPO_DP_SIZE": "2", "TOPO_DP_FORMAT": "json", "TOPO_DP_DEVICE_ID_STRATEGY": "index"}
    proc = run("allocate", "--simulate", "dgx-a100", env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["request"]["size"] == 2 and len(data["ids"]) == 2
    # flag > environment
    proc = run("allocate", "--simulate", "dgx-a100", "--size", "3", env=env)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["ids"]) == 3


def test_explain_reads_its_own_options_from_the_environment():
    env = {"TOPO_DP_POLICY": "single-numa-node", "TOPO_DP_REQUEST": "nvidia.com/gpu=2", "TOPO_DP_FORMAT": "json",
           "TOPO_DP_DEVICE_ID_STRATEGY": "index", "TOPO_DP_ALLOCATED": "0,1"}
    proc = run("explain", "--simulate", "dgx-a100", env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["policy"] == "single-numa-node" and data["inUse"] == {"nvidia.com/gpu": ["0", "1"]}


def test_a_bad_value_from_the_environment_names_the_variable():
    proc = run("allocate", "--simulate", "dgx-a100", env={"TOPO_DP_SIZE": "two"})
    assert proc.returncode == 2 and "TOPO_DP_SIZE" in proc.stderr and "'two'" in proc.stderr


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_option_of_every_command_reads_its_variable(command):
    for param in cli.commands[command].params:
        if param.name == "help" or isinstance(param, click.Argument):  # a positional word has no variable
            continue
        flag = next(o for o in param.opts if o.startswith("--"))
        assert param.envvar == "TOPO_DP_" + flag[2:].replace("-", "_").upper(), (command, flag, param.envvar)


# -- built-ins and simulated UUIDs ---------------------------------------------------------------------------------
def test_list_builtins_shows_what_each_models():
    proc = run("discover", "--list-builtins")
    assert proc.returncode == 0 and not proc.stderr
    listed = dict(line.split(None, 1) for line in proc.stdout.splitlines())
    files = sorted(BUILTINS.glob("*.yaml"))
    assert list(listed) == sorted(f.stem for f in files)
    for f in files:
        assert listed[f.stem] == yaml.safe_load(f.read_text())["metadata"]["description"], f.stem


def test_json_shows_the_simulated_uuid_that_is_the_device_id():
    """dgx-a100's GPUs have no `uuid` field: each gets a stable made-up UUID, its ID under the uuid strategy."""
    assert "uuid:" not in (BUILTINS / "dgx-a100.yaml").read_text()
    data = json.loads(run("discover", "--simulate", "dgx-a100", "--format", "json").stdout)
    gpus = [d for d in data["devices"] if d["kind"] == "gpu"]
    ids = {d["device"]: d["id"] for d in next(r for r in data["resources"] if r["name"] == "nvidia.com/gpu")["devices"]}
    assert len(gpus) == 8 and all(g["uuid"] == ids[g["name"]] for g in gpus)
    assert all(g["uuid"].startswith("GPU-") for g in gpus)
    # The same UUIDs under index IDs (a property of the GPU, not of the ID strategy), and in YAML.
    indexed = json.loads(run("discover", "--simulate", "dgx-a100", "--format", "json",
                             "--device-id-strategy", "index").stdout)
    assert [d["uuid"] for d in indexed["devices"] if d["kind"] == "gpu"] == [g["uuid"] for g in gpus]
    assert all(d["uuid"] is None for d in data["devices"] if d["kind"] == "nic")
