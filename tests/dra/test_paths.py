"""The socket layout under the kubelet root: per-instance names that always fit a unix socket path."""

from __future__ import annotations

import pytest

from plugin.dra.kubelet.paths import UNIX_PATH_MAX, DraPaths

POD_UID = "0f8e4d2c-6b1a-4e3f-9a7d-5c2b1e0d9f8a"


def test_default_layout_names_the_driver_and_the_pod():
    p = DraPaths("/var/lib/kubelet", "topo.dev", POD_UID)
    assert p.registration_socket == f"/var/lib/kubelet/plugins_registry/topo.dev-{POD_UID}-reg.sock"
    assert p.service_socket == f"/var/lib/kubelet/plugins/topo.dev/dra-{POD_UID}.sock"
    assert p.checkpoint == "/var/lib/kubelet/plugins/topo.dev/checkpoint.json"


def test_a_long_root_shortens_the_instance_part_to_a_stable_hash():
    root = "/var/lib/" + "k" * 40
    p = DraPaths(root, "topo.dev", POD_UID)
    for path in (p.registration_socket, p.service_socket):
        assert len(path) <= UNIX_PATH_MAX and POD_UID not in path
    assert p.registration_socket == DraPaths(root, "topo.dev", POD_UID).registration_socket
    assert p.registration_socket != DraPaths(root, "topo.dev", POD_UID[::-1]).registration_socket


def test_impossible_paths_and_bad_instance_ids_are_refused():
    with pytest.raises(ValueError, match="too long for a unix socket path"):
        DraPaths("/" + "k" * 100, "topo.dev", POD_UID).registration_socket
    with pytest.raises(ValueError, match="instance ID"):
        DraPaths("/var/lib/kubelet", "topo.dev", "../escape")
