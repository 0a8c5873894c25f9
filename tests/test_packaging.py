"""The wheel (which the container image installs) ships the product and nothing else.

Built the way the Dockerfile builds it (`pip wheel --no-deps .`): every file in
it must match the allowlist below (the two packages' modules, the generated
gRPC stubs, the built-in nodes, the JSON schemas, the type markers, the
dist-info), none may be a test double, and the demo's kubelet stand-in must be
the minimal one, without the hooks the test kit adds. Then installed into a
clean venv: the fake NVML, the sysfs fixtures and the differential-test glue
must not be importable there, while the CLI and the demo must work.

Why patterns over directories and not a list of modules: modules move between
subpackages; what must never change is which kinds of files ship.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys
import tempfile
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: What the wheel may hold, as globs over its paths (`**/` spans zero or more directories, `*` one name).
ALLOWED = (
    "plugin/**/*.py",
    "allocator/**/*.py",
    "plugin/api/**/*.pyi",  # the generated gRPC stubs' type hints
    "plugin/**/builtins/*.yaml",  # the built-in simulated nodes
    "plugin/**/*.json",  # the JSON schemas of the simulated-node and config files
    "plugin/health/xid_catalog.tsv",  # NVIDIA's XID catalog as data: the health policy's default table
    "plugin/py.typed",
    "allocator/py.typed",
    "topo_device_plugin-*.dist-info/METADATA",
    "topo_device_plugin-*.dist-info/WHEEL",
    "topo_device_plugin-*.dist-info/RECORD",
    "topo_device_plugin-*.dist-info/entry_points.txt",
    "topo_device_plugin-*.dist-info/top_level.txt",
    "topo_device_plugin-*.dist-info/licenses/LICENSE",
)
#: Never in the wheel, even where a pattern above would let them in: no path part (a directory, or a file
#: name without its extension) may be one of these, start with `test_`, or end in `.pyc`.
FORBIDDEN = frozenset({"tests", "conftest", "topo_testkit", "fake_nvml", "sysfs_fixture", "tm_cases", "testing",
                       "harness", "benchmarks", "scripts", "__pycache__"})
#: The hooks the test kit's stand-ins add (tests/support/topo_testkit/kubelet_standin.py, device_manager.py).
TEST_HOOKS = ("register_gate", "register_calls", "registers_in_flight", "live_streams", "max_live_streams",
              "stream_ends", "disconnected_newer", "restart", "registrations_of", "CHECKPOINT",
              "calls", "Call", "release", "specs")

pytestmark = pytest.mark.timeout(900)


def glob_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    for part in re.split(r"(\*\*/|\*)", pattern):
        out += {"**/": "(?:[^/]+/)*", "*": "[^/]*"}.get(part, re.escape(part))
    return re.compile(out + r"\Z")


def forbidden(name: str) -> bool:
    parts = [p.split(".", 1)[0] for p in name.split("/")]
    return name.endswith(".pyc") or any(p in FORBIDDEN or p.startswith("test_") for p in parts)


def unexpected(names: list[str]) -> list[str]:
    """The wheel's files that no pattern allows, or that are forbidden."""
    allowed = [glob_regex(p) for p in ALLOWED]
    return [n for n in names if not n.endswith("/") and (not any(r.match(n) for r in allowed) or forbidden(n))]


def identifiers(source: str) -> set[str]:
    """Every name a module defines, assigns or reads (attributes, functions, classes, variables, arguments)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def added_by_test_kit() -> set[str]:
    """The names the test kit's subclasses add to the demo's classes (methods, fields, instance attributes)."""
    from plugin.demo import device_manager, kubelet_standin
    from topo_testkit import device_manager as kit_dm
    from topo_testkit import kubelet_standin as kit_kubelet

    names = set(vars(kit_kubelet.KubeletStandin)) - set(vars(kubelet_standin.KubeletStandin))
    names |= set(vars(kit_dm.StandinDeviceManager)) - set(vars(device_manager.StandinDeviceManager))
    names |= set(kit_dm.StandinDeviceManager.__dataclass_fields__) - set(
        device_manager.StandinDeviceManager.__dataclass_fields__)
    with tempfile.TemporaryDirectory() as d:
        names |= set(vars(kit_kubelet.KubeletStandin(d))) - set(vars(kubelet_standin.KubeletStandin(d)))
    return {n for n in names if not n.startswith("__")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
                           "-q", "--wheel-dir", str(out), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = out.glob("topo_device_plugin-*.whl")
    return whl


def test_allowlist_admits_the_product_and_names_what_else_slipped_in():
    product = ["plugin/cli/serve.py", "plugin/api/podresources/v1/api_pb2.pyi", "plugin/sources/builtins/dgx-a100.yaml",
               "allocator/topologymanager/hint.py", "plugin/py.typed", "topo_device_plugin-0.1.0.dist-info/RECORD",
               "plugin/latest_tests.py", "plugin/config/config-v1.json"]
    strays = ["plugin/sources/fake_nvml.py", "plugin/__pycache__/cli.cpython-311.pyc", "tests/conftest.py",
              "topo_testkit/kubelet_standin.py", "benchmarks/daemon_bench.py", "plugin/notes.txt",
              "plugin/api/api_pb2.pyi.orig", "plugin/demo/test_demo.py", "scripts/demo.sh", "pairing/x.py",
              "allocator/topologymanager/harness/run.py", "plugin/cli/serve.pyi", "plugin/sources/nodes.yaml"]
    assert unexpected(product + strays) == strays


def test_wheel_holds_only_allowed_files(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert unexpected(names) == [], "files outside the wheel's allowlist (tests/test_packaging.py ALLOWED)"
    # and the allowlist's kinds are all there (a pattern matching nothing would hide a packaging slip)
    for pattern in ALLOWED:
        assert any(glob_regex(pattern).match(n) for n in names), f"nothing in the wheel matches {pattern}"
    assert "plugin/demo/kubelet_standin.py" in names and "plugin/demo/device_manager.py" in names


def test_the_shipped_demo_stand_ins_have_no_test_hooks(wheel):
    hooks = set(TEST_HOOKS) | added_by_test_kit()
    assert {"register_gate", "max_live_streams", "calls"} <= hooks
    with zipfile.ZipFile(wheel) as z:
        demo = [n for n in z.namelist() if n.startswith("plugin/demo/") and n.endswith(".py")]
        assert demo
        for name in demo:
            found = identifiers(z.read(name).decode()) & hooks
            assert not found, f"{name} ships test hooks {sorted(found)}: they belong in tests/support/topo_testkit"


def test_clean_install_cannot_import_the_fake_nvml_and_runs_the_demo(wheel, tmp_path):
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
    exe = str(venv / "bin" / "topo-device-plugin")
    proc = subprocess.run([exe, "serve", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--fake-nvml" not in proc.stdout
    # the demo runs from the wheel alone: its stand-in needs nothing from the test kit
    proc = subprocess.run([exe, "demo", "--simulate", "dgx-a100"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "registered in" in proc.stdout and "Allocate(" in proc.stdout and "pairs:" in proc.stdout, proc.stdout
