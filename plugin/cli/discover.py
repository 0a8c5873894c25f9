"""`topo-device-plugin discover`: the node as the daemon sees it."""

from __future__ import annotations


import click
import yaml

from ..health.policy import DRIVER_ACTIONS, Evidence
from ..model.render import render_dot, render_table, to_data
from ..model.resources import build_resources
from ..sources import builtin_names
from ..sources.simulated import builtin_text
from ..runtime.compose.source import build_source
from .json_keys import camel_keys, dumps
from .options import Settings, option, with_settings
from .routing import Command
from .typed import node_settings


def builtin_description(name: str) -> str:
    """The one-line `metadata.description` of a built-in node file (its own words, kept with its data)."""
    data = yaml.safe_load(builtin_text(name)) or {}
    return str((data.get("metadata") or {}).get("description") or "").strip()


@click.command(cls=Command, examples=("topo-device-plugin discover --simulate dgx-a100 --format json",))
@with_settings("discover")
@option("--format", "fmt", type=click.Choice(["table", "json", "yaml", "dot"]), default="table",
        help="table: devices, resources and the link matrix as `nvidia-smi topo -m` prints it; json/yaml: the "
             "same as data; dot: the topology for Graphviz (`| dot -Tsvg`).")
@option("--list-builtins", is_flag=True, help="List the built-in simulated nodes, each with what it models, and exit.")
def discover(settings: Settings, fmt: str, list_builtins: bool) -> None:
    """Print devices, IDs, NUMA nodes, health, pools and the link matrix."""
    if list_builtins:
        names = builtin_names()
        if fmt in ("json", "yaml"):
            rows = [{"name": n, "description": builtin_description(n)} for n in names]
            click.echo(dumps(rows) if fmt == "json" else yaml.safe_dump(rows, sort_keys=False),
                       nl=fmt == "json")
            return
        width = max(map(len, names), default=0)
        for name in names:
            click.echo(f"{name:<{width}}  {builtin_description(name)}".rstrip())
        return
    node = node_settings(settings)
    source = build_source(node.source)
    topology = source.load()
    resources = build_resources(topology, node.resources)
    if fmt == "json":
        click.echo(dumps(to_data(topology, resources)))
    elif fmt == "yaml":  # the same keys as the JSON (device attributes camelCase too)
        click.echo(yaml.safe_dump(camel_keys(to_data(topology, resources)), sort_keys=False), nl=False)
    elif fmt == "dot":
        click.echo(render_dot(topology), nl=False)
    else:
        click.echo(render_table(topology, resources, source.description), nl=False)
    evidence = getattr(source, "gpu_evidence", None)
    if evidence is not None and fmt == "table":
        click.echo(render_evidence(evidence()), nl=False)


def _fact(value: object, yes: str) -> str:
    return "n/a" if value is None else yes if value else "no"


def render_evidence(rows: list[tuple[str, str, Evidence]]) -> str:
    """What the driver says each GPU needs (a real node): its recovery action and pending repairs."""
    if not rows:
        return ""
    lines = ["", "GPU health from the driver (n/a: this driver cannot say; docs/gpu-discovery.md \"Health\"):"]
    table = [["GPU", "RECOVERY ACTION", "ROW REMAP", "RETIRED PAGES", "VOLATILE DBE"]]
    for name, _uuid, ev in rows:
        if not ev.answers:
            table.append([name, "GPU lost (NVML cannot reach it)", "-", "-", "-"])
            continue
        action = "n/a" if ev.recovery_action is None else \
            f"{ev.recovery_action} ({DRIVER_ACTIONS.get(ev.recovery_action, ('unknown',))[0]})"
        remap = _fact(ev.remap_pending, "pending (reset needed)")
        if ev.remap_failed:
            remap += ", failed before"
        table.append([name, action, remap, _fact(ev.retired_pending, "pending (reset needed)"),
                      "n/a" if ev.volatile_dbe is None else str(ev.volatile_dbe)])
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    return "\n".join(lines) + "\n"
