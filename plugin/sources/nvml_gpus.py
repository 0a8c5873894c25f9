"""GPU discovery through NVML: devices, NUMA nodes and the link between every pair.

Why we count links ourselves: NVIDIA's plugin (go-gpuallocator) re-queries
every link of device i for every peer j (n*(n-1)*18*2 NVML calls, seconds on
a big node, and on every GetPreferredAllocation), and it does not handle
NVSwitch at all: on HGX/DGX every NVLink ends at a switch, so every pair got
0 NVLinks. Here each device's links are read ONCE, at start (and on
hot-plug), never inside an RPC:

- `nvmlDeviceGetNvLinkState` for each of the NVML_NVLINK_MAX_LINKS links;
  for each active one, the remote end's PCI address
  (`nvmlDeviceGetNvLinkRemotePciInfo_v2`) and, where the driver has it, its
  type (`nvmlDeviceGetNvLinkRemoteDeviceType`).
- The remote type is trusted first. A switch end need not have a PCI address
  this node can see: GB200/GB300 NVL72 trays on driver 580 report
  `FFFFFFFF:FF:FF.0` (the switches sit in other trays), so an address that
  does not parse never drops a link whose type is known.
- A link whose remote end is a GPU counts towards that pair (`NV<n>`,
  bridges and hybrid cube-mesh). If the two ends disagree the higher count
  wins, with a warning (NVIDIA's code panics there, k8s-device-plugin #448).
- A link whose remote end is an NVSwitch makes the GPU part of the switch
  fabric: every pair of fabric GPUs in the same NVSwitch domain gets `NV<n>`,
  n = the smaller of the two GPUs' switch-link counts (a GPU with a failed
  link drags only its own pairs down). The domain is what NVML reports: all
  switch-connected GPUs of the node form one, split by fabric clique where
  both GPUs have one (`nvmlDeviceGetGpuFabricInfoV`; the switch addresses
  cannot tell domains apart when they are unknown). Without the remote type
  (old driver or bindings, or UNKNOWN), a remote end that is no GPU is taken
  as a switch, unless sysfs shows it as a non-NVIDIA device (an IBM POWER9
  NPU: NVLink to the CPU, which is no GPU pair at all); one with no usable
  address is taken as a switch too (only an NVSwitch outside the tray has none).
- The PCIe level of a pair comes from `nvmlDeviceGetTopologyCommonAncestor`
  (INTERNAL/SINGLE -> PIX, MULTIPLE -> PXB, HOSTBRIDGE -> PHB, NODE -> NODE,
  SYSTEM -> SYS); where NVML cannot say, from the sysfs PCIe tree
  (`pcie.pcie_level`).

NVLink fabric (multi-node NVLink, GB200/GB300 NVL72): `nvmlDeviceGetGpuFabricInfoV`
(or the older `nvmlDeviceGetGpuFabricInfo`) per GPU gives the cluster UUID and
clique ID once the fabric manager has finished (`state` COMPLETED, `status`
SUCCESS); that becomes `Device.fabric`. A driver without the call, a GPU
without a fabric (NOT_SUPPORTED) or a fabric not yet set up leaves it None
with a debug log: most GPUs have no fabric, which is no fault.

NUMA node: `<sysfs_root>/bus/pci/devices/<bdf>/numa_node` with the NVML bus
id in the kernel's form (`00000000:3B:00.0` -> `0000:3b:00.0`); -1 or
unreadable -> None (no TopologyInfo), as NVIDIA's plugin does.

The `nvml` module is injected (default: `import pynvml`), so the same code
runs against the test double `topo_testkit.fake_nvml.FakeNvml` (tests/support) in CI.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from allocator.topology import HEALTHY, UNHEALTHY, Device, FabricInfo, DeviceKind, Link, LinkLevel, NodeTopology

from ..health.monitor import GpuHealthMonitor
from ..health.options import GpuHealthOptions
from ..health.evidence import EvidenceReader, read_boot_id
from ..health.policy import Evidence, Fault, GpuHealth
from ..health.store import restorable
from ..health.service import watch_gpu_health
from .base import Publish
from ..errors import RuntimeFailure
from .nvml_mig import CapsReader, ProfileCalls, discover_migs
from .pcie import normalize_bdf, pcie_level, read_numa_node

log = logging.getLogger(__name__)

__all__ = [
    "DiscoveryError",
    "GpuLinks",
    "NvmlGpuSource",
    "discover_gpus",
    "import_nvml",
    "nvml_level",
    "read_fabric",
]

SOURCE = "nvml"
#: The part of the fix that only helps while fail-on-init-error is on (it is not repeated to whoever turned it off).
_CARRY_ON = (", or pass --no-fail-on-init-error (flags.failOnInitError: false) to serve zero GPUs on nodes "
             "without them")
_INIT_FIX = ("run on a node with the NVIDIA driver and expose libnvidia-ml.so.1 to the container "
             "(nvidia runtime class or CDI)" + _CARRY_ON)


class DiscoveryError(RuntimeFailure):
    """NVML could not be used at start (a runtime failure, exit 1); `str()` says which call failed and the fix."""

    def __init__(self, message: str, fix: str | None = None, code: int | None = None):
        self.code = code
        self.source = SOURCE
        self.detail = message
        self.fix = fix
        super().__init__(f"{SOURCE}: {message}" + (f" (fix: {fix})" if fix else ""))


def import_nvml() -> Any:
    """The real bindings (`nvidia-ml-py`, imported as `pynvml`)."""
    try:
        import pynvml  # noqa: PLC0415 - optional at import time: simulated nodes never need it
    except ImportError as e:
        raise DiscoveryError(f"cannot import pynvml: {e}", fix="pip install nvidia-ml-py") from None
    return pynvml


def _err_code(nvml: Any, e: BaseException) -> int | None:
    return getattr(e, "value", None)


def _str(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def nvml_level(nvml: Any, value: int) -> LinkLevel | None:
    """NVML_TOPOLOGY_* -> our level (None for a value we do not know)."""
    table = {
        getattr(nvml, "NVML_TOPOLOGY_INTERNAL", 0): LinkLevel.PIX,
        getattr(nvml, "NVML_TOPOLOGY_SINGLE", 10): LinkLevel.PIX,
        getattr(nvml, "NVML_TOPOLOGY_MULTIPLE", 20): LinkLevel.PXB,
        getattr(nvml, "NVML_TOPOLOGY_HOSTBRIDGE", 30): LinkLevel.PHB,
        getattr(nvml, "NVML_TOPOLOGY_NODE", 40): LinkLevel.NODE,
        getattr(nvml, "NVML_TOPOLOGY_SYSTEM", 50): LinkLevel.SYS,
    }
    return table.get(value)


@dataclass
class GpuLinks:
    """What one GPU's NVLinks reach, read once per discovery."""

    #: Links per remote GPU, by the remote's PCI address (kernel form).
    gpus: Counter[str] = field(default_factory=Counter)
    #: Links that end at an NVSwitch.
    switch: int = 0
    #: Active links to anything else (an IBM NPU, a GPU NVML gives no address for); not GPU pairs.
    other: int = 0


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str
    bdf: str
    device: Device


