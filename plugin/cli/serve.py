"""`topo-device-plugin serve`: run the daemon until SIGTERM."""

from __future__ import annotations

import asyncio
import os

import click

from ..daemon import Daemon, DaemonOptions
from ..logging_setup import setup_logging
from ..sources.errors import TopologyError
from .options import (
    Settings,
    common_options,
    make_source,
    option,
    pass_settings,
    resource_options,
    resource_reloader,
    startup_error,
)


@click.command()
@common_options
@option("--kubelet-root-dir", default="/var/lib/kubelet", help="The kubelet's --root-dir.")
@option("--device-plugin-path", default=None,
        help="Where kubelet.sock is and our sockets go [default: <kubelet-root-dir>/device-plugins]")
@option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
@option("--log-format", type=click.Choice(["text", "json"]), default="text")
@option("--metrics-address", default=None, metavar="HOST:PORT",
        help="Serve Prometheus /metrics, /healthz and /readyz here [default: off]")
@pass_settings
def serve(settings: Settings, kubelet_root_dir: str, device_plugin_path: str | None, log_level: str,
          log_format: str, metrics_address: str | None) -> None:
    """Run the device plugin daemon until SIGTERM/SIGINT."""
    ctx = click.get_current_context()
    extra = {"kubelet_root_dir": kubelet_root_dir, "device_plugin_path": device_plugin_path,
             "log_level": log_level, "log_format": log_format, "metrics_address": metrics_address}
    # These options are resolved like the common ones (flag > env > config > default).
    for name in extra:
        key = "".join(p if i == 0 else p.capitalize() for i, p in enumerate(name.split("_")))
        if ctx.get_parameter_source(name) == click.core.ParameterSource.DEFAULT and key in settings.config.flags:
            extra[name] = settings.config.flags[key]
    setup_logging(extra["log_level"], extra["log_format"])
    plugin_dir = extra["device_plugin_path"] or os.path.join(extra["kubelet_root_dir"], "device-plugins")
    source = make_source(settings)
    options = resource_options(settings)
    daemon = Daemon(
        source,
        DaemonOptions(plugin_dir=plugin_dir, metrics_address=extra["metrics_address"],
                      config_path=settings.config.path),
        options,
        reload_resources=resource_reloader(settings),
    )
    try:
        code = asyncio.run(daemon.run())
    except TopologyError as e:  # discovery failures at start: a clear message
        raise startup_error(e) from None
    except OSError as e:  # e.g. the device-plugin directory cannot be created
        raise click.ClickException(f"{type(e).__name__}: {e}") from None
    ctx.exit(code)
