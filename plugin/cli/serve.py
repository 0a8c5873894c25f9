"""`topo-device-plugin serve`: run the daemon until SIGTERM.

The command only parses: its options become typed settings (`plugin.cli.typed`)
and the composition root (`plugin.runtime.compose.root`) builds the daemon for
the mode they name.
"""

from __future__ import annotations

import asyncio

import click

from ..errors import RuntimeFailure
from ..observability.logging_setup import setup_logging
from ..runtime.compose.root import compose
from .options import Settings, with_settings
from .routing import Command
from .typed import log_settings, serve_settings


@click.command(cls=Command, examples=("topo-device-plugin serve --simulate dgx-h100 --device-plugin-path /tmp/dp",))
@with_settings("serve")
def serve(settings: Settings) -> None:
    """Run the device plugin daemon until SIGTERM/SIGINT."""
    # Logging first: the warnings of reading the options (e.g. passDeviceSpecs) go out in the chosen format.
    log = log_settings(settings)
    setup_logging(log.level, log.format)
    daemon = compose(serve_settings(settings))
    try:
        code = asyncio.run(daemon.run())
    except OSError as e:  # e.g. the device-plugin directory cannot be created
        raise RuntimeFailure(f"{type(e).__name__}: {e}") from None
    click.get_current_context().exit(code)
