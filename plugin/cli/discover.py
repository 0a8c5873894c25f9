"""`topo-device-plugin discover`: the node as the daemon sees it."""

from __future__ import annotations

import json

import click
import yaml

from ..render import render_dot, render_table, to_data
from ..resources import build_resources
from ..sources import builtin_names
from .options import Settings, make_source, resource_options, with_settings
from .routing import Command


@click.command(cls=Command)
@with_settings("discover")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "yaml", "dot"]), default="table",
              show_default=True)
@click.option("--list-builtins", is_flag=True, help="List the built-in simulated nodes and exit.")
def discover(settings: Settings, fmt: str, list_builtins: bool) -> None:
    """Print devices, IDs, NUMA nodes, health, pools and the link matrix."""
    if list_builtins:
        for name in builtin_names():
            click.echo(name)
        return
    source = make_source(settings)
    topology = source.load()
    resources = build_resources(topology, resource_options(settings))
    if fmt == "json":
        click.echo(json.dumps(to_data(topology, resources), indent=2))
    elif fmt == "yaml":
        click.echo(yaml.safe_dump(to_data(topology, resources), sort_keys=False), nl=False)
    elif fmt == "dot":
        click.echo(render_dot(topology), nl=False)
    else:
        click.echo(render_table(topology, resources, source.description), nl=False)
