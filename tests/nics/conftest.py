"""Fixtures for NIC tests: nodes generated from topology data (never hand-written trees)."""

from __future__ import annotations

import pytest

from topo_testkit.sysfs_fixture import GeneratedNode, default_node, write_node


@pytest.fixture
def node(tmp_path) -> GeneratedNode:
    """The issue's node: 2 sockets, 8 GPUs, 2 dual-port ConnectX-6, a vfio VF, an RDMA port, an uplink."""
    return write_node(default_node(), str(tmp_path / "node"))
