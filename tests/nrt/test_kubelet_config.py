"""The Topology Manager settings from the kubelet's config file (plugin/nrt/kubelet_config.py)."""

from __future__ import annotations

import logging

from plugin.nrt.kubelet_config import read_topology_manager


def test_policy_and_scope_from_the_file(tmp_path):
    p = tmp_path / "config.yaml"
    p.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                 "topologyManagerPolicy: single-numa-node\ntopologyManagerScope: pod\n")
    s = read_topology_manager(str(p))
    assert (s.policy, s.scope) == ("single-numa-node", "pod")


def test_fields_left_out_are_the_kubelet_defaults(tmp_path):
    p = tmp_path / "config.yaml"
    p.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")
    s = read_topology_manager(str(p))
    assert (s.policy, s.scope) == ("none", "container")


def test_an_unreadable_file_leaves_both_unknown_and_says_why(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    s = read_topology_manager(str(tmp_path / "missing.yaml"))
    assert (s.policy, s.scope) == (None, None)
    assert "missing.yaml" in caplog.records[-1].file and "--kubelet-config" in caplog.records[-1].fix


def test_a_policy_the_kubelet_refuses_is_unknown(tmp_path):
    p = tmp_path / "config.yaml"
    p.write_text("topologyManagerPolicy: strict\n")
    assert read_topology_manager(str(p)).policy is None