def _pci_vendor(sysfs_root: str, bdf: str) -> str | None:
    try:
        with open(f"{sysfs_root}/bus/pci/devices/{bdf}/vendor", encoding="ascii") as f:
            return f.read().strip().lower().removeprefix("0x")
    except (OSError, UnicodeDecodeError):
        return None


class _LinkReader:
    """Reads each GPU's NVLinks once; remembers a driver that lacks the remote-type call."""

    def __init__(self, nvml: Any, sysfs_root: str, gpu_bdfs: set[str]):
        self.nvml = nvml
        self.sysfs_root = sysfs_root
        self.gpu_bdfs = gpu_bdfs
        self.max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        self.remote_pci = (getattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo_v2", None)
                           or getattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", None))
        self.remote_type = getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        self.no_type_codes = {getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
                              getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)}
        self.t_gpu = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_GPU", 0)
        self.t_switch = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        self.t_npu = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_IBMNPU", 1)
        self.unknown_address_logged = False

    def _kind(self, handle: Any, link: int, bdf: str | None) -> str:
        """`gpu`, `switch` or `other` for the remote end of an active link (`bdf` None: no usable address)."""
        if self.remote_type is not None:
            try:
                t = self.remote_type(handle, link)
            except self.nvml.NVMLError as e:
                if _err_code(self.nvml, e) in self.no_type_codes:
                    log.info("NVML has no nvmlDeviceGetNvLinkRemoteDeviceType; telling switches by bus id")
                    self.remote_type = None
                t = None
            if t == self.t_gpu:
                return "gpu"
            if t == self.t_switch:
                return "switch"
            if t == self.t_npu:
                return "other"
        # No usable type: a known GPU's address is a GPU; an NVIDIA (or unseen) device that is
        # not a GPU is an NVSwitch; anything else (IBM NPU, vendor 1014) is not a GPU pair.
        if bdf is None:
            return "switch"  # no address this node can see: an NVSwitch in another tray (NVL72)
        if bdf in self.gpu_bdfs:
            return "gpu"
        vendor = _pci_vendor(self.sysfs_root, bdf)
        return "switch" if vendor in (None, "10de") else "other"

    def _remote_bdf(self, handle: Any, link: int) -> str | None:
        """The remote end's PCI address in kernel form, or None where NVML gives none that parses."""
        if self.remote_pci is None:
            return None
        try:
            raw = _str(self.remote_pci(handle, link).busId)
        except self.nvml.NVMLError as e:
            log.debug("NVLink remote PCI info unreadable", extra={"link": link, "reason": str(e)})
            return None
        try:
            return normalize_bdf(raw)
        except ValueError:
            if not self.unknown_address_logged:
                log.info("an NVLink's remote end has no PCI address on this node (an NVSwitch outside the tray);"
                         " telling it by its remote device type", extra={"busId": raw.rstrip("\x00")})
                self.unknown_address_logged = True
            return None

    def read(self, handle: Any) -> GpuLinks:
        out = GpuLinks()
        if self.remote_pci is None and self.remote_type is None:
            return out
        for link in range(self.max_links):
            try:
                if not self.nvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
            except self.nvml.NVMLError:
                continue  # no NVLink at all, or beyond this GPU's link count
            bdf = self._remote_bdf(handle, link)
            kind = self._kind(handle, link, bdf)
            if kind == "gpu" and bdf is not None:
                out.gpus[bdf] += 1
            elif kind == "switch":
                out.switch += 1
            else:
                out.other += 1  # a GPU NVML cannot name is no pair we can count
        return out


