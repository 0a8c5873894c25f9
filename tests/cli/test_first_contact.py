"""A new user's first ten minutes: the README's commands work as typed, mistakes get a hint, no tracebacks."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

from click.testing import CliRunner

from plugin.cli import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def using_it_commands() -> list[str]:
    """The shell lines of the README's "Using it" block, continuation lines joined."""
    section = README.read_text().split("## Using it", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [c.strip() for c in re.sub(r"\\\n\s*", " ", block).splitlines() if c.strip()]


def test_readme_using_it_commands_work_as_typed():
    """Every command runs as written in a fresh shell, after the README's own set-up line.

    `serve` is left out: it would write to the real /var/lib/kubelet (it is covered by tests/daemon).
    """
    lines = using_it_commands()
    setup = [c for c in lines if not c.startswith("topo-device-plugin")]
    commands = [c for c in lines if c.startswith("topo-device-plugin ") and c.split()[1] != "serve"]
    assert setup and len(commands) >= 4, lines
    assert (ROOT / ".venv" / "bin" / "activate").exists(), "the README's set-up (scripts/test.sh) makes .venv"
    for command in commands:
        script = "\n".join([*setup, command])
        proc = subprocess.run(["bash", "-ec", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(pathlib.Path.home())})
        assert proc.returncode == 0, f"$ {command}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"


def test_readme_says_what_the_test_command_needs():
    text = README.read_text().split("## Using it", 1)[0]
    for need in ("root", "Go", "Debian"):
        assert need in text, need
    # A user must learn how long the cold run takes, and it must fit CI's 60-minute budget.
    cold = re.search(r"cold run takes about \*\*(\d+)[–-](\d+) minutes\*\*", text)
    assert cold, "the README states the cold run's duration"
    assert int(cold.group(1)) <= int(cold.group(2)) <= 60, cold.group(0)
    assert re.search(r"warm run takes about \d+ minutes", text), "the README states the warm run's duration"


def test_an_index_id_under_uuid_ids_suggests_the_index_strategy():
    base = ["explain", "--simulate", "dgx-a100", "--policy", "restricted", "--request", "nvidia.com/gpu=4"]
    r = CliRunner().invoke(cli, [*base, "--allocated", "0,1"])
    assert r.exit_code == 2 and "no device has ID '0'" in r.output and "--device-id-strategy index" in r.output
    r = CliRunner().invoke(cli, [*base, "--device-id-strategy", "index", "--allocated", "GPU-nope"])
    assert r.exit_code == 2 and "valid IDs: 0, 1, 2" in r.output


def test_demo_with_a_bad_simulate_file_exits_2_without_a_traceback(tmp_path):
    bad = tmp_path / "node.txt"
    bad.write_text("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV9x\t0-1\nGPU1\tNV9x\t X \t0-1\n")
    proc = subprocess.run([sys.executable, "-m", "plugin", "demo", "--simulate", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out and f"{bad}:2" in out and "'NV9x'" in out


def test_counts_are_spelled_right(tmp_path):
    node = tmp_path / "node.yaml"
    node.write_text("apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\n"
                    "gpus: [{name: GPU0, numa: 0}]\nnics: [{name: mlx5_0, numa: 0}]\n")
    r = CliRunner().invoke(cli, ["discover", "--simulate", str(node)])
    assert r.exit_code == 0 and "1 GPU, 1 NIC," in r.output, r.output


def test_demo_installs_like_the_test_command():
    for script in ("demo.sh", "test.sh"):
        text = (ROOT / "scripts" / script).read_text()
        assert ". scripts/install_venv.sh" in text and "install_venv " in text, script
        assert "pip install" not in text, f"{script} installs through scripts/install_venv.sh only"


_FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for python3 and the venv's python: records each call; `-m venv DIR` makes DIR/bin/python.
echo "$*" >> "$CALLS"
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; fi
if [ "$1 $2 $3" = "-m pip install" ] && [ -n "${PIP_FAILS:-}" ]; then echo "pip: no network" >&2; exit 1; fi
exit 0
"""


def _install(tmp: pathlib.Path, extra: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f'. "{ROOT}/scripts/install_venv.sh" && install_venv "{extra}"'],
                          cwd=tmp, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHON": str(tmp / "fake-python"), "CALLS": str(tmp / "calls"),
                               **env})


def test_a_second_run_installs_nothing_until_pyproject_changes(tmp_path):
    fake = tmp_path / "fake-python"
    fake.write_text(_FAKE_PYTHON)
    fake.chmod(0o755)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    installs = lambda: (tmp_path / "calls").read_text().count("-e")  # noqa: E731 - a one-line reader

    assert _install(tmp_path, "test").returncode == 0
    assert installs() == 1
    assert _install(tmp_path, "test").returncode == 0 and installs() == 1, "nothing changed: no pip run"
    assert _install(tmp_path, "").returncode == 0 and installs() == 1, "the test install covers the demo's"
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\ndependencies = ['click']\n")
    assert _install(tmp_path, "").returncode == 0 and installs() == 2, "new dependencies: installed again"
    first = _install(tmp_path, "").stdout + _install(tmp_path, "").stderr
    assert "pip" not in first, "a quiet run prints nothing of pip's"


def test_a_failing_install_shows_pips_output_and_fails(tmp_path):
    fake = tmp_path / "fake-python"
    fake.write_text(_FAKE_PYTHON)
    fake.chmod(0o755)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    proc = _install(tmp_path, "", PIP_FAILS="1")
    assert proc.returncode != 0
    assert "pip: no network" in proc.stderr and ".venv/install.log" in proc.stderr


def test_an_interrupted_first_install_is_made_again(tmp_path):
    # issue 33 (new user pass): a first demo.sh stopped while venv installed pip left a .venv
    # without it, and every later run failed with "No module named pip".
    fake = tmp_path / "fake-python"
    fake.write_text(_FAKE_PYTHON.rsplit("exit 0\n", 1)[0] + 'if [ "$1 $2 $3" = "-m pip --version" ] && '
                    '[ -e "$(dirname "$0")/../NO_PIP" ]; then exit 1; fi\n'
                    'if [ "$1 $2 $3" = "-m venv --clear" ]; then rm -f "$4/NO_PIP"; fi\nexit 0\n')
    fake.chmod(0o755)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_bytes(fake.read_bytes())
    (tmp_path / ".venv" / "bin" / "python").chmod(0o755)
    (tmp_path / ".venv" / "NO_PIP").write_text("")  # the venv an interrupted `python3 -m venv` left
    proc = _install(tmp_path, "")
    assert proc.returncode == 0, proc.stderr
    assert ".venv has no pip" in proc.stderr and "making it again" in proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert "-m venv --clear .venv" in calls and any(c.startswith("-m pip install") and "-e" in c for c in calls)


def test_one_cache_directory_variable():
    users = [p for pattern in ("scripts/*.sh", "tests/**/*.sh", "tests/**/*.py") for p in ROOT.glob(pattern)]
    other = [str(p.relative_to(ROOT)) for p in users if re.search(r"TOPO_DP_CACHE(?!_DIR)", p.read_text())
             and p.name != "test_first_contact.py"]
    assert not other, f"use TOPO_DP_CACHE_DIR: {other}"
    assert any("TOPO_DP_CACHE_DIR" in p.read_text() for p in users)


def _transcript_pattern(line: str) -> re.Pattern[str]:
    """A README transcript line as a pattern: `X-...` is a shortened ID, the temp dir and the
    milliseconds change every run; everything else is as printed."""
    text = re.escape(line)
    text = text.replace(re.escape("..."), r"[^\s,']*")
    text = re.sub(r"topo\\-dp\\-demo\\-\S+?/", r"topo-dp-demo-[^/]+/", text)
    text = re.sub(r"registered\\ in\\ \d+\\ ms", r"registered in \\d+ ms", text)
    return re.compile(text)


def test_readme_demo_transcript_is_what_the_demo_prints():
    # issue 33 (new user pass): the README's "What it shows" lacked the resource prefix of the
    # GetPreferredAllocation line and listed the registrations in an order the demo did not keep.
    section = README.read_text().split("What it shows", 1)[1]
    block = section.split("```\n", 1)[1].split("```", 1)[0]
    wanted = [line for line in block.splitlines() if line.strip() and line.strip() != "..."]
    proc = subprocess.run([sys.executable, "-m", "plugin", "demo"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    printed = iter(proc.stdout.splitlines())
    for line in wanted:  # in order; lines the README leaves out may come between
        pattern = _transcript_pattern(line)
        assert any(pattern.fullmatch(got) for got in printed), f"README line not printed (in order): {line!r}"
