"""`topo-device-plugin serve`: run the daemon until SIGTERM."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import click

from allocator.topology import Device

from ..runtime.daemon import Daemon, DaemonOptions, DraFactory, DraSide
from ..errors import InputError, RuntimeFailure
from ..observability.logging_setup import setup_logging
from ..allocation.pod_resources import socket_path
from .options import Settings, make_source, option_source, resource_options, resource_reloader, with_settings
from .routing import Command


def dra_factory(settings: Settings) -> DraFactory:
    """How `serve` makes its DRA driver: the node from NODE_NAME, this instance from POD_UID (the chart sets
    both from the downward API), the API server through the pod's service account, or the file KUBECONFIG
    names when run outside a pod."""
    v = settings.values
    from ..dra.network_config import is_ifname

    if not is_ifname(v["pod_primary_interface"]):
        raise InputError(f"{option_source(settings, 'pod_primary_interface')}: {v['pod_primary_interface']!r} is not "
                         "a Linux interface name (fix: 1 to 15 of A-Z a-z 0-9 _ . -, not starting with '.', e.g. eth0)")
    node = os.environ.get("NODE_NAME", "")
    if not node:
        raise InputError(f"{option_source(settings, 'dra_resources')}: DRA mode needs the node's name in NODE_NAME "
                         "(fix: set env NODE_NAME from the downward API, fieldRef spec.nodeName; the chart does)")

    async def make(include: Callable[[Device], bool]) -> DraSide:
        from ..dra import DraDriver, DraOptions, SliceOptions
        from ..dra.kubeapi import KubeConfigError, in_cluster_api, kubeconfig_api

        try:
            slices = SliceOptions(node_name=node, include=include)
        except ValueError as e:
            raise InputError(f"NODE_NAME: {e} (fix: set it from fieldRef spec.nodeName)") from None
        try:
            if os.environ.get("KUBERNETES_SERVICE_HOST") or not os.environ.get("KUBECONFIG"):
                api = await in_cluster_api()
            else:
                api = await kubeconfig_api(os.environ["KUBECONFIG"])
        except KubeConfigError as e:
            raise RuntimeFailure(f"DRA mode cannot reach the API server: {e} (fix: run in a pod with a service "
                                 "account token, or set KUBECONFIG)") from None
        return DraDriver(DraOptions(slices, kubelet_root=v["kubelet_root_dir"], cdi_root=v["cdi_spec_dir"],
                                    instance_id=os.environ.get("POD_UID") or None, dev_root=v["dev_root"],
                                    netdev_attach=v["netdev_attach"], nri_socket=v["nri_socket"],
                                    pod_primary_interface=v["pod_primary_interface"]),
                         api, owns_api=True)

    return make


@click.command(cls=Command, examples=("topo-device-plugin serve --simulate dgx-h100 --device-plugin-path /tmp/dp",))
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
        dra_factory=dra_factory(settings) if options.dra_resources else None,
    )
    try:
        code = asyncio.run(daemon.run())
    except OSError as e:  # e.g. the device-plugin directory cannot be created
        raise RuntimeFailure(f"{type(e).__name__}: {e}") from None
    click.get_current_context().exit(code)