def _query(nvml: Any, fn: Callable[..., Any], *args: Any) -> tuple[Any, int | None]:
    """(value, None) or (None, NVML error code)."""
    try:
        return fn(*args), None
    except nvml.NVMLError as e:
        return None, _err_code(nvml, e)


def _read_gpu(nvml: Any, index: int, sysfs_root: str) -> _Gpu | None:
    lost = getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _str(nvml.nvmlDeviceGetUUID(handle))
        pci = nvml.nvmlDeviceGetPciInfo(handle)
        bdf = normalize_bdf(_str(pci.busId))
    except nvml.NVMLError as e:
        log.error("GPU skipped: NVML cannot identify it (no handle, UUID or PCI address)",
                  extra={"index": index, "reason": str(e)})
        return None
    except ValueError as e:
        log.error("GPU skipped: unreadable PCI address", extra={"index": index, "reason": str(e)})
        return None
    errors: list[int | None] = []
    name, err = _query(nvml, nvml.nvmlDeviceGetName, handle)
    errors.append(err)
    minor, err = _query(nvml, nvml.nvmlDeviceGetMinorNumber, handle)
    errors.append(err)
    mem, err = _query(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    errors.append(err)
    health = UNHEALTHY if lost in errors else HEALTHY
    if health == UNHEALTHY:
        log.warning("GPU is lost; advertised Unhealthy", extra={"index": index, "uuid": uuid})
    device = Device(
        name=f"GPU{index}", kind=DeviceKind.GPU, index=index,
        numa=read_numa_node(sysfs_root, bdf), health=health, uuid=uuid, pci_bus_id=bdf,
        model=_str(name) if name is not None else None,
        minor=int(minor) if minor is not None else None,
        memory_mib=int(mem.total) // (1024 * 1024) if mem is not None else None,
    )
    module = read_module_id(nvml, handle)
    if module is not None:
        device = replace(device, attributes={**device.attributes, "module_id": str(module)})
    return _Gpu(index, handle, uuid, bdf, device)


#: Why the module ID call gave nothing, logged once per process (every GPU of a node answers alike).
_MODULE_ID_LOGGED: set[str] = set()


def read_module_id(nvml: Any, handle: Any) -> int | None:
    """The GPU's module ID on an NVSwitch baseboard (`nvmlDeviceGetModuleId`), or None.

    Optional, as every newer NVML call here: bindings without the function, a driver without it
    (FUNCTION_NOT_FOUND) or a GPU that has none (NOT_SUPPORTED, PCIe cards) leave the `gpuModuleID`
    DRA attribute out, logged once. The module ID is what Fabric Manager's partitions are made of.
    """
    fn = getattr(nvml, "nvmlDeviceGetModuleId", None)
    reason: str | None = None
    if fn is None:
        reason = "the NVML bindings have no nvmlDeviceGetModuleId"
    else:
        try:
            value = int(fn(handle))
        except nvml.NVMLError as e:
            reason = f"nvmlDeviceGetModuleId: {e}"
        else:
            if value > 0:
                return value
            reason = "nvmlDeviceGetModuleId answered 0"
    if reason not in _MODULE_ID_LOGGED:
        _MODULE_ID_LOGGED.add(reason)
        log.info("GPU module IDs not published (no gpuModuleID DRA attribute)", extra={"reason": reason})
    return None


#: NVML's fabric states in words (`FabricInfo.state`).
_FABRIC_STATES = {0: "not-supported", 1: "not-started", 2: "in-progress", 3: "completed"}
#: The fabric calls, newest first, each with the structure pynvml fills.
_FABRIC_CALLS = (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                 ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"))


def read_fabric(nvml: Any, handle: Any, name: str) -> FabricInfo | None:
    """The GPU's NVLink fabric clique, or None (debug log) where there is none to report."""
    missing = getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)
    for fn_name, struct_name in _FABRIC_CALLS:
        fn, struct = getattr(nvml, fn_name, None), getattr(nvml, struct_name, None)
        if fn is None or struct is None:
            continue
        info = struct()
        try:
            fn(handle, ctypes.byref(info))
        except nvml.NVMLError as e:
            if _err_code(nvml, e) == missing:
                continue  # this driver's NVML lacks the call: try the older one
            log.debug("no NVLink fabric info", extra={"gpu": name, "reason": str(e)})
            return None
        state = _FABRIC_STATES.get(int(info.state), str(int(info.state)))
        if state != "completed" or int(info.status) != getattr(nvml, "NVML_SUCCESS", 0):
            log.debug("NVLink fabric not ready", extra={"gpu": name, "state": state, "status": int(info.status)})
            return None
        cluster = str(uuidlib.UUID(bytes=bytes(bytearray(info.clusterUuid))))
        return FabricInfo(cluster_uuid=cluster, clique_id=int(info.cliqueId), state=state)
    log.debug("NVML has no fabric info call", extra={"gpu": name})
    return None


def _same_switch_domain(a: Device, b: Device) -> bool:
    """Whether two switch-connected GPUs reach each other through the switches.

    NVML names no switch domain, and on NVL72 trays not even the switches' addresses; what it
    does report is each GPU's fabric clique. GPUs in different cliques (other partitions of the
    fabric manager) share no NVLink path; a GPU without a clique (no fabric, or not registered
    yet) is taken to be in the node's one domain, as on every HGX/DGX baseboard.
    """
    if a.fabric is None or b.fabric is None:
        return True
    return (a.fabric.cluster_uuid, a.fabric.clique_id) == (b.fabric.cluster_uuid, b.fabric.clique_id)


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def _discover_initialised(nvml: Any, sysfs_root: str, proc_root: str) -> tuple[list[Device], dict[tuple[str, str], Link]]:
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as e:
        raise DiscoveryError(f"nvmlDeviceGetCount failed: {e}", fix=_INIT_FIX, code=_err_code(nvml, e)) from None
    gpus = [g for g in (_read_gpu(nvml, i, sysfs_root) for i in range(count)) if g is not None]
    caps, calls = CapsReader(proc_root), ProfileCalls(nvml)
    migs: list[Device] = []
    for g in gpus:
        g.device, children = discover_migs(nvml, g.handle, g.device, caps, calls)
        migs += children
    for g in gpus:
        if g.device.health == HEALTHY:
            g.device = replace(g.device, fabric=read_fabric(nvml, g.handle, g.device.name))
    reader = _LinkReader(nvml, sysfs_root, {g.bdf for g in gpus})
    links_of = {g.device.name: reader.read(g.handle) for g in gpus}

    links: dict[tuple[str, str], Link] = {}
    for i, a in enumerate(gpus):
        la = links_of[a.device.name]
        for b in gpus[i + 1:]:
            lb = links_of[b.device.name]
            ab, ba = la.gpus.get(b.bdf, 0), lb.gpus.get(a.bdf, 0)
            if ab != ba:
                log.warning("asymmetric NVLink count; keeping the higher", extra={
                    "pair": f"{a.device.name}-{b.device.name}", "a_to_b": ab, "b_to_a": ba})
            n = max(ab, ba)
            if la.switch and lb.switch and _same_switch_domain(a.device, b.device):
                n += min(la.switch, lb.switch)
            level = _pcie(nvml, a, b, sysfs_root)
            links[_pair(a.device.name, b.device.name)] = Link(nvlinks=n, level=level)
    return [g.device for g in gpus] + migs, links


def _pcie(nvml: Any, a: _Gpu, b: _Gpu, sysfs_root: str) -> LinkLevel:
    try:
        level = nvml_level(nvml, nvml.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle))
    except nvml.NVMLError as e:
        log.debug("NVML has no common ancestor for this pair; reading sysfs",
                  extra={"pair": f"{a.device.name}-{b.device.name}", "reason": str(e)})
        level = None
    if level is None:
        level = pcie_level(sysfs_root, a.bdf, b.bdf, a.device.numa, b.device.numa)
    return level


