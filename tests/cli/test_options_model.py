"""One declaration per option: the CLI, the config file's schema, the chart's values schema and the docs agree.

Adding an option is one entry in plugin/config/flags.py; a surface that drifts
from it (a hand-added flag, a schema key, a chart value, a stale docs table) fails here.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from plugin.cli import cli
from plugin.config import schema
from plugin.config.flags import LIVE_TARGETS, OPTIONS, Target, chart_schema_flags, options_for
from plugin.config.nvidia import FLAG_PROPERTIES as NVIDIA_FLAG_PROPERTIES

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMMANDS = sorted(cli.commands)
JSON_TYPE = {"bool": "boolean", "number": "number", "text": "string", "address": "string", "path": "string",
             "resource-name": "string"}


def params(command: str) -> dict[str, click.Parameter]:
    return {p.name: p for p in cli.commands[command].params}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_declared_option_is_a_flag_of_its_commands(command):
    ps = params(command)
    for o in options_for(command):
        p = ps.get(o.dest)
        assert p is not None, f"{command} lacks {o.flag}"
        assert o.flag in p.opts and p.envvar == o.env, (command, o.name, p.opts, p.envvar)
        assert p.default == o.default_for(command), (command, o.name)
        if o.choices and o.kind == "choice":
            assert list(p.type.choices) == list(o.choices), (command, o.name)
        if o.kind == "bool":
            assert p.is_flag and p.secondary_opts == [f"--no-{o.flag[2:]}"], (command, o.name)


@pytest.mark.parametrize("command", COMMANDS)
def test_no_command_has_an_undeclared_setting(command):
    """Every TOPO_DP_ variable a command reads is a declared option or one of its own what-if arguments."""
    declared = {o.env for o in options_for(command)}
    others = {o.env for o in OPTIONS} - declared
    envs = {p.envvar for p in cli.commands[command].params if p.envvar}
    assert not envs & others, f"{command} reads {envs & others} without declaring it"


def test_config_schema_flags_are_the_declared_options():
    """The declared options, plus NVIDIA's own `flags:` keys (plugin/config/nvidia.py decides their fate)."""
    flags = schema()["properties"]["flags"]
    assert flags["additionalProperties"] is False
    props = flags["properties"]
    assert set(props) == {o.key for o in OPTIONS if o.key} | set(NVIDIA_FLAG_PROPERTIES)
    assert not {o.key for o in OPTIONS} & set(NVIDIA_FLAG_PROPERTIES), "an NVIDIA key hides a declared option"
    for o in OPTIONS:
        if not o.key:
            continue
        if o.kind == "choice":
            assert props[o.key]["enum"] == list(o.choices)
        elif o.kind == "choice-list":
            assert props[o.key]["oneOf"][0]["enum"] == list(o.choices)
        elif o.kind == "list":
            assert [f["type"] for f in props[o.key]["oneOf"]] == ["string", "array"], o.key
        else:
            assert props[o.key]["type"] == JSON_TYPE[o.kind], o.key


def test_chart_values_schema_flags_are_generated_from_the_declarations():
    """The chart's `config.flags` is exactly what scripts/options_docs.py writes: no hand-edited rule drifts."""
    chart = json.loads((ROOT / "charts" / "topo-device-plugin" / "values.schema.json").read_text())
    flags = chart["properties"]["config"]["properties"]["flags"]
    assert flags == chart_schema_flags(), "values.schema.json config.flags is stale: run python scripts/options_docs.py"
    assert set(flags["properties"]) == {o.key for o in OPTIONS if o.key and not o.chart_managed}
    config_schema = schema()["properties"]["flags"]["properties"]
    for key, spec in flags["properties"].items():  # the same rule as the daemon's config file, key by key
        assert spec == config_schema[key], key


