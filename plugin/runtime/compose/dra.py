"""The DRA side of `serve`: the driver and every collaborator it is given.

Why one module: which MIG backend, which sharing backend, whether the NIC side
(pod network, NRI, claim-status writer) exists and which API client is used
are decisions of the mode and the hardware, not of the driver; here they are
made once, from `DraSettings`, and handed to `DraDriver` as `DraParts`.
Everything here is imported only in DRA mode (lightkube, the DRA driver).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from allocator.topology import Device

from ...errors import InputError, RuntimeFailure
from ..options import DraFactory, DraSide
from .settings import DraSettings

if TYPE_CHECKING:
    from ...dra.driver import DraDriver, DraOptions, DraParts, NicSide
    from ...dra.mig.devices import DraMig
    from ...dra.claims.sharing import GpuSharing

log = logging.getLogger(__name__)


def sharing_backend(options: DraOptions) -> Callable[[str], GpuSharing]:
    """Claim time-slices: set with nvidia-smi on real GPUs, kept in a file beside the checkpoint otherwise."""
    from ...dra.claims.sharing import GpuSharing, NvidiaSmiTimeSlice, SimulatedTimeSlice  # noqa: PLC0415 (DRA mode only)

    driver = options.driver_name
    if not options.real_gpus:
        return lambda path: GpuSharing(driver, SimulatedTimeSlice(path))

    def real(_path: str) -> GpuSharing:
        from ...sources.nvml_gpus import DiscoveryError, import_nvml  # noqa: PLC0415 (real GPUs only)

        try:
            nvml = import_nvml()  # for the compute-mode check before a time-slice is set
        except DiscoveryError:
            nvml = None
        return GpuSharing(driver, NvidiaSmiTimeSlice(nvml=nvml))

    return real


def nic_side(driver: DraDriver) -> NicSide:
    """The pod network of `driver`: NICs moved into their pods' namespaces through NRI (pyroute2 loaded here)."""
    from ...dra.claims.status import ClaimStatusWriter  # noqa: PLC0415 (only where NICs move)
    from ...dra.driver import NicSide  # noqa: PLC0415 (as above)
    from ...dra.network.pod_network import PodNetwork  # noqa: PLC0415 (as above)
    from ...netattach import NetAttacher, exists, max_mtu  # noqa: PLC0415 (pyroute2 only where NICs move)
    from ...nri import NriPlugin  # noqa: PLC0415 (as above)

    def probe(netdev: str) -> int | None:
        return max_mtu(netdev) if exists(netdev) else None

    options = driver.options
    status = ClaimStatusWriter(driver.api, options.driver_name)
    holder: list[NriPlugin] = []  # the pod network asks whether NRI is connected; NRI is made with the handler
    network = PodNetwork(
        driver=options.driver_name, pool=options.slices.pool, checkpoint=driver.checkpoint,
        attacher=NetAttacher(driver.paths.netattach_ledger), status=status, probe=probe,
        taken_names=("lo", options.pod_primary_interface), connected=lambda: holder[0].connected,
        nri_socket=options.nri_socket)
    # Any: PodNetwork's `Sandbox` protocol declares settable fields and NRI's `PodSandbox` is frozen, so mypy
    # rejects a handler that only reads them (the driver held it as Any before, too).
    handler: Any = network
    holder.append(NriPlugin(options.nri_socket, handler))
    return NicSide(pod_network=network, nri=holder[0], status_writer=status)


def dra_parts(options: DraOptions, api: Any) -> DraParts:
    """The collaborators of a driver with `options` talking to `api`."""
    from ...dra.driver import DraParts  # noqa: PLC0415 (DRA mode only)
    from ...dra.slices.publisher import SlicePublisher  # noqa: PLC0415 (as above)

    return DraParts(publisher=SlicePublisher(api, options.slices, resync_s=options.resync_s),
                    sharing=sharing_backend(options), nic_side=nic_side)


def dra_driver(options: DraOptions, api: Any, cdi: Any = None, owns_api: bool = False) -> DraDriver:
    """A `DraDriver` with its collaborators (the one place one is built; tests build theirs here too)."""
    from ...dra.driver import DraDriver  # noqa: PLC0415 (DRA mode only)

    return DraDriver(options, api, dra_parts(options, api), cdi=cdi, owns_api=owns_api)


