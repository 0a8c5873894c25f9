"""`topo-device-plugin serve`: run the daemon until SIGTERM."""

from __future__ import annotations

import asyncio
import os

import click

from ..daemon import Daemon, DaemonOptions
from ..errors import RuntimeFailure
from ..logging_setup import setup_logging
from ..pod_resources import socket_path
from .options import Settings, make_source, resource_options, resource_reloader, with_settings
from .routing import Command


@click.command(cls=Command)
@with_settings("serve")
def serve(settings: Settings) -> None:
    """Run the device plugin daemon until SIGTERM/SIGINT."""
    v = settings.values
    setup_logging(v["log_level"], v["log_format"])
    plugin_dir = v["device_plugin_path"] or os.path.join(v["kubelet_root_dir"], "device-plugins")
    source = make_source(settings)
    options = resource_options(settings)
    daemon = Daemon(
        source,
        DaemonOptions(plugin_dir=plugin_dir, metrics_address=v["metrics_address"], config_path=settings.config.path,
                      cdi_spec_dir=v["cdi_spec_dir"],
                      pod_resources_socket=socket_path(v["kubelet_root_dir"]) if v["pod_resources"] else None),
        options,
        reload_resources=resource_reloader(settings),
    )
    try:
        code = asyncio.run(daemon.run())
    except OSError as e:  # e.g. the device-plugin directory cannot be created
        raise RuntimeFailure(f"{type(e).__name__}: {e}") from None
    click.get_current_context().exit(code)
