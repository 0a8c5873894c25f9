"""The `topo-device-plugin` command line (click). One module per command.

Every command is a `routing.Command`: bad input exits 2, runtime failures 1,
bugs 1 with a traceback (see `routing.py`).
"""

from __future__ import annotations

import sys

import click

from .. import __version__
from ..observability.logging_setup import hold_early_logs, release_early_logs
from .allocate import allocate
from .demo import demo
from .discover import discover
from .explain import explain
from .health import health
from .routing import Group
from .serve import serve


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="topo-device-plugin")
def cli() -> None:
    """Topology-aware Kubernetes device plugin for GPUs and high-performance NICs."""


for _cmd in (serve, discover, demo, allocate, explain, health):
    cli.add_command(_cmd)


def main() -> None:
    # Lines logged while the options are read wait for the log format (serve, demo); commands that
    # never set up logging write them on the way out, with their fields, at WARNING and above.
    hold_early_logs()
    try:
        sys.exit(cli.main(prog_name="topo-device-plugin", standalone_mode=True))
    finally:
        release_early_logs()
