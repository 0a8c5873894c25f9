"""Hints that fit the user's situation: no fix suggesting the flag already passed, one clear line where NVML is
missing, and "did you mean" for a mistyped config key at any level of the file."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import threading

import pytest

from plugin.config import ConfigError, parse_config
from plugin.config.flags import OPTIONS
from topo_testkit.sysfs_fixture import write_demo

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENTRY = [sys.executable, "-m", "plugin"]


def test_serve_without_nvml_does_not_suggest_the_flag_already_given(no_driver, tmp_path):
    node = write_demo(str(tmp_path / "n"))
    proc = subprocess.Popen([*ENTRY, "serve", "--sysfs-root", node.sysfs_root, "--dev-root", node.dev_root,
                             "--proc-root", node.proc_root, "--device-plugin-path", str(tmp_path / "dp"),
                             "--no-fail-on-init-error"], stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(120, proc.kill)  # a safety net only: the line normally comes within a second
    guard.start()
    try:
        line = ""
        for line in proc.stderr:
            if "serving zero GPUs" in line:
                break
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate()[1]
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "serving zero GPUs" in line, rest
    assert "cannot initialise NVML" in line and "libnvidia-ml.so.1" in line  # NVML's error and the real fix
    assert "fail-on-init-error" not in line.split("serving zero GPUs", 1)[1].replace("(fail-on-init-error is off)", "")
    assert proc.returncode == 0, rest


def test_nvml_probe_without_an_answer_prints_one_line():
    """No driver: nvmlInit fails; on a GPU machine GPU 9999 does not exist. Either way one line, no traceback."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "nvml_probe.py"), "9999"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "NVML_ERROR_" in lines[0] and ("nvmlInit failed" in lines[0] or "nvmlDeviceGetHandleByIndex" in lines[0])


def test_nvml_probe_refuses_a_bad_index_in_words():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "nvml_probe.py"), "first"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "GPU_INDEX" in proc.stderr and "'first'" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- did you mean ------------------------------------------------------------------------------------------------
TYPOS = [
    # ours under flags:, NVIDIA's under flags.plugin:, each spelled the other's way
    ("flags:\n  deviceIDStrategy: index\n", "flags.deviceIdStrategy"),
    ("flags:\n  plugin:\n    deviceIdStrategy: index\n", "flags.plugin.deviceIDStrategy"),
    # the right NVIDIA name at the wrong level, both ways
    ("flags:\n  nvidiaCTKPath: /usr/bin/nvidia-ctk\n", "flags.plugin.nvidiaCTKPath"),
    ("flags:\n  plugin:\n    migStrategy: none\n", "flags.migStrategy"),
    ("flags:\n  nvidiaDriverRot: /\n", "flags.nvidiaDriverRoot"),
    ("flag:\n  migStrategy: none\n", "flags"),
    ("gpus:\n  health:\n    ignoredXid: [13]\n", "gpus.health.ignoredXids"),
    ("sharing:\n  timeslicing:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n", "sharing.timeSlicing"),
    ("sharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replica: 2}]\n",
     "sharing.timeSlicing.resources[0].replicas"),
]


@pytest.mark.parametrize("body, meant", TYPOS, ids=[m for _, m in TYPOS])
def test_a_mistyped_config_key_gets_a_suggestion(tmp_path, body, meant):
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n" + body)
    proc = subprocess.run([*ENTRY, "discover", "--simulate", "dgx-a100", "--config", str(config)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout
    assert f"did you mean {meant}?" in proc.stderr and str(config) in proc.stderr


def test_every_flags_key_is_found_from_a_typo():
    """A letter dropped from any declared key (the daemon's own and NVIDIA's) leads back to it."""
    from plugin.config.nvidia import FLAG_PROPERTIES

    keys = [o.key for o in OPTIONS if o.key] + list(FLAG_PROPERTIES)
    for key in (k for k in keys if len(k) >= 6):  # a shorter one is too close to too many words
        typo = key[:len(key) // 2] + key[len(key) // 2 + 1:]
        with pytest.raises(ConfigError) as e:
            parse_config(f"version: v1\nflags:\n  {typo}: 1\n", "c.yaml")
        assert f"did you mean flags.{key}?" in str(e.value), (typo, str(e.value))


def test_a_key_like_nothing_known_gets_no_guess():
    with pytest.raises(ConfigError) as e:
        parse_config("version: v1\nflags:\n  completelyUnrelated: 1\n", "c.yaml")
    assert "remove or rename the unknown field" in str(e.value) and "did you mean" not in str(e.value)
