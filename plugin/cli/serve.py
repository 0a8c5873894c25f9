"""`topo-device-plugin serve`: run the daemon until SIGTERM."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
import logging
from typing import Any

import click

from allocator.topology import Device

from ..runtime.daemon import Daemon, DaemonOptions, DraFactory, DraSide
from ..errors import InputError, RuntimeFailure
from ..observability.logging_setup import setup_logging
from ..allocation.pod_resources import socket_path
from .options import Settings, make_source, option_source, resource_options, resource_reloader, with_settings
from .routing import Command

log = logging.getLogger(__name__)


def dra_factory(settings: Settings) -> DraFactory:
    """How `serve` makes its DRA driver: the node from NODE_NAME, this instance from POD_UID (the chart sets
    both from the downward API), the API server through the pod's service account, or the file KUBECONFIG
    names when run outside a pod."""
    v = settings.values
    from ..dra.network_config import is_ifname  # noqa: PLC0415 (DRA mode only)

    if not is_ifname(v["pod_primary_interface"]):
        raise InputError(f"{option_source(settings, 'pod_primary_interface')}: {v['pod_primary_interface']!r} is not "
                         "a Linux interface name (fix: 1 to 15 of A-Z a-z 0-9 _ . -, not starting with '.', e.g. eth0)")
    node = os.environ.get("NODE_NAME", "")
    if not node:
        raise InputError(f"{option_source(settings, 'dra_resources')}: DRA mode needs the node's name in NODE_NAME "
                         "(fix: set env NODE_NAME from the downward API, fieldRef spec.nodeName; the chart does)")

    async def make(include: Callable[[Device], bool]) -> DraSide:
        from ..dra import DraDriver, DraOptions, SliceOptions  # noqa: PLC0415 (DRA mode only: lightkube and the DRA driver)
        from ..dra.kubeapi import KubeConfigError, in_cluster_api, kubeconfig_api  # noqa: PLC0415 (DRA mode only)

        mig, backend, caps = dra_mig(settings)
        try:
            slices = SliceOptions(node_name=node, include=include, mig=mig,
                                  shared_gpus=bool(v["dra_shared_gpus"]))
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
                                    mig_backend=backend, mig_caps=caps, real_gpus=not v["simulate"],
                                    netdev_attach=v["netdev_attach"], nri_socket=v["nri_socket"],
                                    pod_primary_interface=v["pod_primary_interface"], nccl_env=bool(v["nccl_env"]),
                                    toolkit_cdi=v["dra_toolkit_cdi"], toolkit_dirs=toolkit_dirs(settings),
                                    toolkit_kind=f"{v['cdi_vendor']}/{v['cdi_class']}"),
                         api, owns_api=True)

    return make


def nrt_factory(settings: Settings) -> Callable[[], Any] | None:
    """With --nrt: the NodeResourceTopology publisher's factory (plugin/nrt/), for the node NODE_NAME names."""
    v = settings.values
    if not v.get("nrt"):
        return None
    node = os.environ.get("NODE_NAME", "")
    if not node:
        raise InputError(f"{option_source(settings, 'nrt')}: publishing the NodeResourceTopology needs the node's name "
                         "in NODE_NAME (fix: set env NODE_NAME from the downward API, fieldRef spec.nodeName; the "
                         "chart does)")
    from ..nrt.side import NrtOptions, make_nrt_side  # noqa: PLC0415 (lightkube only with --nrt)

    nrt_options = NrtOptions(node_name=node, pod_resources_socket=socket_path(v["kubelet_root_dir"]),
                             kubelet_config=v["kubelet_config"])
    return lambda: make_nrt_side(nrt_options)


def toolkit_dirs(settings: Settings) -> tuple[str, ...]:
    """`--toolkit-cdi-dirs`, or the CDI spec directories runtimes read by default."""
    from ..model.cdi.toolkit import DEFAULT_TOOLKIT_DIRS  # noqa: PLC0415 (serve imports the DRA side lazily, as above)

    return tuple(settings.values.get("toolkit_cdi_dirs") or DEFAULT_TOOLKIT_DIRS)


def dra_mig(settings: Settings) -> tuple[Any, Any, Any]:
    """(DraMig, MIG backend factory or None, capability-node reader) from `--dra-mig`/`--dra-mig-gpus`.

    A simulated node keeps its MIG instances in a file in the driver's plugin directory
    (`simulated-mig.json`); real GPUs go through NVML, with capability nodes from procfs.
    """
    from ..dra.mig_devices import DraMig  # noqa: PLC0415 (DRA mode only)
    from ..dra.mig_prepare import simulated_caps  # noqa: PLC0415 (DRA mode only)

    v = settings.values
    gpus_text = list(v.get("dra_mig_gpus") or [])
    bad = [g for g in gpus_text if not str(g).isdigit()]
    if bad:
        raise InputError(f"{option_source(settings, 'dra_mig_gpus')}: {', '.join(map(str, bad))} is not a GPU index "
                         "(fix: list GPU indexes, e.g. 0,1)")
    gpus = frozenset(int(g) for g in gpus_text) or None
    mode = v.get("dra_mig") or "none"
    if mode != "dynamic":
        return DraMig(mode, gpus), None, simulated_caps
    from ..sources.mig_instances import NvmlMigBackend, SimulatedMigBackend, default_state_path  # noqa: PLC0415 (dynamic MIG only)

    if v.get("simulate"):
        backend = SimulatedMigBackend
        return (DraMig(mode, gpus, placements=lambda g: backend(os.devnull).placements(g)),
                lambda plugin_dir: backend(default_state_path(plugin_dir)), simulated_caps)
    import pynvml  # noqa: PLC0415 (real GPUs only: pynvml)

    from ..sources.nvml_mig import CapsReader, caps_attribute  # noqa: PLC0415 (real GPUs only)

    nvml = NvmlMigBackend(pynvml)
    cache: dict[str, Any] = {}

    def placements(g: Device) -> Any:
        if g.name not in cache:  # the GPU's placements never change while it is in MIG mode
            try:
                cache[g.name] = nvml.placements(g)
            except Exception as e:  # noqa: BLE001 (a GPU NVML cannot answer for offers no placement, for now)
                log.error("MIG placements not read; the GPU is published without them", extra={"gpu": g.name,
                                                                                                 "reason": str(e)})
                return []
        return cache[g.name]

    def caps(gpu: Device, inst: Any) -> dict[str, str]:
        reader = CapsReader(v["proc_root"])
        minor = gpu.minor if gpu.minor is not None else gpu.index
        gi, ci = reader.minor(minor, inst.gi, None), reader.minor(minor, inst.gi, inst.ci)
        out = {"caps": caps_attribute(gi, ci)} if gi is not None and ci is not None else {}
        if reader.major:
            out["caps_major"] = reader.major
        return out

    return DraMig(mode, gpus, placements=placements), lambda _plugin_dir: nvml, caps


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
        nrt_factory=nrt_factory(settings),
    )
    try:
        code = asyncio.run(daemon.run())
    except OSError as e:  # e.g. the device-plugin directory cannot be created
        raise RuntimeFailure(f"{type(e).__name__}: {e}") from None
    click.get_current_context().exit(code)
