"""Fixtures shared by the CLI tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_driver():
    """Skip where a working NVIDIA driver answers: these tests are about machines without one (CI's)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return
    pynvml.nvmlShutdown()
    pytest.skip("this machine has a working NVIDIA driver; the test is about machines without one")
