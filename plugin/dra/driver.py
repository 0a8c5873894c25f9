"""The DRA driver of one node: kubelet side (registration, prepare/unprepare) and API side (slices).

Start order matters: the DRA service must be serving before the registration
socket appears, because the kubelet dials the endpoint as soon as it has
registered us. Stop order is the reverse: the registration socket goes first
(the kubelet deregisters this instance and, during a rolling update, falls
back to the other one), then the service.

What survives a restart of this process: the checkpoint (prepared claims), the
NICs attached to pods (the netattach ledger) and the published slices. The kubelet re-registers us by itself when it restarts
(its plugin watcher walks plugins_registry at start), so there is no socket
watching here, unlike the device-plugin side.

Wiring (for the daemon): with `include` selecting the devices whose resource
is in DRA mode (and the device-plugin side leaving exactly those out),

    api = await in_cluster_api()                       # plugin.kube.client; kubeconfig_api(path) outside a pod
    options = DraOptions(SliceOptions(node_name=NODE_NAME, include=in_dra_mode), instance_id=POD_UID)
    driver = dra_driver(options, api)                  # plugin.runtime.compose.dra: the driver and its parts
    await driver.start(topology)                       # CheckpointError: exit 2, message names the file
    driver.update(new_topology)                        # on every topology change (health, hot-plug)
    await driver.stop(); await api.close()             # on SIGTERM

NICs (issue 21): with `netdev_attach="auto"` and NICs with a network
interface among the devices served, `start` also connects to the container runtime's NRI socket
(`plugin.nri.NriPlugin`) with `plugin.dra.network.pod_network.PodNetwork` as the
handler, which moves each prepared NIC into its pod's network namespace when
the sandbox starts. Otherwise (GPU-only, `netdev_attach="off"`) neither
`plugin.nri` nor `plugin.netattach` (pyroute2) is even imported.

Collaborators (issue 31): the driver builds what is keyed to its own paths
(checkpoint, CDI writer, registration, health board, MIG book) and is given
the rest, as `DraParts`, by the composition root (`plugin.runtime.compose.dra`):
the slice publisher, the sharing backend and the NIC side (pod network, NRI,
claim-status writer), so that which backend runs in which mode is decided in
one file.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from allocator.topology import UNHEALTHY, DeviceKind, NodeTopology

from ..api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from ..model.cdi import CdiOptions
from ..model.cdi.toolkit import DEFAULT_TOOLKIT_DIRS, TOOLKIT_STRATEGIES, ToolkitSpecs
from .kubelet.cdi import ClaimCdi, ClaimSpecs
from .kubelet.checkpoint import ClaimCheckpoint
from .kubelet.health_service import HealthBoard
from .kubelet.imex_ready import DEFAULT_SOCKET as DEFAULT_IMEX_SOCKET, ImexReadiness
from ..mps.control import MpsControl
from .claims.mps import ClaimMpsDaemons
from .mig.prepare import CapsFor, MigPreparer, simulated_caps
from .kubelet.paths import DraPaths, new_instance_id
from .kubelet.prepare import ClaimNetwork, ClaimPreparer, PrepareLimits
from .claims.sharing import GpuSharing, state_path
from .slices.publisher import SlicePublisher
from .kubelet.service import RegistrationService, add_dra_services
from .slices.build import SliceOptions, device_table

#: `--netdev-attach` values: attach NICs through NRI when DRA serves NICs, or never.
NETDEV_ATTACH = ("auto", "off")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DraOptions:
    """Everything the DRA side needs; plain data, mapped from the config/CLI options model later."""

    slices: SliceOptions
    #: The kubelet's root directory (holds plugins_registry/ and plugins/).
    kubelet_root: str = "/var/lib/kubelet"
    #: Where CDI spec files go (the container runtime reads them).
    cdi_root: str = "/var/run/cdi"
    #: This instance's ID, normally the pod UID from the downward API; None: a random ID per process.
    instance_id: str | None = None
    #: Seconds between checks that the published slices are still there and current.
    resync_s: float = 60.0
    #: Where this process sees the host's /dev (device numbers for the CDI specs; `--dev-root`).
    dev_root: str = "/dev"
    #: Put the NCCL hint (NCCL_IB_HCA / NCCL_SOCKET_IFNAME) in each claim's CDI spec (`--nccl-env`).
    nccl_env: bool = False
    #: Batch size, reads in flight and the read bound of NodePrepareResources (plugin/dra/kubelet/prepare.py).
    prepare_limits: PrepareLimits = PrepareLimits()
    #: Seconds in-flight kubelet calls get to finish on stop before they are cancelled.
    stop_grace_s: float = 1.0
    #: Seconds between repeats of the device health list on the kubelet's DRAResourceHealth stream.
    health_heartbeat_s: float = 10.0
    #: Dynamic MIG (`slices.mig.mode == "dynamic"`): creates and destroys MIG instances (plugin/dra/mig/instances.py);
    #: a callable given the driver's plugin directory (where a simulated backend keeps its state).
    mig_backend: Any = None
    #: The capability nodes of a created MIG instance (`caps`, `caps_major` attributes); procfs on real GPUs.
    mig_caps: CapsFor = simulated_caps
    #: GPUs are real (NVML): claim time-slices are set with nvidia-smi; otherwise (simulated nodes) they are
    #: kept in a file beside the checkpoint (plugin/dra/claims/sharing.py).
    real_gpus: bool = False
    #: MPS claims: the control daemons' host directory (`--mps-root`) and program (`--mps-control-binary`).
    mps_root: str = "/run/nvidia/mps"
    mps_control_binary: str = "nvidia-cuda-mps-control"
    #: How often a claim's ready control daemon is asked whether it still answers (`plugin.mps.supervisor`).
    mps_probe_interval_s: float = 5.0
    #: Host-managed IMEX: the host IMEX daemon's control program asked before a channel is handed out
    #: (`--imex-control-binary`, plugin/dra/kubelet/imex_ready.py; "": not asked) and its command socket.
    imex_control_binary: str = ""
    imex_control_socket: str = DEFAULT_IMEX_SOCKET
    #: `auto`: move prepared NICs into their pods through NRI when NICs are served here; `off`: never
    #: (`--netdev-attach`; the library default is off, the daemon's flag defaults to auto).
    netdev_attach: str = "off"
    #: The container runtime's NRI socket (`--nri-socket`).
    nri_socket: str = "/var/run/nri/nri.sock"
    #: The interface the pod's primary CNI creates: no NIC may take its name (`--pod-primary-interface`).
    pod_primary_interface: str = "eth0"
    #: NVIDIA's toolkit's CDI names beside ours for each prepared GPU/MIG device (`--dra-toolkit-cdi`: uuid,
    #: index) or not (off), checked against its spec in `toolkit_dirs` of kind `toolkit_kind`
    #: (plugin/model/cdi/toolkit.py).
    toolkit_cdi: str = "off"
    toolkit_dirs: tuple[str, ...] = DEFAULT_TOOLKIT_DIRS
    toolkit_kind: str = "nvidia.com/gpu"

    def __post_init__(self) -> None:
        if self.netdev_attach not in NETDEV_ATTACH:
            raise ValueError(f"netdev_attach {self.netdev_attach!r}: want one of {', '.join(NETDEV_ATTACH)}")
        if self.toolkit_cdi not in ("off", *TOOLKIT_STRATEGIES):
            raise ValueError(f"toolkit_cdi {self.toolkit_cdi!r}: want off or one of {', '.join(TOOLKIT_STRATEGIES)}")

    @property
    def driver_name(self) -> str:
        return self.slices.driver_name


@dataclass(frozen=True)
class NicSide:
    """The NIC side of one driver, when NICs are attached to pods: the prepare handler, its NRI connection
    and the claim-status writer (started and stopped by the driver)."""

    pod_network: Any
    nri: Any
    status_writer: Any


@dataclass(frozen=True)
class DraParts:
    """What the driver is given rather than builds (built by `plugin.runtime.compose.dra`)."""

    publisher: SlicePublisher
    #: The sharing backend, given the path of the file a simulated node keeps time-slices in.
    sharing: Callable[[str], GpuSharing]
    #: Builds the NIC side for this driver (called at start, only when NICs with a netdev are served here).
    nic_side: Callable[[DraDriver], NicSide] | None = None


async def _serve(path: str, add: Any) -> grpc.aio.Server:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    add(server)
    old_umask = os.umask(0o177)  # sockets 0600: only root (the kubelet) may talk to us
    try:
        server.add_insecure_port(f"unix:{path}")
        await server.start()
    finally:
        os.umask(old_umask)
    return server


class DraDriver:
    def __init__(self, options: DraOptions, api: Any, parts: DraParts, cdi: ClaimCdi | None = None,
                 owns_api: bool = False):
        self.options = options
        self.api = api
        self.parts = parts
        self.paths = DraPaths(os.path.abspath(options.kubelet_root), options.driver_name,
                              options.instance_id or new_instance_id())
        self.checkpoint = ClaimCheckpoint(self.paths.checkpoint, self.paths.lock, options.driver_name)
        self.cdi = cdi or ClaimSpecs(options.cdi_root, options.driver_name,
                                     CdiOptions(spec_dir=options.cdi_root, dev_root=options.dev_root),
                                     nccl_topology=(lambda: self.topology) if options.nccl_env else None,
                                     toolkit=None if options.toolkit_cdi == "off" else
                                     ToolkitSpecs(options.toolkit_dirs, options.toolkit_kind, options.toolkit_cdi))
        #: Close the API client on stop (the daemon hands the driver a client of its own).
        self.owns_api = owns_api
        self.publisher = parts.publisher
        self.registration = RegistrationService(options.driver_name, self.paths.service_socket, self._on_registered)
        #: Device health for the kubelet's pod status (plugin/dra/kubelet/health_service.py).
        self.health = HealthBoard(options.slices, heartbeat_s=options.health_heartbeat_s)
        #: The topology as the daemon last gave it; `_topology` is it with the devices whose MPS daemon is down
        #: marked Unhealthy (`_with_mps_health`).
        self._given: NodeTopology | None = None
        self._topology: NodeTopology | None = None
        #: The control daemons of MPS claims (plugin/dra/claims/mps.py), supervised while the driver runs.
        self.mps = ClaimMpsDaemons(os.path.dirname(self.paths.checkpoint), options.mps_root,
                                   MpsControl(options.mps_control_binary), options.mps_probe_interval_s)
        self.mps.on_health = self._mps_health_changed
        self._service: grpc.aio.Server | None = None
        self._registrar: grpc.aio.Server | None = None
        self.preparer: ClaimPreparer | None = None
        #: Dynamic MIG's instance keeper (plugin/dra/mig/prepare.py), when a GPU is partitionable.
        self.mig: MigPreparer | None = None
        if options.slices.mig.mode == "dynamic" and options.mig_backend is not None:
            self.mig = MigPreparer(options.mig_backend(self.paths.plugin_dir), self.paths.mig_book,
                                   lambda: {d.name: d for d in self.topology.gpus}, caps=options.mig_caps)
        #: With NIC attachment on: the pod-network handler, its NRI connection and its claim-status writer.
        self.pod_network: Any = None
        self.nri: Any = None
        self._status_writer: Any = None

    @property
    def topology(self) -> NodeTopology:
        if self._topology is None:
            raise RuntimeError("the DRA driver has not been started")
        return self._topology

    def _on_registered(self, registered: bool, error: str) -> None:
        if registered:
            # A (re)started kubelet wipes the node's slices at start: check ours soon.
            self.publisher.trigger()

    async def start(self, topology: NodeTopology) -> None:
        """Serve and register; raises CheckpointError (naming the file) when the checkpoint is unusable."""
        self._given = topology
        self._topology = topology = self._with_mps_health(topology)
        self.health.update(topology)
        self.paths.make_dirs()
        claims = self.checkpoint.check()
        # Before the kubelet can call: the daemons of claims prepared before a restart are supervised again.
        await self.mps.start(set(await self.checkpoint.read()))
        for uid in await self.checkpoint.update(self._remove_orphan_specs):
            log.info("removed the CDI spec of a claim no checkpoint entry owns", extra={"claim_uid": uid})
        if self.mig is not None:
            for e in await self.checkpoint.update(self.mig.recover):
                log.info("settled a MIG instance of an interrupted prepare",
                         extra={"claim_uid": e.claim, "device": e.device, "state": e.state})
        for path in self.paths.remove_stale_sockets():
            log.info("removed a stale socket of an earlier instance", extra={"socket": path})
        network = self._pod_network(topology)
        self.preparer = preparer = ClaimPreparer(
            options=self.options.slices, checkpoint=self.checkpoint, cdi=self.cdi, read_claim=self.api.get_claim,
            topology=lambda: self.topology, limits=self.options.prepare_limits, mig=self.mig,
            sharing=self._sharing(), network=network, mps=self.mps, imex_ready=self._imex_ready())
        self._service = await _serve(self.paths.service_socket, lambda s: add_dra_services(s, preparer, self.health))
        self._registrar = await _serve(self.paths.registration_socket,
                                       lambda s: reg_grpc.add_RegistrationServicer_to_server(self.registration, s))
        self.publisher.start(topology)
        if self.nri is not None:
            self._status_writer.start()
            await self.nri.start()  # connects (and reconnects) in the background
        log.info("DRA driver serving", extra={"driver": self.options.driver_name, "prepared_claims": claims,
                                              "registration": self.paths.registration_socket,
                                              "endpoint": self.paths.service_socket})

    def _sharing(self) -> GpuSharing:
        return self.parts.sharing(state_path(self.paths.checkpoint))

    def _imex_ready(self) -> ImexReadiness | None:
        """The readiness check of the host's IMEX daemon, where channels are published and a program is named."""
        o = self.options
        if o.slices.imex is None or not o.imex_control_binary:
            if o.slices.imex is not None:
                log.info("IMEX channels handed out without asking the host's IMEX daemon (--imex-control-binary "
                         "empty, or a simulated node without it)")
            return None
        return ImexReadiness(o.imex_control_binary, o.imex_control_socket)

    def _pod_network(self, topology: NodeTopology) -> ClaimNetwork | None:
        """The NIC side of prepare when NICs are to be attached here (None: `NoNetwork`, nothing attached)."""
        if self.options.netdev_attach != "auto" or self.parts.nic_side is None:
            return None
        if not any(d.kind is DeviceKind.NIC and d.attributes.get("netdev")
                   for d in device_table(topology, self.options.slices).values()):
            # GPU-only, or NICs without a network interface (vfio-pci, simulated without `netdev`): nothing of
            # the NIC side runs, not even the NRI connection. Decided at start: a restart picks up new NICs.
            return None
        side = self.parts.nic_side(self)
        self.pod_network, self.nri, self._status_writer = side.pod_network, side.nri, side.status_writer
        log.info("NICs are attached to their pods through NRI", extra={"nri_socket": self.options.nri_socket,
                                                                      "ledger": self.paths.netattach_ledger})
        return self.pod_network

    def _remove_orphan_specs(self, claims: dict[str, Any]) -> list[str]:
        """Specs left by a crash between writing a claim's spec and recording it (under the checkpoint lock,
        so a prepare of another instance is never caught half-way)."""
        uids: list[str] = getattr(self.cdi, "claim_uids", lambda: [])()
        orphans = [u for u in uids if u not in claims]
        for u in orphans:
            self.cdi.remove_claim_spec(u)
        return orphans

    def ready(self) -> tuple[bool, str]:
        """Ready once the kubelet confirmed the registration (NotifyRegistrationStatus) and while the
        ResourceSlices are published: a driver whose devices the scheduler cannot see serves nobody."""
        name = self.options.driver_name
        status = self.registration.status
        if status is None:
            return False, f"DRA driver {name}: not registered with the kubelet yet"
        if not status[0]:
            return False, f"DRA driver {name}: the kubelet refused it: {status[1]}"
        published, why = self.publisher.health()
        if not published:
            return False, f"DRA driver {name}: {why}"
        return True, f"DRA driver {name} registered, {why}{self._nri_state()}"

    def _nri_state(self) -> str:
        """Whether NICs can be attached now. Not a readiness condition: pods without a NicConfig are served
        either way, and a claim with one is refused at prepare, saying how to turn NRI on."""
        if self.nri is None:
            return ""
        if self.nri.connected:
            return f"; NRI connected ({self.options.nri_socket}): NICs are attached to their pods"
        return (f"; NRI not connected ({self.options.nri_socket}): NICs stay in the node's namespace and claims "
                "with a NicConfig are refused (turn NRI on in containerd, docs/networking.md)")

    def update(self, topology: NodeTopology) -> None:
        """A new topology: prepare and the kubelet's health stream answer from it at once, the slices follow."""
        self._given = topology
        self._topology = topology = self._with_mps_health(topology)
        self.health.update(topology)
        self.publisher.update(topology)

    def _with_mps_health(self, topology: NodeTopology) -> NodeTopology:
        """`topology` with each healthy device whose MPS control daemon is down marked Unhealthy (its reason
        becomes the slice taint's value, `mps-daemon-down`); a device unhealthy for another cause keeps it."""
        down = {d.name: why for d in topology.devices if d.healthy and (why := self.mps.down.get(d.name))}
        return topology.with_health({n: UNHEALTHY for n in down}, down) if down else topology

    def _mps_health_changed(self) -> None:
        """A claim's control daemon went down or came back (on the loop): health and slices follow at once."""
        if self._given is not None:
            self.update(self._given)

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving, about `grace` seconds at most whatever the kubelet queued: in-flight prepares answer
        at their next step (claims not yet prepared fail, saying why); those still reading after `grace` are
        cancelled. Either way the checkpoint lists exactly the claims whose CDI specs were written."""
        grace = self.options.stop_grace_s if grace is None else grace
        if self.preparer is not None:
            self.preparer.stop()
        if self.nri is not None:  # no sandbox event is handled past this point; the ledger keeps what is attached
            await self.nri.stop()
            await self._status_writer.stop()
        registrar, self._registrar = self._registrar, None
        service, self._service = self._service, None
        if registrar is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.paths.registration_socket)
            await registrar.stop(grace)
        await self.publisher.stop()
        await self.mps.detach()  # the daemons keep serving the claims' containers; a restart takes them over
        self.health.close()  # health streams end now, not after the grace
        if service is not None:
            await service.stop(grace)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.paths.service_socket)
        if self.owns_api:
            await self.api.close()
