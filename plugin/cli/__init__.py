"""The `topo-device-plugin` command line (click). One module per command."""

from __future__ import annotations

import sys

import click

from .. import __version__
from .demo import demo
from .discover import discover
from .serve import serve

try:  # the what-if commands live in their own modules
    from .allocate import allocate
    from .explain import explain
except ImportError:  # pragma: no cover - only while those modules are being written
    allocate = explain = None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="topo-device-plugin")
def cli() -> None:
    """Topology-aware Kubernetes device plugin for GPUs and high-performance NICs."""


for _cmd in (serve, discover, demo, allocate, explain):
    if _cmd is not None:
        cli.add_command(_cmd)


def main() -> None:
    sys.exit(cli.main(prog_name="topo-device-plugin", standalone_mode=True))
