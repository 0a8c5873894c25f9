"""Typed settings: what the composition root reads, as frozen dataclasses.

Why: the options were one dict read by string key wherever something was
built, so a misspelt key or a wrong type surfaced only at run time, in the
one mode that read it. These dataclasses are built once, by `plugin.cli.typed`
from the resolved options (names and defaults stay declared once, in
`plugin.config.flags`), after every check that names a flag, variable or
file field; the root and what it builds read fields, never keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ...model.resources import ResourceOptions

if TYPE_CHECKING:
    from ...dra.slices.imex_channels import ImexChannels
    from ...model.nic_pools.pools import NicPool

#: How `serve` runs: device-plugin servers only, DRA only, or both (some resources each way).
Mode = Literal["device-plugin", "dra", "both"]


@dataclass(frozen=True)
class SourceSettings:
    """Where the topology comes from: a simulated node, or the real hardware under these roots."""

    #: The `--simulate` text (built-in name, YAML file, `nvidia-smi topo -m` text); None: real hardware.
    simulate: str | None
    sysfs_root: str
    dev_root: str
    proc_root: str
    fail_on_init_error: bool
    #: The config file's `gpus.health` section (catalog overrides, quiet period).
    gpu_health: Mapping[str, Any]
    nic_link_health: bool
    fabric_labels_file: str | None
    fabric_recheck_s: float | None
    #: With `--fabric-labels-node`: this node's name (NODE_NAME), whose Node object gets the clique label.
    label_node: str | None = None


@dataclass(frozen=True)
class DraSettings:
    """What the DRA driver of `serve` is built from (only when some resource is served through DRA)."""

    #: NODE_NAME (the chart sets it from the downward API).
    node_name: str
    #: POD_UID: this instance's ID; None: a random ID per process.
    instance_id: str | None
    #: KUBECONFIG when run outside a pod (no KUBERNETES_SERVICE_HOST); None: the pod's service account.
    kubeconfig: str | None
    kubelet_root: str
    cdi_root: str
    dev_root: str
    proc_root: str
    #: GPUs are simulated (`--simulate`): MIG and time-slices are kept in files, not set through NVML.
    simulated: bool
    shared_gpus: bool
    #: `--dra-mig`: none, static or dynamic; `--dra-mig-gpus` (None: every GPU).
    mig_mode: str
    mig_gpus: frozenset[int] | None
    netdev_attach: str
    nri_socket: str
    pod_primary_interface: str
    nccl_env: bool
    toolkit_cdi: str
    toolkit_dirs: tuple[str, ...]
    toolkit_kind: str
    #: MPS claims: the control daemons' host directory (`--mps-root`) and program (`--mps-control-binary`).
    mps_root: str
    mps_control_binary: str
    #: `--dra-gpu-shares`: shares per GPU a claim can take by count (0: none).
    gpu_shares: int = 0
    #: `--dra-imex-channels` with the channels' major (None: no channels published).
    imex: ImexChannels | None = None
    #: The host IMEX daemon's control program asked before a channel is handed out ("": not asked; on a simulated
    #: node only when `--imex-control-binary` is given) and its command socket.
    imex_control_binary: str = ""
    imex_control_socket: str = "/etc/nvidia-imex/imex_ctrl.sock"
    #: The NIC pools and the default NIC resource name: a NIC's Multus `resourceName` attribute is its
    #: device-plugin resource name, the same in both modes.
    nic_pools: tuple[NicPool, ...] = ()
    nic_resource_name: str = ""


@dataclass(frozen=True)
class NrtSettings:
    """The NodeResourceTopology publisher's settings (`--nrt`, plugin/nrt/)."""

    #: NODE_NAME: the object is this node's (and owned by its Node).
    node_name: str
    #: The kubelet's pod-resources socket: what is held, for `available`.
    pod_resources_socket: str
    #: `--kubelet-config`: the Topology Manager policy and scope published as attributes.
    kubelet_config: str


@dataclass(frozen=True)
class ServeSettings:
    """Everything `serve` builds its daemon from."""

    mode: Mode
    source: SourceSettings
    resources: ResourceOptions
    #: Re-reads the config file into new resource options (flags and env still win); raises `InputError`s.
    reload_resources: Callable[[], ResourceOptions] | None
    plugin_dir: str
    metrics_address: str | None
    config_path: str | None
    cdi_spec_dir: str | None
    pod_resources_socket: str | None
    #: The MPS control program the device-plugin side's `sharing.mps` daemons run (`--mps-control-binary`).
    mps_control_binary: str
    #: None in device-plugin mode.
    dra: DraSettings | None = None
    #: None without `--nrt`.
    nrt: NrtSettings | None = None