def dra_mig(s: DraSettings) -> tuple[DraMig, Callable[[str], Any] | None, Any]:
    """(DraMig, MIG backend factory or None, capability-node reader) from `--dra-mig`/`--dra-mig-gpus`.

    A simulated node keeps its MIG instances in a file in the driver's plugin directory
    (`simulated-mig.json`); real GPUs go through NVML, with capability nodes from procfs.
    """
    from ...dra.mig.devices import DraMig  # noqa: PLC0415 (DRA mode only)
    from ...dra.mig.prepare import simulated_caps  # noqa: PLC0415 (DRA mode only)

    if s.mig_mode != "dynamic":
        return DraMig(s.mig_mode, s.mig_gpus), None, simulated_caps
    from ...dra.mig.instances import NvmlMigBackend, SimulatedMigBackend, default_state_path  # noqa: PLC0415 (dynamic MIG only)

    if s.simulated:
        return (DraMig(s.mig_mode, s.mig_gpus, placements=lambda g: SimulatedMigBackend(os.devnull).placements(g)),
                lambda plugin_dir: SimulatedMigBackend(default_state_path(plugin_dir)), simulated_caps)
    import pynvml  # noqa: PLC0415 (real GPUs only: pynvml)

    from ...sources.nvml_mig import CapsReader, caps_attribute  # noqa: PLC0415 (real GPUs only)

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
        reader = CapsReader(s.proc_root)
        minor = gpu.minor if gpu.minor is not None else gpu.index
        gi, ci = reader.minor(minor, inst.gi, None), reader.minor(minor, inst.gi, inst.ci)
        out = {"caps": caps_attribute(gi, ci)} if gi is not None and ci is not None else {}
        if reader.major:
            out["caps_major"] = reader.major
        return out

    return DraMig(s.mig_mode, s.mig_gpus, placements=placements), lambda _plugin_dir: nvml, caps


def nic_resource_names(s: DraSettings) -> Callable[[Device], str | None]:
    """A NIC's device-plugin resource name (the first NIC pool that selects it, or --nic-resource-name without
    pools), which Multus's NetworkAttachmentDefinitions name: the same name in both modes."""
    from ...model.nic_pools.pools import pool_of  # noqa: PLC0415 (DRA mode only)

    def name(device: Device) -> str | None:
        if not s.nic_pools:
            return s.nic_resource_name
        pool = pool_of(device, s.nic_pools)
        return pool.resource_name if pool is not None else None

    return name


def dra_factory(s: DraSettings) -> DraFactory:
    """How `serve` makes its DRA driver: the node from NODE_NAME, this instance from POD_UID (the chart sets
    both from the downward API), the API server through the pod's service account, or the file KUBECONFIG
    names when run outside a pod."""

    async def make(include: Callable[[Device], bool]) -> DraSide:
        from ...dra import DraOptions, SliceOptions  # noqa: PLC0415 (DRA mode only: lightkube and the DRA driver)
        from ...kube.client import KubeConfigError, in_cluster_api, kubeconfig_api  # noqa: PLC0415 (DRA mode only)

        mig, backend, caps = dra_mig(s)
        try:
            slices = SliceOptions(node_name=s.node_name, include=include, mig=mig, shared_gpus=s.shared_gpus,
                                  gpu_shares=s.gpu_shares, nic_resource_name=nic_resource_names(s), imex=s.imex)
        except ValueError as e:
            raise InputError(f"NODE_NAME: {e} (fix: set it from fieldRef spec.nodeName)") from None
        try:
            api = await (in_cluster_api() if s.kubeconfig is None else kubeconfig_api(s.kubeconfig))
        except KubeConfigError as e:
            raise RuntimeFailure(f"DRA mode cannot reach the API server: {e} (fix: run in a pod with a service "
                                 "account token, or set KUBECONFIG)") from None
        options = DraOptions(slices, kubelet_root=s.kubelet_root, cdi_root=s.cdi_root, instance_id=s.instance_id,
                             dev_root=s.dev_root, mig_backend=backend, mig_caps=caps, real_gpus=not s.simulated,
                             netdev_attach=s.netdev_attach, nri_socket=s.nri_socket,
                             pod_primary_interface=s.pod_primary_interface, nccl_env=s.nccl_env,
                             toolkit_cdi=s.toolkit_cdi, toolkit_dirs=s.toolkit_dirs, toolkit_kind=s.toolkit_kind,
                             mps_root=s.mps_root, mps_control_binary=s.mps_control_binary,
                             imex_control_binary=s.imex_control_binary, imex_control_socket=s.imex_control_socket)
        return dra_driver(options, api, owns_api=True)

    return make
