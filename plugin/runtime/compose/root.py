"""The composition root of `serve`: one function per mode builds every long-lived object and wires them.

Why one file: a reader looking for what runs in a given mode finds it here,
not spread over the CLI, the options and the driver. The CLI only parses
(`plugin.cli.typed` makes the typed settings); nothing else builds a source,
a server, a publisher, a backend or the DRA driver (tests/test_composition_root.py).

What each mode builds (docs/architecture.md, "Composition"):
- device plugin: the topology source (with its clique labeller), the daemon
  (servers, supervisor, pairing, health endpoint, CDI spec sync);
- DRA: the same source and daemon, with a DRA factory the daemon calls once it
  knows the DRA resources' devices: API client, MIG backend, sharing backend,
  slice publisher, NIC side (pod network, NRI), the driver;
- both: as DRA; the daemon splits the resources between its servers and the driver;
- any mode with `--nrt`: the NodeResourceTopology publisher (plugin/nrt/), which
  the daemon starts with its optional parts and feeds every resource build.

`demo` has its own small function (`compose_demo`): the device-plugin mode in a
temporary directory, against the kubelet stand-in.
"""

from __future__ import annotations

from collections.abc import Callable

from ...model.resources import ResourceOptions
from ..daemon import Daemon
from ..options import DaemonOptions, DraFactory, NrtFactory, NrtHook
from .dra import dra_factory
from .settings import Mode, NrtSettings, ServeSettings, SourceSettings
from .source import build_source


def _daemon(s: ServeSettings, dra: DraFactory | None) -> Daemon:
    return Daemon(
        build_source(s.source),
        DaemonOptions(plugin_dir=s.plugin_dir, metrics_address=s.metrics_address, config_path=s.config_path,
                      cdi_spec_dir=s.cdi_spec_dir, pod_resources_socket=s.pod_resources_socket,
                      mps_control_binary=s.mps_control_binary),
        s.resources,
        reload_resources=s.reload_resources,
        dra_factory=dra,
        nrt_factory=nrt_factory(s.nrt) if s.nrt is not None else None,
    )


def nrt_factory(s: NrtSettings) -> NrtFactory:
    """The NodeResourceTopology publisher (plugin/nrt/), made when the daemon starts its optional parts."""

    def make() -> NrtHook:
        from ...nrt.side import NrtOptions, make_nrt_side  # noqa: PLC0415 (lightkube only with --nrt)

        return make_nrt_side(NrtOptions(node_name=s.node_name, pod_resources_socket=s.pod_resources_socket,
                                        kubelet_config=s.kubelet_config))

    return make


def compose_device_plugin(s: ServeSettings) -> Daemon:
    """Device-plugin mode: no resource is served through DRA, so nothing of the DRA side is even imported."""
    return _daemon(s, None)


def compose_dra(s: ServeSettings) -> Daemon:
    """DRA mode: every resource is served through DRA; the daemon still runs (health endpoint, CDI specs),
    its device-plugin side registers nothing."""
    if s.dra is None:
        raise ValueError("DRA mode without DRA settings (a bug in plugin.cli.typed)")
    return _daemon(s, dra_factory(s.dra))


def compose_both(s: ServeSettings) -> Daemon:
    """Both: the resources in draResources through the DRA driver, the others through device-plugin servers."""
    return compose_dra(s)


def compose_demo(source: SourceSettings, resources: ResourceOptions, plugin_dir: str, cdi_spec_dir: str) -> Daemon:
    """`demo`: device-plugin mode against the kubelet stand-in in a temporary directory (no DRA, no health
    endpoint, no config reload)."""
    return Daemon(build_source(source), DaemonOptions(plugin_dir=plugin_dir, cdi_spec_dir=cdi_spec_dir), resources)


MODES: dict[Mode, Callable[[ServeSettings], Daemon]] = {
    "device-plugin": compose_device_plugin, "dra": compose_dra, "both": compose_both}


def compose(s: ServeSettings) -> Daemon:
    """The daemon of `serve`, built for its mode."""
    return MODES[s.mode](s)
