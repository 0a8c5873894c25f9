"""End-to-end tests with a real kubelet binary (tests/e2e) and kind (tests/e2e/kind)."""

from __future__ import annotations

import pathlib
import sys

import pytest

_HERE = pathlib.Path(__file__).resolve().parent
_KUBELET_TESTS = _HERE.parent / "kubelet"
for _p in (_HERE, _KUBELET_TESTS):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _HERE in pathlib.Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.kubelet)
            item.add_marker(pytest.mark.slow)
