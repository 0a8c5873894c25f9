"""Fixtures for the tests that drive the real kubelet's device manager (Go harness).

The harness is built once per machine and cached (tests/kubelet/kubelet_build.py);
a cold build of the pinned Kubernetes release takes minutes, a warm one seconds.
"""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def harness() -> kubelet_testlib.Harness:
    try:
        binary = kubelet_build.harness_binary()
    except kubelet_build.BuildUnavailable as e:
        reason = f"the Go harness cannot be built here: {e}"
        print(f"\nSKIP (tests/kubelet): {reason}", file=sys.stderr)
        pytest.skip(reason)
    return kubelet_testlib.Harness(binary)
