"""`serve`'s options become typed settings once (plugin/cli/typed.py), and the root builds its mode from them.

What a user would notice if this broke: the wrong mode (DRA imported, or not started, for the
resources they named), a MIG GPU list or a kubeconfig that is silently not the one given, or a
setting changed after start-up by some part that was handed it.
"""

from __future__ import annotations

import dataclasses

import pytest

from plugin.cli.options import resolve
from plugin.cli.typed import serve_settings
from plugin.config.flags import options_for
from plugin.runtime.compose.root import MODES, compose

NODE = "node-a"


def settings_of(tmp_path, flags: str = "{}", **params):
    path = tmp_path / "config.yaml"
    path.write_text(f"version: v1\nflags: {flags}\n")
    base = {o.dest: o.default_for("serve") for o in options_for("serve")}
    values = base | {"config_path": str(path), "simulate": "dgx-h100",
                     "kubelet_root_dir": str(tmp_path / "k")} | params
    return serve_settings(resolve(values, {}, "serve"))


@pytest.mark.parametrize("dra,mode", [
    ("[]", "device-plugin"), ("[nvidia.com/gpu]", "both"), ("[nvidia.com/gpu, topo.dev/nic]", "dra")])
def test_the_mode_follows_the_dra_resources(tmp_path, monkeypatch, dra, mode):
    monkeypatch.setenv("NODE_NAME", NODE)
    s = settings_of(tmp_path, f"{{draResources: {dra}}}")
    assert s.mode == mode
    assert (s.dra is None) == (mode == "device-plugin")
    daemon = compose(s)
    assert (daemon.dra_factory is None) == (mode == "device-plugin")  # the DRA side is started only with DRA
    assert set(MODES) == {"device-plugin", "dra", "both"}


def test_the_dra_settings_carry_what_was_given(tmp_path, monkeypatch):
    monkeypatch.setenv("NODE_NAME", NODE)
    monkeypatch.setenv("POD_UID", "pod-123")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    s = settings_of(tmp_path, "{draResources: [nvidia.com/gpu], draMig: dynamic, draMigGpus: ['0', '3']}")
    assert s.dra is not None
    assert (s.dra.node_name, s.dra.instance_id, s.dra.kubeconfig) == (NODE, "pod-123", str(tmp_path / "kubeconfig"))
    assert (s.dra.mig_mode, s.dra.mig_gpus, s.dra.simulated) == ("dynamic", frozenset({0, 3}), True)
    assert s.dra.kubelet_root == str(tmp_path / "k")
    assert s.plugin_dir == str(tmp_path / "k" / "device-plugins")


def test_in_a_pod_the_service_account_wins_over_kubeconfig(tmp_path, monkeypatch):
    """As before the typed settings: KUBERNETES_SERVICE_HOST set means the pod's service account is used."""
    monkeypatch.setenv("NODE_NAME", NODE)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    s = settings_of(tmp_path, "{draResources: [nvidia.com/gpu]}")
    assert s.dra is not None and s.dra.kubeconfig is None


def test_the_settings_cannot_be_changed_after_start_up(tmp_path, monkeypatch):
    monkeypatch.setenv("NODE_NAME", NODE)
    s = settings_of(tmp_path, "{draResources: [nvidia.com/gpu]}")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.plugin_dir = "/elsewhere"  # the assignment is the point: it must be refused
    assert s.dra is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.dra.node_name = "other"