def discover_gpus(nvml: Any = None, sysfs_root: str = "/sys",
                  proc_root: str = "/proc") -> tuple[list[Device], dict[tuple[str, str], Link]]:
    """Discover every GPU NVML sees, its MIG devices, and the link of every GPU pair.

    Returns (devices named `GPU<nvml index>`, then MIG devices `GPU<i>-mig<slot>`
    (`nvml_mig`), {(name, name): Link}) with every GPU pair present. Initialises NVML and shuts it down again (NVML counts
    references, so a running health monitor is not disturbed). Raises
    DiscoveryError when NVML cannot be initialised or enumerated; a single
    GPU NVML cannot identify is skipped with an error log, a lost one is
    reported Unhealthy.
    """
    nvml = nvml if nvml is not None else import_nvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        raise DiscoveryError(f"cannot initialise NVML: {e}", fix=_INIT_FIX, code=_err_code(nvml, e)) from None
    try:
        return _discover_initialised(nvml, sysfs_root, proc_root)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as e:  # pragma: no cover - nothing useful to do
            log.debug("nvmlShutdown failed", extra={"reason": str(e)})


class NvmlGpuSource:
    """The GPUs of this node as a `TopologySource` (GPUs only; NICs come from sysfs).

    `load()` discovers once (blocking; the daemon runs it in a thread).
    `watch()` runs the GPU health monitor and publishes `current.with_health(...)`
    at once on every change. The hardware source that adds NICs composes
    `discover()` and `watch_health()` instead.
    """

    def __init__(
        self,
        nvml: ModuleType | Any | None = None,
        sysfs_root: str = "/sys",
        fail_on_init_error: bool = True,
        health: GpuHealthOptions | None = None,
        proc_root: str = "/proc",
    ):
        self._nvml = nvml
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root
        self.fail_on_init_error = fail_on_init_error
        self.health = health if health is not None else GpuHealthOptions(proc_root=proc_root)
        self.description = f"nvml (sysfs {sysfs_root})"
        #: The error that made the last discovery serve zero GPUs (fail_on_init_error=False), if any.
        self.init_error: DiscoveryError | None = None
        #: The GPU health monitor while one runs.
        self.monitor: GpuHealthMonitor | None = None

    @property
    def nvml(self) -> Any:
        if self._nvml is None:
            self._nvml = import_nvml()
        return self._nvml

    def discover(self) -> tuple[list[Device], dict[tuple[str, str], Link]]:
        """`discover_gpus`, with `fail_on_init_error=False` turning a DiscoveryError into zero GPUs."""
        try:
            result = discover_gpus(self.nvml, self.sysfs_root, self.proc_root)
        except DiscoveryError as e:
            if self.fail_on_init_error:
                raise
            self.init_error = e
            log.error("GPU discovery failed; serving zero GPUs (fail-on-init-error is off)",
                      extra={"reason": f"{e.source}: {e.detail}",
                             **({"fix": e.fix.removesuffix(_CARRY_ON)} if e.fix else {})})
            return [], {}
        self.init_error = None
        return result

    def load(self) -> NodeTopology:
        devices, links = self.discover()
        return NodeTopology.build(devices, links, source=SOURCE)

    def read_fabrics(self, gpus: Sequence[Device]) -> dict[str, FabricInfo | None]:
        """The fabric clique of each GPU now ({name: FabricInfo or None}), blocking; for the periodic re-read.

        A GPU NVML cannot find by UUID (lost, gone) is left out: the rescan that follows its
        hot-plug or health event speaks for it. Raises NVMLError when NVML cannot be initialised.
        """
        nvml = self.nvml
        nvml.nvmlInit()
        out: dict[str, FabricInfo | None] = {}
        try:
            for g in gpus:
                if g.uuid is None:
                    continue
                try:
                    handle = nvml.nvmlDeviceGetHandleByUUID(g.uuid)
                except nvml.NVMLError as e:
                    log.debug("GPU not found for the fabric re-read", extra={"gpu": g.name, "reason": str(e)})
                    continue
                out[g.name] = read_fabric(nvml, handle, g.name)
        finally:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError as e:  # pragma: no cover - nothing useful to do
                log.debug("nvmlShutdown failed", extra={"reason": str(e)})
        return out

    async def watch_health(self, gpus: Sequence[Device], on_health: Callable[[Mapping[str, GpuHealth]], None],
                           on_links: Callable[[str, str], None] | None = None) -> None:
        """Run GPU health until cancelled; `on_health({gpu name: GpuHealth})` on the loop at each change,
        `on_links(gpu, why)` when a GPU's active NVLinks changed."""
        if not gpus or self.init_error is not None or not self.health.enabled:
            await asyncio.Event().wait()
            return
        await watch_gpu_health(self.nvml, gpus, self.health, on_health, on_links=on_links, started=self._started)

    def _started(self, monitor: GpuHealthMonitor) -> None:
        self.monitor = monitor

    def evidence(self, gpus: Sequence[Device]) -> list[tuple[str, str, Evidence]]:
        """Each GPU's health evidence, read now: the recovery action, pending repairs (for `discover`)."""
        if not gpus or self.init_error is not None:
            return []
        nvml = self.nvml
        nvml.nvmlInit()
        try:
            reader = EvidenceReader(nvml)
            return [(g.name, g.uuid, reader.read(g.uuid)) for g in gpus if g.uuid]
        finally:
            nvml.nvmlShutdown()

    def saved_faults(self, gpus: Sequence[Device]) -> dict[str, GpuHealth]:
        """The faults a previous daemon saved in this boot (gpus.health.stateDirectory), as served health."""
        directory = self.health.state_directory
        if directory is None or not self.health.enabled:
            return {}
        saved = restorable(directory, read_boot_id(self.health.proc_root), {g.name: g.uuid for g in gpus if g.uuid})
        return {n: GpuHealth.of(Fault(f.action, f.cause, f.detail, 0.0)) for n, f in saved.items()}

    def xid_counts(self) -> dict[tuple[str, int, str], int]:
        """XID events per (GPU, XID, bucket) seen by the running health monitor (for the metrics)."""
        monitor = self.monitor
        return dict(monitor.xid_counts) if monitor is not None else {}

    async def watch(self, current: NodeTopology, publish: Publish) -> None:
        state = {"topology": current}

        def on_health(health: Mapping[str, GpuHealth]) -> None:
            new = state["topology"].with_health({n: h.health for n, h in health.items()},
                                                {n: h.reason for n, h in health.items()})
            if new != state["topology"]:
                state["topology"] = new
                publish(new)

        await self.watch_health(current.gpus, on_health)
