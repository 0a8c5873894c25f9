"""The resolved options (`Settings`, a dict by option name) made into the typed settings the root reads.

Why here, in the CLI: every check that names where a value came from (flag,
variable, file field: `option_source`) runs while the options are still the
CLI's, so the error says what to fix; what leaves this module is typed,
checked and final (`plugin.runtime.compose.settings`). The order of the checks
is the order start-up always had: `--simulate` and the clique labeller, then
the resource options, then the DRA side.

Every command gets its settings here, not only `serve`: `LogSettings` (how
`serve` and `demo` log, read before anything else so the options' own
warnings go out in that format), `NodeSettings` (the node and its resources,
for `discover`, `allocate`, `explain` and the demo's daemon) and
`DemoSettings`. So this module and `plugin.cli.options` are the only ones that
read an option by its name (`tests/cli/test_typed_settings.py` checks it).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from ..allocation.pod_resources import socket_path
from ..config.flags import BY_DEST
from ..errors import InputError
from ..model.cdi.toolkit import DEFAULT_TOOLKIT_DIRS
from ..model.resources import ResourceOptions
from ..runtime.compose.settings import DraSettings, Mode, NrtSettings, ServeSettings, SourceSettings
from ..runtime.compose.source import build_source
from ..sources.base import TopologySource
from .options import Settings, check_simulate, nic_pools, option_source, resource_options, resource_reloader

if TYPE_CHECKING:
    from ..dra.slices.imex_channels import ImexChannels


@dataclass(frozen=True)
class LogSettings:
    """`--log-level` and `--log-format` (`demo` logs text: it takes no `--log-format`)."""

    level: str
    format: str = "text"


@dataclass(frozen=True)
class NodeSettings:
    """What a command that reads the node is given: where the topology comes from and the resources built on
    it, as `serve` would build them (the GPU resource's name, the pairing window... are `resources` fields)."""

    source: SourceSettings
    resources: ResourceOptions


@dataclass(frozen=True)
class DemoSettings:
    """`demo`'s own choices: how it logs, and the node it serves when `--simulate` names none."""

    log: LogSettings
    #: The built-in node served when no `--simulate` is given; None with `--hardware` (the node's own devices).
    default_node: str | None


#: The node `demo` serves unless told otherwise: the first thing a new user sees (README).
DEMO_NODE = "dgx-a100"


def log_settings(settings: Settings) -> LogSettings:
    """How the command logs; the commands without `--log-format` log text."""
    return LogSettings(level=settings.values["log_level"], format=settings.values.get("log_format") or "text")


def demo_settings(settings: Settings, hardware: bool) -> DemoSettings:
    """`demo`'s settings; `--hardware` with `--simulate` is a usage error (they name two different nodes)."""
    if hardware and settings.values.get("simulate"):
        raise click.UsageError("--hardware and --simulate exclude each other: --hardware serves this "
                               "node's own devices, --simulate a simulated node")
    return DemoSettings(log=LogSettings(level=settings.values["log_level"]),
                        default_node=None if hardware else DEMO_NODE)


def node_settings(settings: Settings, default_node: str | None = None) -> NodeSettings:
    """The node and its resources for an offline command; `default_node` is served when `--simulate` names none
    (`demo`). Raises the `--simulate` errors first, then those of the resource options, as `serve` does."""
    if default_node is not None and not settings.values.get("simulate"):
        settings = dataclasses.replace(settings, values={**settings.values, "simulate": default_node})
    return NodeSettings(source=source_settings(settings), resources=resource_options(settings))


def source_settings(settings: Settings) -> SourceSettings:
    """Where the topology comes from; raises the `--simulate` and `--fabric-labels-node` errors."""
    check_simulate(settings)
    v = settings.values
    return SourceSettings(
        simulate=v.get("simulate") or None, sysfs_root=v["sysfs_root"], dev_root=v["dev_root"],
        proc_root=v["proc_root"], fail_on_init_error=v["fail_on_init_error"],
        gpu_health=settings.config.gpu_health, nic_link_health=v["nic_link_health"],
        fabric_labels_file=v.get("fabric_labels_file") or None, fabric_recheck_s=v.get("fabric_recheck_s") or None,
        label_node=_label_node(settings))


def node_name(settings: Settings, dest: str, needs: str) -> str:
    """This node's name from NODE_NAME (the chart sets it from the downward API), which the part `dest` turns
    on `needs` (the error's words: what needs the name)."""
    node = os.environ.get("NODE_NAME", "")
    if not node:
        raise InputError(f"{option_source(settings, dest)}: {needs} in NODE_NAME (fix: set env NODE_NAME from the "
                         "downward API, fieldRef spec.nodeName; the chart does)")
    return node


def _label_node(settings: Settings) -> str | None:
    """With --fabric-labels-node: this node's name, from NODE_NAME (the chart sets it)."""
    if not settings.values.get("fabric_labels_node"):
        return None
    return node_name(settings, "fabric_labels_node", "labelling the Node needs its name")


def dra_settings(settings: Settings) -> DraSettings:
    """The DRA side's settings; raises for a bad interface name, no NODE_NAME or a bad GPU index."""
    from ..dra.network.nic_config import is_ifname  # noqa: PLC0415 (DRA mode only)

    v = settings.values
    if not is_ifname(v["pod_primary_interface"]):
        raise InputError(f"{option_source(settings, 'pod_primary_interface')}: {v['pod_primary_interface']!r} is not "
                         "a Linux interface name (fix: 1 to 15 of A-Z a-z 0-9 _ . -, not starting with '.', e.g. eth0)")
    node = node_name(settings, "dra_resources", "DRA mode needs the node's name")
    gpus_text = list(v.get("dra_mig_gpus") or [])
    bad = [g for g in gpus_text if not str(g).isdigit()]
    if bad:
        raise InputError(f"{option_source(settings, 'dra_mig_gpus')}: {', '.join(map(str, bad))} is not a GPU index "
                         "(fix: list GPU indexes, e.g. 0,1)")
    kubeconfig = os.environ.get("KUBECONFIG") or None
    return DraSettings(
        node_name=node, instance_id=os.environ.get("POD_UID") or None,
        kubeconfig=None if os.environ.get("KUBERNETES_SERVICE_HOST") else kubeconfig,
        kubelet_root=v["kubelet_root_dir"], cdi_root=v["cdi_spec_dir"], dev_root=v["dev_root"],
        proc_root=v["proc_root"], simulated=bool(v["simulate"]), shared_gpus=bool(v["dra_shared_gpus"]),
        mig_mode=v.get("dra_mig") or "none", mig_gpus=frozenset(int(g) for g in gpus_text) or None,
        netdev_attach=v["netdev_attach"], nri_socket=v["nri_socket"],
        pod_primary_interface=v["pod_primary_interface"], nccl_env=bool(v["nccl_env"]),
        toolkit_cdi=v["dra_toolkit_cdi"], toolkit_dirs=tuple(v.get("toolkit_cdi_dirs") or DEFAULT_TOOLKIT_DIRS),
        toolkit_kind=f"{v['cdi_vendor']}/{v['cdi_class']}",
        mps_root=v["mps_root"], mps_control_binary=v["mps_control_binary"],
        gpu_shares=whole_count(settings, "dra_gpu_shares", "shares"), imex=imex_channels(settings),
        imex_control_binary=imex_control_binary(settings), imex_control_socket=v["imex_control_socket"],
        nic_pools=nic_pools(settings), nic_resource_name=v["nic_resource_name"])


def whole_count(settings: Settings, dest: str, what: str) -> int:
    """A count option as an int (a config file's schema says whole numbers too; the flag takes any number)."""
    value = float(settings.values.get(dest) or 0)
    if not value.is_integer():
        raise InputError(f"{option_source(settings, dest)}: {value:g} is not a whole number of {what} "
                         "(fix: give a count such as 4, or 0 for none)")
    return int(value)


def imex_control_binary(settings: Settings) -> str:
    """`--imex-control-binary`, or "" (not asked) on a simulated node where it is left at its default: a
    simulated node has no host IMEX daemon to ask, and its tests name a stand-in when they want one."""
    value = str(settings.values.get("imex_control_binary") or "")
    default = settings.sources.get("imex_control_binary") in (None, ParameterSource.DEFAULT) and \
        BY_DEST["imex_control_binary"].key not in settings.config.flags
    return "" if settings.values.get("simulate") and default else value


def imex_channels(settings: Settings) -> ImexChannels | None:
    """`--dra-imex-channels` as `ImexChannels` (None: 0): the major from `--proc-root`'s devices file, or on a
    simulated node (which reads no procfs) the node file's `imexChannelsMajor`."""
    from ..model.imex import ImexChannels, ImexChannelsError, channels_of  # noqa: PLC0415 (DRA mode only)
    from ..sources.simulated import stated_imex_major  # noqa: PLC0415 (as above)

    count = whole_count(settings, "dra_imex_channels", "IMEX channels")
    where = option_source(settings, "dra_imex_channels")
    simulate = settings.values.get("simulate")
    if simulate and count:
        major = stated_imex_major(str(simulate))
        if major is None:
            raise InputError(f"{where}: the simulated node {simulate} states no imexChannelsMajor (fix: add "
                             "`imexChannelsMajor: <major>` to its node file, as /proc/devices would list "
                             "nvidia-caps-imex-channels, or publish no channels)")
        return ImexChannels(major, count)
    try:
        return channels_of(settings.values["proc_root"], count)
    except ImexChannelsError as e:
        raise InputError(f"{where}: {e}") from None


def mode_of(resources: ResourceOptions) -> Mode:
    """device-plugin without draResources; dra when every resource the options name (GPU, NIC, NIC pools) is
    in it; both otherwise. Only a name for the composition: the daemon splits the discovered resources."""
    if not resources.dra_resources:
        return "device-plugin"
    named = {resources.gpu_resource_name, resources.nic_resource_name} | {p.resource_name for p in resources.nic_pools}
    return "dra" if named <= resources.dra_resources else "both"


def serve_settings(settings: Settings) -> ServeSettings:
    """`serve`'s typed settings; raises the same `InputError`s, in the same order, start-up always gave."""
    v = settings.values
    source = source_settings(settings)
    resources = resource_options(settings)
    mode = mode_of(resources)
    return ServeSettings(
        mode=mode, source=source, resources=resources, reload_resources=resource_reloader(settings),
        plugin_dir=v["device_plugin_path"] or os.path.join(v["kubelet_root_dir"], "device-plugins"),
        metrics_address=v["metrics_address"], config_path=settings.config.path, cdi_spec_dir=v["cdi_spec_dir"],
        pod_resources_socket=socket_path(v["kubelet_root_dir"]) if v["pod_resources"] else None,
        mps_control_binary=v["mps_control_binary"],
        dra=dra_settings(settings) if mode != "device-plugin" else None, nrt=nrt_settings(settings))


def nrt_settings(settings: Settings) -> NrtSettings | None:
    """With --nrt: the publisher's settings, for the node NODE_NAME names (the chart sets it)."""
    v = settings.values
    if not v.get("nrt"):
        return None
    node = node_name(settings, "nrt", "publishing the NodeResourceTopology needs the node's name")
    return NrtSettings(node_name=node, pod_resources_socket=socket_path(v["kubelet_root_dir"]),
                       kubelet_config=v["kubelet_config"])


def make_source(settings: Settings) -> TopologySource:
    """The topology source of an offline command (`discover`, `allocate`, `explain`, the demo), built by the root."""
    return build_source(source_settings(settings))
