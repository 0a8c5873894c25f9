"""Each command's options become typed settings once (plugin/cli/typed.py); `serve`'s root builds its mode from them.

What a user would notice if this broke: the wrong mode (DRA imported, or not started, for the
resources they named), a MIG GPU list or a kubeconfig that is silently not the one given, or a
setting changed after start-up by some part that was handed it.
"""

from __future__ import annotations

import dataclasses

import click
import pytest

from plugin.cli.options import resolve
from plugin.cli.typed import LogSettings, demo_settings, log_settings, node_settings, serve_settings
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


# -- every other command: typed settings too, read by field ---------------------------------------------------

def offline_settings(command: str, **params):
    """`command`'s resolved options as its flags' defaults give them, changed by `params`."""
    base = {o.dest: o.default_for(command) for o in options_for(command)}
    return resolve(base | params, {}, command)


@pytest.mark.parametrize("command", ["discover", "allocate", "explain", "demo"])
def test_an_offline_command_gets_the_node_and_the_resources_serve_would(command):
    node = node_settings(offline_settings(command, simulate="dgx-h100", gpu_resource_name="example.com/gpu",
                                          pairing_window_ms=0))
    assert node.source.simulate == "dgx-h100"
    assert node.resources.gpu_resource_name == "example.com/gpu"
    assert node.resources.pairing_window_s == 0  # explain's "pairing on?" reads this field


def test_the_demo_serves_its_node_unless_told_otherwise_and_refuses_two_nodes():
    plain = offline_settings("demo")
    demo = demo_settings(plain, hardware=False)
    assert (demo.default_node, demo.log.level, demo.log.format) == ("dgx-a100", "warning", "text")
    assert node_settings(plain, demo.default_node).source.simulate == "dgx-a100"
    assert plain.values.get("simulate") in (None, "")  # the command's options are left as given
    given = offline_settings("demo", simulate="dgx-h100")
    assert node_settings(given, demo.default_node).source.simulate == "dgx-h100"
    assert demo_settings(plain, hardware=True).default_node is None
    with pytest.raises(click.UsageError, match="--hardware and --simulate exclude each other"):
        demo_settings(given, hardware=True)


def test_serve_logs_as_its_options_say():
    s = offline_settings("serve", log_level="debug", log_format="json")
    assert log_settings(s) == LogSettings("debug", "json")


#: The two modules that may read an option by its name: the precedence step and the typed settings.
READ_BY_NAME = ("options.py", "typed.py")


def reads_by_name(source: str) -> list[int]:
    """Lines of `source` that read a `Settings` by key: `settings[...]`, `settings.values...`."""
    import ast

    lines = []
    for node in ast.walk(ast.parse(source)):
        target = node.value if isinstance(node, (ast.Subscript, ast.Attribute)) else None
        if isinstance(target, ast.Name) and target.id == "settings" and (
                isinstance(node, ast.Subscript) or (isinstance(node, ast.Attribute) and node.attr == "values")):
            lines.append(node.lineno)
    return sorted(lines)


def test_no_command_reads_an_option_by_its_name():
    """A misspelt key would surface only when that command ran; fields are checked by mypy (issue 31)."""
    import pathlib

    cli = pathlib.Path(__file__).resolve().parents[2] / "plugin" / "cli"
    found = {p.name: reads_by_name(p.read_text()) for p in sorted(cli.glob("*.py")) if p.name not in READ_BY_NAME}
    assert len(found) >= 8
    bad = {name: lines for name, lines in found.items() if lines}
    assert not bad, f"reads options by name (use the typed settings of plugin/cli/typed.py): {bad}"


def test_the_reader_sees_both_ways_of_reading_by_name():
    source = "def f(settings):\n    a = settings['simulate']\n    b = settings.values.get('x')\n    c = settings.config\n"
    assert reads_by_name(source) == [2, 3]
