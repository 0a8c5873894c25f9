"""The wheel (which the container image installs) ships the product and no test doubles.

Built the way the Dockerfile builds it (`pip wheel --no-deps .`), then installed
into a clean venv: the fake NVML, the sysfs fixtures and the differential-test
glue must not be importable there, while the CLI and the demo must be.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEST_DOUBLES = ("fake_nvml", "sysfs_fixture", "tm_cases", "topo_testkit", "plugin/testing/",
                "topologymanager/harness")

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
                           "-q", "--wheel-dir", str(out), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = out.glob("topo_device_plugin-*.whl")
    return whl


def test_wheel_holds_no_test_doubles(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "plugin/cli/serve.py" in names and "plugin/demo/kubelet_standin.py" in names
    doubles = [n for n in names if any(d in n for d in TEST_DOUBLES)]
    assert not doubles, doubles


def test_clean_install_cannot_import_the_fake_nvml(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    proc = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    def python(code: str) -> subprocess.CompletedProcess:
        return subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                              env={"PATH": "/usr/bin:/bin"})

    assert python("import plugin.cli, plugin.demo.kubelet_standin").returncode == 0
    for module in ("plugin.sources.fake_nvml", "plugin.testing.sysfs_fixture", "topo_testkit",
                   "allocator.topologymanager.harness"):
        proc = python(f"import {module}")
        assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, (module, proc.stderr)
    proc = subprocess.run([str(venv / "bin" / "topo-device-plugin"), "serve", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "--fake-nvml" not in proc.stdout
