"""Fixtures for the tests that drive the real kubelet's device manager (Go harness).

The harness is built once per machine and Kubernetes line and cached
(tests/kubelet/kubelet_build.py, versions in tests/kubelet/k8s_versions.json); a cold
build takes minutes, a warm one seconds.

* `harness`: the current line (what users run): every scenario runs on it.
* `line_harness`: parametrised over both lines ("current", "race"): the restart and
  re-registration scenarios, which must hold on 1.34 (the kubernetes #121994 race) too.
"""

from __future__ import annotations

import functools
import pathlib
import sys

import pytest

_HERE = pathlib.Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

import kubelet_build
import kubelet_testlib


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _HERE in pathlib.Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.kubelet)


@functools.cache
def _harness(name: str) -> kubelet_testlib.Harness:
    line = kubelet_build.line(name)
    binary = kubelet_testlib.build_or_skip(f"the Go harness ({name} line, Kubernetes {line.kubernetes})",
                                           lambda: kubelet_build.harness_binary(name))
    return kubelet_testlib.Harness(binary, line)


@pytest.fixture(scope="session")
def harness() -> kubelet_testlib.Harness:
    return _harness("current")


@pytest.fixture(scope="session", params=kubelet_build.LINES)
def line_harness(request) -> kubelet_testlib.Harness:
    return _harness(request.param)