def test_generated_docs_and_chart_schema_are_current():
    """The CI check: one command regenerates the docs table and the chart schema's flags; --check finds drift."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "options_docs.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_drift_check_names_a_stale_chart_schema(tmp_path):
    """--check fails, naming the file, when the chart's flags differ from the declarations (a copy of the tree)."""
    for part in ("scripts", "docs", "charts"):  # the script writes next to itself; `plugin` is the installed one
        subprocess.run(["cp", "-r", str(ROOT / part), str(tmp_path / part)], check=True)
    path = tmp_path / "charts" / "topo-device-plugin" / "values.schema.json"
    data = json.loads(path.read_text())
    data["properties"]["config"]["properties"]["flags"]["properties"]["devRoot"] = {"type": "string"}
    path.write_text(json.dumps(data, indent=2) + "\n")
    check = [sys.executable, str(tmp_path / "scripts" / "options_docs.py"), "--check"]
    proc = subprocess.run(check, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1 and "values.schema.json" in proc.stderr and "configuration.md" not in proc.stderr
    subprocess.run([sys.executable, str(tmp_path / "scripts" / "options_docs.py")], check=True, capture_output=True)
    assert json.loads(path.read_text()) == json.loads((ROOT / path.relative_to(tmp_path)).read_text())
    assert subprocess.run(check, capture_output=True, cwd=tmp_path).returncode == 0


#: Whether a config reload applies what each target feeds: a reload rebuilds the resources and nothing else.
RELOAD_APPLIES = {Target.INVOCATION: False, Target.DISCOVERY: False, Target.RESOURCES: True, Target.SERVING: False,
                  Target.DRA: False, Target.LOGGING: False}


def test_live_is_derived_from_what_an_option_feeds():
    assert set(RELOAD_APPLIES) == set(Target)
    assert LIVE_TARGETS == {t for t, live in RELOAD_APPLIES.items() if live}
    for o in OPTIONS:
        assert o.live is RELOAD_APPLIES[o.target], (o.name, o.target)


#: Values other than the default where the kind's rule below would not fit the option.
OTHER_VALUE = {"cdiAnnotationPrefix": "example.com/", "draResources": ["nvidia.com/gpu"], "migStrategy": "mixed",
               "draMigGpus": ["0"], "toolkitCdiDirs": ["/etc/elsewhere-cdi"], "draGpuShares": 4,
               "draImexChannels": 2}


def other_value(o) -> object:
    """A valid value that differs from the default, from the declaration (a new option needs no entry here)."""
    if o.key in OTHER_VALUE:
        return OTHER_VALUE[o.key]
    return {
        "choice": lambda: next(c for c in o.choices if c != o.default),
        "choice-list": lambda: [next(c for c in o.choices if [c] != [o.default])],
        "bool": lambda: not o.default,
        "number": lambda: 0 if o.zero_ok else (o.default or 1) / 2,
        "path": lambda: "/elsewhere/" + o.key,
        "resource-name": lambda: "example.com/" + o.key.lower(),
        "address": lambda: "127.0.0.1:9400",
        "text": lambda: "other",
    }[o.kind]()


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.key], ids=lambda o: o.key)
def test_a_reload_applies_exactly_the_live_options(tmp_path, caplog, option):
    """Changing one option in the file: a live one reaches the rebuilt resources, a restart one is only named."""
    from plugin.cli.options import resolve, resource_options, resource_reloader

    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    params = {o.dest: o.default_for("serve") for o in options_for("serve")} | {"config_path": str(path)}
    settings = resolve(params, {}, "serve")
    running = resource_options(settings)
    value = other_value(option)
    assert value != option.default_for("serve"), option.key
    path.write_text(json.dumps({"version": "v1", "flags": {option.key: value}}))
    with caplog.at_level("WARNING", logger="plugin.cli.options"):
        reloaded = resource_reloader(settings)()
    named = {name for r in caplog.records for name in getattr(r, "options", "").split(", ")}
    if option.live:
        assert reloaded != running and option.flag not in named, option.key
    else:  # `--dev-root` too: the Allocate answers keep naming the device nodes discovery found
        assert reloaded == running, option.key
        assert option.flag in named, (option.key, named)


def test_serve_only_options_come_from_the_config_file_too(tmp_path):
    """flag > env > file > default holds for serve-only options: here the demo's log level from the file."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text("version: v1\nflags:\n  logLevel: debug\n")
    r = CliRunner().invoke(cli, ["demo", "--config", str(cfg), "--simulate", "pcie-2socket-4gpu-2nic"])
    assert r.exit_code == 0, r.output
    assert "registered with the kubelet" in r.output  # an INFO line: the file's debug level was applied
    r = CliRunner().invoke(cli, ["demo", "--config", str(cfg), "--simulate", "pcie-2socket-4gpu-2nic"],
                           env={"TOPO_DP_LOG_LEVEL": "warning"})
    assert r.exit_code == 0 and "registered with the kubelet" not in r.output


@pytest.mark.parametrize("address", ["nonsense", "1.2.3.4:99999", ":abc", "[::1:80"])
def test_a_bad_metrics_address_is_a_usage_error_naming_where_it_came_from(tmp_path, address):
    # It used to pass the flag parser and fail at start-up as "internal error (a bug...)" with a traceback.
    base = ["serve", "--simulate", "dgx-a100", "--device-plugin-path", str(tmp_path / "dp")]
    r = CliRunner().invoke(cli, [*base, "--metrics-address", address])
    assert r.exit_code == 2, r.output
    assert "Invalid value for '--metrics-address'" in r.output and f"{address!r} is not HOST:PORT" in r.output
    config = tmp_path / "c.yaml"
    config.write_text(f"version: v1\nflags:\n  metricsAddress: {json.dumps(address)}\n")
    r = CliRunner().invoke(cli, [*base, "--config", str(config)])
    assert r.exit_code == 2, r.output
    # the schema (with the line) or the address check names the file, the field and the value
    assert str(config) in r.output and "field flags.metricsAddress" in r.output and repr(address) in r.output
    assert "internal error" not in r.output and not (tmp_path / "dp").exists()
