"""A fake NVML (the pynvml calls we use), driven by a `NodeTopology`: a test double at the hardware boundary.

Why under tests/ and not in the package: it is a test double, and the image
must not contain a fake NVML. The discovery and health code take the NVML
module as a parameter (or `import pynvml`, which `topo_testkit.with_fake_nvml`
points at an instance of this class), so the real discovery code runs
unchanged against it:

    fake = FakeNvml(load_simulated("dgx-a100"))
    root = fake.write_sysfs(tmpdir)              # <root>/bus/pci/devices/<bdf>/numa_node
    NvmlGpuSource(nvml=fake, sysfs_root=root).load()

What the topology becomes:

- GPU i (by `Device.index`) gets its UUID, PCI bus id, minor, model and
  memory from the Device, or deterministic made-up ones (UUID from the
  topology source and name; bus ids `0000:08:00.0`, `0000:10:00.0`...).
- `NV<n>` pairs: per-GPU NVLink tables whose remote PCI info points at the
  peer GPU (bridges, hybrid cube-mesh). When every GPU pair is `NV<n>` with
  one n (3 GPUs or more; `nvswitch=` forces either way), each GPU instead has
  n links to NVSwitches with remote type SWITCH. `switch_address` says what
  their remote PCI info holds: "pci", a bus id on this node's PCI bus with a
  sysfs entry (HGX/DGX baseboards: A100 has 6 switches, H100 4), or "unknown",
  `FFFFFFFF:FF:FF.0` and nothing in sysfs (GB200/GB300 NVL72 trays on driver
  580: the switches sit in other trays); the default is "unknown" for GPUs
  that carry fabric info (NVL72), else "pci".
  `cpu_nvlinks=k` adds k links per GPU to an IBM NPU (POWER9).
- `nvmlDeviceGetTopologyCommonAncestor` answers the pair's PCIe level.
- Constants and `NVMLError` come from the real pynvml (importing it does not
  load the library), so error classes and codes are the real ones.

MIG: a GPU with `mig_mode: enabled` (a simulated node's `mig:` list) is in
MIG mode, and its MIG devices (the topology's `DeviceKind.MIG` devices)
answer the MIG calls of `plugin.sources.nvml_mig`: slots, UUIDs, GPU and
compute instances with NVIDIA's A100 GPU-instance profile IDs (which differ
from the profile indexes, as on real hardware), memory sizes, and
`write_proc(root)`/`write_dev(root)` write the capability files
(`driver/nvidia/capabilities/.../access`, `driver/nvidia-caps/mig-minors`,
`devices`) and device nodes (`nvidia-caps/nvidia-cap<N>`) discovery reads.

NVLink fabric (GB200/GB300): a GPU whose Device carries `fabric` (`FabricInfo`)
answers `nvmlDeviceGetGpuFabricInfoV` / `nvmlDeviceGetGpuFabricInfo` by filling
pynvml's own structure (cluster UUID bytes, status, clique ID, state); a GPU
without one answers NOT_SUPPORTED, as NVML does on GPUs with no fabric.
`set_fabric(gpu, fabric)` changes the answer (the fabric manager finishing, a
GPU moved to another partition). For a daemon in another process, `fabric_file`
(set by `with_fake_nvml` from `TOPO_TESTKIT_FABRIC_FILE`) names a JSON file read
at every fabric call, standing in for the fabric manager: `{"GPU0": {"state":
"completed", "clusterUuid": "...", "cliqueId": 7}, "GPU1": null}` (null: no
fabric, NOT_SUPPORTED); a GPU it does not name keeps its own answer. A state
other than completed reports a zero cluster UUID and clique 0, as NVML does
before the fabric manager has registered the GPU. Drivers before the calls existed:
`missing_functions={"nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"}`.

NVSwitch boards: `nvmlDeviceGetModuleId` answers a GPU's `module_id` attribute (a simulated node's
`moduleId`), NOT_SUPPORTED without one; `missing_functions={"nvmlDeviceGetModuleId"}` is a driver
without the call.

Failure and event injection for tests: `init_error`, `lose(gpu)` /
`restore(gpu)`, `down_links`, `remote_device_type` ("ok"; "function-not-found":
the driver lacks the call; "absent": the bindings lack it; "unknown": the driver
answers NVML_NVLINK_DEVICE_TYPE_UNKNOWN), `common_ancestor=False`, `inject_xid`, `inject_double_bit_ecc`,
`fail_event_wait`. Every call is counted in `calls`.

GPU health evidence (plugin/health/): the recovery-action field
(`nvmlDeviceGetFieldValues` with field 230; `recovery_field=False` answers it
NOT_SUPPORTED, as drivers before it do), remapped rows, retired pages pending and
volatile ECC counts per GPU, set with `set_health_facts(gpu, ...)`;
`reset_gpu(gpu)` does what a GPU reset does to them (pending repairs applied,
volatile counts and the recovery action back to zero, a lost GPU back);
`set_link(gpu, link, up)` takes one NVLink down or up; `write_boot_id(proc_root,
id)` writes the kernel's boot ID file. `inject_xid(gpu, xid, recovery_action=n)`
sets the field before the event, as a driver announces the action it needs.

Older drivers: `missing_functions={...}` names NVML functions this driver's
library lacks; calling one raises what pynvml raises when the C symbol is not
there, `NVMLError_FunctionNotFound` (code FUNCTION_NOT_FOUND). Names are the C
functions'; for the calls with a version argument that is what picks the C
function (`nvmlDeviceGetGpuInstanceProfileInfo(h, i)` calls
`nvmlDeviceGetGpuInstanceProfileInfoV`, `version=1` the unversioned one), and
`R470_MISSING` is what the R450/R470 drivers lack of what we call. A name the
fake does not know is refused, so a misspelt name cannot make a test vacuous.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import uuid as uuidlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pynvml

from allocator.topology import Device, DeviceKind, FabricInfo, LinkLevel, NodeTopology

from plugin.sources.mig_profiles import COMPUTE_SLICES, table_for
from plugin.sources.nvml_mig import CI_PROFILES, GI_PROFILES, cap_minors
from plugin.sources.pcie import normalize_bdf

__all__ = ["R470_MISSING", "FakeEventData", "FakeNvml", "FakePciInfo", "nvml_bus_id"]

_UUID_NS = uuidlib.UUID("3d1f0c64-8b7e-4a52-9e0d-2f6a71c4b8e3")
_LEVEL_TO_NVML = {
    LinkLevel.PIX: pynvml.NVML_TOPOLOGY_SINGLE,
    LinkLevel.PXB: pynvml.NVML_TOPOLOGY_MULTIPLE,
    LinkLevel.PHB: pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
    LinkLevel.NODE: pynvml.NVML_TOPOLOGY_NODE,
    LinkLevel.SYS: pynvml.NVML_TOPOLOGY_SYSTEM,
}
#: Links a GPU has in hardware when the topology does not need more (A100: 12, H100: 18).
_HW_LINKS = 18
#: pynvml calls that pick their C function by `version=` (2: the `...V` function, 1: the unversioned one).
_VERSIONED = ("nvmlDeviceGetGpuInstanceProfileInfo", "nvmlGpuInstanceGetComputeInstanceProfileInfo")
#: What the R450/R470 drivers' NVML lacks of the calls discovery makes (the versioned calls came with R510).
R470_MISSING = frozenset(name + "V" for name in _VERSIONED)
#: pynvml names whose calls the fake counts under another name.
_ALIASES = {"nvmlDeviceGetPciInfo_v3": "nvmlDeviceGetPciInfo", "nvmlEventSetWait_v2": "nvmlEventSetWait",
            "nvmlDeviceGetNvLinkRemotePciInfo_v2": "nvmlDeviceGetNvLinkRemotePciInfo",
            "nvmlInitWithFlags": "nvmlInit"}


def nvml_bus_id(bdf: str) -> str:
    """Kernel form `0000:3b:00.0` -> NVML form `00000000:3B:00.0`."""
    k = normalize_bdf(bdf)
    domain, rest = k.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


@dataclass
class FakePciInfo:
    busId: str
    busIdLegacy: str
    domain: int
    bus: int
    device: int
    pciDeviceId: int = 0x20B010DE
    pciSubSystemId: int = 0


@dataclass
class FakeMemory:
    total: int
    free: int
    used: int = 0


@dataclass
class FakeEventData:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class FakeValue:
    """pynvml's c_nvmlValue_t, as far as the health code reads it."""

    uiVal: int = 0


@dataclass
class FakeFieldValue:
    fieldId: int
    nvmlReturn: int
    value: FakeValue


@dataclass
class _HealthFacts:
    recovery_action: int = 0
    remap_pending: bool = False
    remap_failed: bool = False
    retired_pending: bool = False
    volatile_dbe: int = 0
    aggregate_dbe: int = 0


@dataclass(eq=False)
class FakeHandle:
    index: int

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.index}>"


#: NVIDIA's GPU-instance profile IDs on an A100 (`nvidia-smi mig -lgip`), by profile index; other
#: indexes a node uses get 100 + index. Real IDs differ from the indexes, so discovery must match IDs.
_GI_PROFILE_IDS = {0: 19, 1: 14, 2: 9, 3: 5, 4: 0, 7: 20, 9: 15}
#: Slots of a GPU in MIG mode (nvmlDeviceGetMaxMigDeviceCount on A100/H100).
_MIG_SLOTS = 7
#: The nvidia-caps character major `write_proc` reports.
CAPS_MAJOR = 237


@dataclass
class FakeMig:
    """One MIG device of the fake: where it sits (slot, GPU/compute instance) and what it is."""

    device: Device
    gpu: int  # position of the parent in FakeNvml.gpus
    slot: int
    gi: int
    ci: int
    gi_profile: int  # profile indexes (NVML_GPU_INSTANCE_PROFILE_*, NVML_COMPUTE_INSTANCE_PROFILE_*)
    ci_profile: int
    memory_mib: int
    caps: tuple[int, int]  # capability minors of the GPU instance and the compute instance


@dataclass(eq=False)
class FakeMigHandle:
    mig: FakeMig

    def __repr__(self) -> str:
        return f"<fake MIG device {self.mig.gpu}:{self.mig.slot}>"


@dataclass(eq=False)
class FakeInstance:
    """A GPU instance (ci None) or a compute instance of one fake GPU."""

    gpu: int
    gi: int
    ci: int | None = None


@dataclass
class FakePlacement:
    start: int
    size: int


@dataclass
class FakeInstanceInfo:
    id: int
    profileId: int
    placement: FakePlacement = field(default_factory=lambda: FakePlacement(0, 0))


@dataclass
class _FakeGi:
    """A GPU instance made through `nvmlDeviceCreateGpuInstanceWithPlacement` (dynamic MIG)."""

    gi_profile: int
    start: int
    size: int
    ci: int | None = None  # its compute instance, once made
    slot: int | None = None  # the MIG device slot of that compute instance


@dataclass
class FakeProfileInfo:
    id: int
    sliceCount: int
    memorySizeMB: int = 0


@dataclass
class FakeAttributes:
    memorySizeMB: int
    gpuInstanceSliceCount: int
    computeInstanceSliceCount: int


def profile_indexes(profile: str) -> tuple[int, int]:
    """(GPU-instance, compute-instance) profile indexes of a profile name (`1c.3g.40gb`, `1g.10gb+me`)."""
    head, sign, attrs = profile.partition("+") if "+" in profile else profile.partition("-")
    parts = head.split(".")
    c = int(parts[0][:-1]) if len(parts) == 3 else None
    g = int(parts[-2][:-1])
    suffix = sign + attrs if sign else ""
    gi = next(i for i, (slices, a) in sorted(GI_PROFILES.items()) if slices == g and a == suffix)
    ci = next(i for i, slices in sorted(CI_PROFILES.items()) if slices == (c or g))
    return gi, ci


@dataclass
class _FakeGpu:
    device: Device
    handle: FakeHandle
    uuid: str
    bdf: str  # kernel form
    minor: int
    model: str
    memory_mib: int
    #: link index -> (remote kernel bdf, remote type)
    links: dict[int, tuple[str, int]] = field(default_factory=dict)
    hw_links: int = _HW_LINKS
    down: set[int] = field(default_factory=set)
    lost: bool = False
    mig_mode: bool = False
    #: slot -> MIG device
    migs: dict[int, FakeMig] = field(default_factory=dict)
    #: GPU instance ID -> GPU instance made at run time (dynamic MIG)
    gis: dict[int, _FakeGi] = field(default_factory=dict)
    fabric: FabricInfo | None = None
    #: nvmlComputeMode_t (0: DEFAULT, 3: EXCLUSIVE_PROCESS ...); tests set it, as an operator with nvidia-smi -c.
    compute_mode: int = 0


@dataclass(eq=False)
class _EventSet:
    events: queue.Queue = field(default_factory=queue.Queue)
    #: GPU index -> registered event mask
    registered: dict[int, int] = field(default_factory=dict)
    freed: bool = False


#: What driver 580 reports as the remote PCI address of a GB200 NVL72 tray's NVLinks (the switch is in another tray).
_UNKNOWN_BUS_ID = "FFFFFFFF:FF:FF.0"


def _remote_pci(bus_id: str) -> FakePciInfo:
    """The remote end's PCI info; an unknown address is all ones, as NVML fills it."""
    if bus_id == _UNKNOWN_BUS_ID:
        return FakePciInfo(busId=bus_id, busIdLegacy="FFFF:FF:FF.0", domain=0xFFFFFFFF, bus=0xFF, device=0xFF,
                           pciDeviceId=0xFFFFFFFF)
    return _pci(bus_id)


def _pci(bdf: str) -> FakePciInfo:
    k = normalize_bdf(bdf)
    domain, bus, devfn = k.split(":")
    dev = devfn.split(".")[0]
    return FakePciInfo(busId=nvml_bus_id(k), busIdLegacy=f"{int(domain, 16) & 0xFFFF:04X}:{bus.upper()}:{devfn.upper()}",
                       domain=int(domain, 16), bus=int(bus, 16), device=int(dev, 16))


def _generated_bdf(i: int) -> str:
    return f"{i // 31:04x}:{(i % 31 + 1) * 8:02x}:00.0"


class FakeNvml:
    """Stands in for the `pynvml` module; see the module docstring."""

    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        topology: NodeTopology,
        *,
        nvswitch: bool | None = None,
        switch_count: int = 6,
        cpu_nvlinks: int = 0,
        down_links: Mapping[str, int] | None = None,
        remote_device_type: str = "ok",
        switch_address: str | None = None,
        common_ancestor: bool = True,
        init_error: int | None = None,
        supported_events: int | None = None,
        register_error: Mapping[str, int] | None = None,
        missing_functions: Iterable[str] = (),
        recovery_field: bool = True,
    ):
        if remote_device_type not in ("ok", "function-not-found", "absent", "unknown"):
            raise ValueError("remote_device_type is one of ok, function-not-found, absent, unknown")
        if switch_address not in (None, "pci", "unknown"):
            raise ValueError("switch_address is one of pci, unknown (or None: unknown for fabric GPUs)")
        self.topology = topology
        self.init_error = init_error
        self.common_ancestor = common_ancestor
        self.remote_device_type = remote_device_type
        self.supported_events = (supported_events if supported_events is not None
                                 else pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
                                 | pynvml.nvmlEventTypeSingleBitEccError | pynvml.nvmlEventTypePState)
        self.register_error = dict(register_error or {})
        #: The driver has NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (see set_health_facts).
        self.recovery_field = recovery_field
        #: GPU index -> health facts (recovery action, remapped rows, retired pages, volatile ECC counts).
        self.health_facts: dict[int, _HealthFacts] = {}
        known = {n for n in dir(type(self)) if n.startswith("nvml")} | R470_MISSING
        unknown = sorted(set(missing_functions) - known)
        if unknown:
            raise ValueError(f"FakeNvml does not implement {', '.join(unknown)}; it cannot lack it")
        #: NVML functions this driver lacks (see the module docstring).
        self.missing_functions = frozenset(_ALIASES.get(n, n) for n in missing_functions)
        self.calls: Counter[str] = Counter()
        self.wait_times: list[float] = []
        self.init_count = 0
        self._lock = threading.Lock()
        self._sets: list[_EventSet] = []
        self._wait_failure: tuple[int, int | None] | None = None  # (code, remaining or None=forever)
        #: NVML function -> error code of its next call (`fail_next`).
        self._fail_next: dict[str, int] = {}
        self._registered_cv = threading.Condition(self._lock)
        if remote_device_type == "absent":
            # Old bindings: the attribute does not exist (discovery uses getattr(..., None)).
            self.nvmlDeviceGetNvLinkRemoteDeviceType = None  # type: ignore[assignment]

        gpus = sorted(topology.gpus, key=lambda d: d.index)
        self.gpus: list[_FakeGpu] = []
        for pos, d in enumerate(gpus):
            bdf = normalize_bdf(d.pci_bus_id) if d.pci_bus_id else _generated_bdf(pos)
            self.gpus.append(_FakeGpu(
                device=d, handle=FakeHandle(pos),
                uuid=d.uuid or "GPU-" + str(uuidlib.uuid5(_UUID_NS, f"{topology.source}/{d.name}")),
                bdf=bdf, minor=d.minor if d.minor is not None else pos,
                model=d.model or "NVIDIA Fake GPU", memory_mib=d.memory_mib or 81920, fabric=d.fabric,
            ))
        self.by_name = {g.device.name: g for g in self.gpus}
        self._wire_migs(topology)
        self._by_uuid = {g.uuid: g for g in self.gpus}
        used_domains = {int(g.bdf.split(":")[0], 16) for g in self.gpus}
        free_domain = max(used_domains, default=0) + 1
        #: Switch bus ids with a sysfs entry ("pci"); empty where the addresses are unknown.
        self.switch_bdfs: list[str] = []
        self.npu_bdfs: list[str] = []
        if switch_address is None:
            switch_address = "unknown" if any(g.fabric is not None for g in self.gpus) else "pci"
        self.switch_address = switch_address
        self._wire_nvlinks(nvswitch, switch_count, free_domain)
        if cpu_nvlinks:
            self._wire_npu(cpu_nvlinks, free_domain + 1)
        for name, k in (down_links or {}).items():
            g = self.by_name[name]
            g.down = set(sorted(g.links)[:k])

    # -- building ------------------------------------------------------------
    def _nv(self, a: _FakeGpu, b: _FakeGpu) -> int:
        return self.topology.link(a.device.name, b.device.name).nvlinks

    def _wire_nvlinks(self, nvswitch: bool | None, switch_count: int, domain: int) -> None:
        gpus = self.gpus
        pairs = [(a, b, self._nv(a, b)) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
        counts = {n for _, _, n in pairs}
        clique = len(gpus) >= 2 and len(counts) == 1 and next(iter(counts)) > 0
        use_switch = nvswitch if nvswitch is not None else (clique and len(gpus) >= 3)
        if use_switch and not clique:
            raise ValueError("nvswitch=True needs every GPU pair to be NV<n> with one n")
        max_links = int(pynvml.NVML_NVLINK_MAX_LINKS)
        if use_switch:
            n = next(iter(counts))
            if self.switch_address == "pci":
                self.switch_bdfs = [f"{domain:04x}:{0x10 + s:02x}:00.0" for s in range(switch_count)]
                ends = self.switch_bdfs
            else:
                ends = [_UNKNOWN_BUS_ID]
            for g in gpus:
                if n > max_links:
                    raise ValueError(f"NV{n} needs more than NVML_NVLINK_MAX_LINKS={max_links} links")
                for link in range(n):
                    g.links[link] = (ends[link % len(ends)], pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
                g.hw_links = max(_HW_LINKS, n)
            return
        for a, b, n in pairs:
            for _ in range(n):
                for src, dst in ((a, b), (b, a)):
                    link = len(src.links)
                    if link >= max_links:
                        raise ValueError(f"{src.device.name} needs more than NVML_NVLINK_MAX_LINKS={max_links} "
                                         "direct NVLinks; use nvswitch=True")
                    src.links[link] = (dst.bdf, pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)
        for g in gpus:
            g.hw_links = min(max_links, max(_HW_LINKS, len(g.links)))

    def _wire_npu(self, k: int, domain: int) -> None:
        for i, g in enumerate(self.gpus):
            npu = f"{domain:04x}:00:{i:02x}.0"
            self.npu_bdfs.append(npu)
            for _ in range(k):
                g.links[len(g.links)] = (npu, pynvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU)
            g.hw_links = min(int(pynvml.NVML_NVLINK_MAX_LINKS), max(g.hw_links, len(g.links)))

    def _wire_migs(self, topology: NodeTopology) -> None:
        pos = {g.device.name: p for p, g in enumerate(self.gpus)}
        for g in self.gpus:
            g.mig_mode = g.device.attributes.get("mig_mode") == "enabled"
        for d in topology.of_kind(DeviceKind.MIG):
            p = pos[d.parent or ""]
            g = self.gpus[p]
            gi, ci = int(d.attributes.get("gi", d.index)), int(d.attributes.get("ci", 0))
            caps = [int(c.rsplit("nvidia-cap", 1)[1]) for c in d.attributes.get("caps", "").split(",") if c]
            gi_profile, ci_profile = profile_indexes(d.attributes["profile"])
            g.migs[d.index] = FakeMig(
                device=d, gpu=p, slot=d.index, gi=gi, ci=ci, gi_profile=gi_profile, ci_profile=ci_profile,
                memory_mib=d.memory_mib or 0,
                caps=(caps[0], caps[1]) if len(caps) == 2 else cap_minors(g.minor, gi, ci))

    def write_proc(self, root: str, access_files: bool = True, mig_minors: bool = True) -> str:
        """Write what the NVIDIA driver shows in procfs about MIG capabilities, under `root`.

        `access_files`: `driver/nvidia/capabilities/gpu<minor>/mig/gi<gi>[/ci<ci>]/access`;
        `mig_minors`: the `driver/nvidia-caps/mig-minors` table; always `devices` with the
        nvidia-caps major. Returns `root`.
        """
        table = ["config 1", "monitor 2"]
        for g in self.gpus:
            for m in g.migs.values():
                base = os.path.join(root, "driver", "nvidia", "capabilities", f"gpu{g.minor}", "mig", f"gi{m.gi}")
                for rel, minor in (("", m.caps[0]), (f"ci{m.ci}", m.caps[1])):
                    if access_files:
                        _write(os.path.join(base, rel, "access"),
                               f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
                table += [f"gpu{g.minor}/gi{m.gi}/access {m.caps[0]}", f"gpu{g.minor}/gi{m.gi}/ci{m.ci}/access {m.caps[1]}"]
        if mig_minors:
            _write(os.path.join(root, "driver", "nvidia-caps", "mig-minors"), "\n".join(dict.fromkeys(table)) + "\n")
        _write(os.path.join(root, "devices"), f"Character devices:\n  1 mem\n195 nvidia\n{CAPS_MAJOR} nvidia-caps\n"
                                              "\nBlock devices:\n  8 sd\n")
        return root

    def write_dev(self, root: str) -> str:
        """Plain files standing in for the GPUs' device nodes under a dev root (nvidia<minor>, the control
        nodes, nvidia-caps/nvidia-cap<N>). Returns `root`."""
        for g in self.gpus:
            _write(os.path.join(root, f"nvidia{g.minor}"), "")
            for m in g.migs.values():
                for minor in m.caps:
                    _write(os.path.join(root, "nvidia-caps", f"nvidia-cap{minor}"), "")
        for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
            _write(os.path.join(root, name), "")
        return root

    def write_sysfs(
        self,
        root: str,
        numa: Mapping[str, int | None] | None = None,
        missing: Iterable[str] = (),
        raw: Mapping[str, str] | None = None,
    ) -> str:
        """Write `<root>/bus/pci/devices/<bdf>/numa_node` for every GPU (and vendor/class files).

        `numa` overrides a GPU's node (None -> -1); GPUs named in `missing` get
        no numa_node file; `raw` writes a GPU's file verbatim. Switches and NPUs
        get vendor files (10de NVSwitch, 1014 IBM NPU). Returns `root`.
        """
        numa = dict(numa or {})
        raw = dict(raw or {})
        gone = set(missing)
        for g in self.gpus:
            d = os.path.join(root, "bus", "pci", "devices", g.bdf)
            os.makedirs(d, exist_ok=True)
            _write(os.path.join(d, "vendor"), "0x10de\n")
            _write(os.path.join(d, "class"), "0x030200\n")
            name = g.device.name
            path = os.path.join(d, "numa_node")
            if name in gone:
                if os.path.exists(path):
                    os.remove(path)
                continue
            if name in raw:
                _write(path, raw[name])
                continue
            node = numa[name] if name in numa else g.device.numa
            _write(path, f"{-1 if node is None else node}\n")
        for bdf, vendor, cls in ([(b, "0x10de", "0x068000") for b in self.switch_bdfs]
                                 + [(b, "0x1014", "0x068000") for b in self.npu_bdfs]):
            d = os.path.join(root, "bus", "pci", "devices", bdf)
            os.makedirs(d, exist_ok=True)
            _write(os.path.join(d, "vendor"), vendor + "\n")
            _write(os.path.join(d, "class"), cls + "\n")
        return root

    # -- fault and event injection ------------------------------------------------
    def _gpu(self, gpu: str | int) -> _FakeGpu:
        return self.gpus[gpu] if isinstance(gpu, int) else self.by_name[gpu]

    def lose(self, gpu: str | int) -> None:
        """The GPU falls off the bus: every call about it fails with GPU_IS_LOST."""
        self._gpu(gpu).lost = True

    def restore(self, gpu: str | int) -> None:
        self._gpu(gpu).lost = False

    def set_fabric(self, gpu: str | int, fabric: FabricInfo | None) -> None:
        """What the fabric calls answer for this GPU from now on (None: NOT_SUPPORTED)."""
        self._gpu(gpu).fabric = fabric

    def inject_event(self, gpu: str | int | None, event_type: int, data: int = 0) -> int:
        """Deliver an event to every event set the GPU is registered in for that type; returns how many.

        `gpu=None` delivers an event whose device NVML cannot name.
        """
        g = self._gpu(gpu) if gpu is not None else None
        delivered = 0
        with self._lock:
            for es in self._sets:
                if es.freed:
                    continue
                if g is None:
                    if es.registered:
                        es.events.put(FakeEventData(device=None, eventType=event_type, eventData=data))
                        delivered += 1
                    continue
                if es.registered.get(g.handle.index, 0) & event_type:
                    es.events.put(FakeEventData(device=g.handle, eventType=event_type, eventData=data))
                    delivered += 1
        return delivered

    def inject_xid(self, gpu: str | int | None, xid: int, recovery_action: int | None = None) -> int:
        if recovery_action is not None and gpu is not None:
            self.set_health_facts(gpu, recovery_action=recovery_action)
        return self.inject_event(gpu, pynvml.nvmlEventTypeXidCriticalError, xid)

    def inject_double_bit_ecc(self, gpu: str | int) -> int:
        return self.inject_event(gpu, pynvml.nvmlEventTypeDoubleBitEccError, 0)

    def fail_event_wait(self, code: int | None = pynvml.NVML_ERROR_UNKNOWN, times: int | None = None) -> None:
        """Make `nvmlEventSetWait` fail at once with `code` (`times` calls, None: until cleared; code None clears)."""
        with self._lock:
            self._wait_failure = None if code is None else (code, times)

    def registered(self, gpu: str | int) -> bool:
        g = self._gpu(gpu)
        with self._lock:
            return any(not es.freed and g.handle.index in es.registered for es in self._sets)

    def wait_registered(self, gpus: Iterable[str | int] | None = None, timeout: float = 5.0) -> bool:
        """Block until the GPUs (default: all) are registered in a live event set."""
        want = [self._gpu(g) for g in (gpus if gpus is not None else range(len(self.gpus)))]
        deadline = time.monotonic() + timeout
        with self._registered_cv:
            while True:
                live = [es for es in self._sets if not es.freed]
                if all(any(g.handle.index in es.registered for es in live) for g in want):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._registered_cv.wait(left)

    @property
    def live_event_sets(self) -> int:
        with self._lock:
            return sum(1 for es in self._sets if not es.freed)

    # -- helpers -----------------------------------------------------------------
    def _count(self, name: str) -> None:
        """Count a call of the NVML function `name`; raise as pynvml does when the driver lacks it."""
        with self._lock:
            self.calls[name] += 1
        if name in self.missing_functions:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def _versioned(self, name: str, version: int) -> None:
        """Count the C function pynvml's `name(..., version=)` calls (and raise as pynvml does)."""
        if version not in (1, 2):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        self._count(name + "V" if version == 2 else name)

    def _check_init(self) -> None:
        if self.init_count <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _h(self, handle: Any) -> _FakeGpu:
        self._check_init()
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g = self.gpus[handle.index]
        if g.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return g

    def __getattr__(self, name: str) -> Any:
        # Constants, error classes and ctypes structures only; an NVML function we do not fake must not reach the real library.
        if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "NVML_NVLINK", "NVML_TOPOLOGY", "c_nvml")):
            return getattr(pynvml, name)
        raise AttributeError(f"FakeNvml does not implement {name}")

    # -- the pynvml API ------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        with self._lock:
            self.init_count += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")
        with self._lock:
            if self.init_count <= 0:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
            self.init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._count("nvmlSystemGetDriverVersion")
        self._check_init()
        return "999.99.99-fake"

    def nvmlDeviceGetCount(self) -> int:
        self._count("nvmlDeviceGetCount")
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._count("nvmlDeviceGetHandleByIndex")
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g = self.gpus[index]
        if g.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return g.handle

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeHandle:
        self._count("nvmlDeviceGetHandleByUUID")
        self._check_init()
        u = uuid.decode() if isinstance(uuid, bytes) else uuid
        g = self._by_uuid.get(u)
        if g is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        if g.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return g.handle

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._count("nvmlDeviceGetUUID")
        if handle is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if isinstance(handle, FakeMigHandle):
            return self._mig(handle).device.uuid or ""
        return self._h(handle).uuid

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        self._count("nvmlDeviceGetComputeMode")
        return self._h(handle).compute_mode

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._count("nvmlDeviceGetIndex")
        return self._h(handle).handle.index

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._count("nvmlDeviceGetName")
        return self._h(handle).model

    def nvmlDeviceGetModuleId(self, handle: Any) -> int:
        """The GPU's module ID on its baseboard, from the topology's `module_id` attribute (a simulated
        node's `moduleId`); NOT_SUPPORTED without one, as on GPUs that are not on an NVSwitch board."""
        self._count("nvmlDeviceGetModuleId")
        value = self._h(handle).device.attributes.get("module_id", "")
        if not value.isdigit():
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(value)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        self._count("nvmlDeviceGetMinorNumber")
        return self._h(handle).minor

    def nvmlDeviceGetPciInfo(self, handle: Any) -> FakePciInfo:
        self._count("nvmlDeviceGetPciInfo")
        return _pci(self._h(handle).bdf)

    nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> FakeMemory:
        self._count("nvmlDeviceGetMemoryInfo")
        total = self._h(handle).memory_mib * 1024 * 1024
        return FakeMemory(total=total, free=total)

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        self._count("nvmlDeviceGetNvLinkState")
        g = self._h(handle)
        if not g.links and not g.down:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < g.hw_links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if link in g.links and link not in g.down else pynvml.NVML_FEATURE_DISABLED

    def _active(self, handle: Any, link: int) -> tuple[str, int]:
        g = self._h(handle)
        if not 0 <= link < g.hw_links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if link not in g.links or link in g.down:
            # An inactive link has no remote end: NOT_SUPPORTED (go-gpuallocator skips on it, as on INVALID_ARGUMENT).
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g.links[link]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> FakePciInfo:
        self._count("nvmlDeviceGetNvLinkRemotePciInfo")
        return _remote_pci(self._active(handle, link)[0])

    nvmlDeviceGetNvLinkRemotePciInfo_v2 = nvmlDeviceGetNvLinkRemotePciInfo

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        self._count("nvmlDeviceGetNvLinkRemoteDeviceType")
        if self.remote_device_type == "function-not-found":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        remote = self._active(handle, link)[1]
        if self.remote_device_type == "unknown":
            return pynvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN
        return remote

    # pynvml's structures for the fabric calls (the caller allocates one and passes it by reference).
    c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t
    c_nvmlGpuFabricInfoV_t = pynvml.c_nvmlGpuFabricInfoV_t
    #: A JSON file standing in for the fabric manager (see the module docstring); None: `Device.fabric` only.
    fabric_file: str | None = None

    def _fabric_of(self, g: _FakeGpu) -> FabricInfo | None:
        if self.fabric_file is None or not os.path.exists(self.fabric_file):
            return g.fabric
        with open(self.fabric_file, encoding="utf-8") as f:
            table = json.load(f)
        if g.device.name not in table:
            return g.fabric
        entry = table[g.device.name]
        if entry is None:
            return None
        return FabricInfo(cluster_uuid=entry.get("clusterUuid", str(uuidlib.UUID(int=0))),
                          clique_id=int(entry.get("cliqueId", 0)), state=entry.get("state", "completed"))

    def _fill_fabric(self, name: str, handle: Any, out: Any) -> int:
        self._count(name)
        g = self._h(handle)
        fabric = self._fabric_of(g)
        if fabric is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = getattr(out, "_obj", out)  # ctypes.byref(struct) -> the struct
        states = {"not-supported": pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
                  "not-started": pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
                  "in-progress": pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
                  "completed": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED}
        done = fabric.state == "completed"
        raw = uuidlib.UUID(fabric.cluster_uuid).bytes if done else bytes(16)
        for i, byte in enumerate(raw):
            info.clusterUuid[i] = byte
        info.status = pynvml.NVML_SUCCESS
        info.cliqueId = fabric.clique_id if done else 0
        info.state = states[fabric.state]
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, out: Any) -> int:
        return self._fill_fabric("nvmlDeviceGetGpuFabricInfoV", handle, out)

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, out: Any) -> int:
        return self._fill_fabric("nvmlDeviceGetGpuFabricInfo", handle, out)

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any) -> int:
        self._count("nvmlDeviceGetTopologyCommonAncestor")
        ga, gb = self._h(a), self._h(b)
        if not self.common_ancestor:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if ga is gb:
            return pynvml.NVML_TOPOLOGY_INTERNAL
        return _LEVEL_TO_NVML[self.topology.link(ga.device.name, gb.device.name).level]

    # MIG
    def _mig(self, handle: Any) -> FakeMig:
        self._check_init()
        if not isinstance(handle, FakeMigHandle):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[handle.mig.gpu].lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return handle.mig

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        self._count("nvmlDeviceGetMigMode")
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if self._h(handle).mig_mode else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        self._count("nvmlDeviceGetMaxMigDeviceCount")
        g = self._h(handle)
        return max([_MIG_SLOTS, *(s + 1 for s in g.migs)]) if g.mig_mode else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> FakeMigHandle:
        self._count("nvmlDeviceGetMigDeviceHandleByIndex")
        g = self._h(handle)
        if not g.mig_mode:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if index not in g.migs:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return FakeMigHandle(g.migs[index])

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> bool:
        return isinstance(handle, FakeMigHandle)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any) -> FakeHandle:
        return self.gpus[self._mig(handle).gpu].handle

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        self._count("nvmlDeviceGetGpuInstanceId")
        return self._mig(handle).gi

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        self._count("nvmlDeviceGetComputeInstanceId")
        return self._mig(handle).ci

    def nvmlDeviceGetAttributes(self, handle: Any) -> FakeAttributes:
        self._count("nvmlDeviceGetAttributes")
        m = self._mig(handle)
        return FakeAttributes(m.memory_mib, GI_PROFILES[m.gi_profile][0], CI_PROFILES[m.ci_profile])

    nvmlDeviceGetAttributes_v2 = nvmlDeviceGetAttributes

    def _instance_mig(self, inst: FakeInstance) -> FakeMig:
        for m in self.gpus[inst.gpu].migs.values():
            if m.gi == inst.gi and (inst.ci is None or m.ci == inst.ci):
                return m
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi: int) -> FakeInstance:
        self._count("nvmlDeviceGetGpuInstanceById")
        g = self._h(handle)
        inst = FakeInstance(g.handle.index, gi)
        if gi not in g.gis:
            self._instance_mig(inst)
        return inst

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: FakeInstance, ci: int) -> FakeInstance:
        self._count("nvmlGpuInstanceGetComputeInstanceById")
        inst = FakeInstance(gi.gpu, gi.gi, ci)
        made = self.gpus[gi.gpu].gis.get(gi.gi)
        if made is not None:
            if made.ci != ci:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
            return inst
        self._instance_mig(inst)
        return inst

    def nvmlGpuInstanceGetInfo(self, gi: FakeInstance) -> FakeInstanceInfo:
        self._count("nvmlGpuInstanceGetInfo")
        made = self.gpus[gi.gpu].gis.get(gi.gi)
        if made is not None:
            return FakeInstanceInfo(gi.gi, _GI_PROFILE_IDS[made.gi_profile], FakePlacement(made.start, made.size))
        m = self._instance_mig(gi)
        return FakeInstanceInfo(gi.gi, _GI_PROFILE_IDS.get(m.gi_profile, 100 + m.gi_profile))

    def nvmlComputeInstanceGetInfo(self, ci: FakeInstance) -> FakeInstanceInfo:
        self._count("nvmlComputeInstanceGetInfo")
        m = self._instance_mig(ci)
        return FakeInstanceInfo(ci.ci or 0, m.ci_profile)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> FakeProfileInfo:
        self._versioned("nvmlDeviceGetGpuInstanceProfileInfo", version)
        g = self._h(handle)
        used = {m.gi_profile for m in g.migs.values()}
        if profile not in _GI_PROFILE_IDS and profile not in used:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED if profile < len(GI_PROFILES)
                                   else pynvml.NVML_ERROR_INVALID_ARGUMENT)
        slices = GI_PROFILES[profile][0]
        return FakeProfileInfo(_GI_PROFILE_IDS.get(profile, 100 + profile), slices, g.memory_mib * slices // 8)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: FakeInstance, profile: int, eng: int,
                                                     version: int = 2) -> FakeProfileInfo:
        self._versioned("nvmlGpuInstanceGetComputeInstanceProfileInfo", version)
        made = self.gpus[gi.gpu].gis.get(gi.gi)
        gi_profile = made.gi_profile if made is not None else self._instance_mig(gi).gi_profile
        if profile not in CI_PROFILES or eng != 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if CI_PROFILES[profile] > GI_PROFILES[gi_profile][0]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return FakeProfileInfo(profile, CI_PROFILES[profile])

    # dynamic MIG: instances made and destroyed at run time, checked against plugin.sources.mig_profiles
    def fail_next(self, name: str, code: int = pynvml.NVML_ERROR_UNKNOWN) -> None:
        """The next call of NVML function `name` fails with `code` (a driver refusing a MIG change)."""
        self._fail_next[name] = code

    def _mig_call(self, name: str) -> None:
        self._count(name)
        self._check_init()
        code = self._fail_next.pop(name, None)
        if code is not None:
            raise pynvml.NVMLError(code)

    def _table_profile(self, g: _FakeGpu, profile_id: int) -> Any:
        table = table_for(g.model, g.memory_mib)
        index = next((i for i, pid in _GI_PROFILE_IDS.items() if pid == profile_id), None)
        profile = table.by_gi_profile(index) if table is not None and index is not None else None
        if profile is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return profile

    @staticmethod
    def _deref(ref: Any) -> Any:
        return getattr(ref, "_obj", ref)  # ctypes.byref(x) -> x

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, handle: Any, profile_id: int, placements: Any,
                                                   count: Any) -> int:
        self._mig_call("nvmlDeviceGetGpuInstancePossiblePlacements")
        g = self._h(handle)
        if not g.mig_mode:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._table_profile(g, profile_id)
        n = self._deref(count)
        if n.value < len(profile.starts):
            n.value = len(profile.starts)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, start in enumerate(profile.starts):
            placements[i].start, placements[i].size = start, profile.memory_slices
        n.value = len(profile.starts)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: int, placement: Any) -> FakeInstance:
        self._mig_call("nvmlDeviceCreateGpuInstanceWithPlacement")
        g = self._h(handle)
        if not g.mig_mode:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._table_profile(g, profile_id)
        where = self._deref(placement)
        if where.start not in profile.starts or where.size != profile.memory_slices:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        table = table_for(g.model, g.memory_mib)
        assert table is not None
        want = set(range(where.start, where.start + where.size))
        compute = profile.compute_slices
        for other in g.gis.values():
            if want & set(range(other.start, other.start + other.size)):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            compute += table.by_gi_profile(other.gi_profile).compute_slices  # type: ignore[union-attr]
        if compute > COMPUTE_SLICES or g.migs and any(m.slot not in {x.slot for x in g.gis.values()}
                                                      for m in g.migs.values()):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi = min(set(range(1, 15)) - set(g.gis))
        g.gis[gi] = _FakeGi(profile.gi_profile, where.start, where.size)
        return FakeInstance(g.handle.index, gi)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: FakeInstance, profile_id: int) -> FakeInstance:
        self._mig_call("nvmlGpuInstanceCreateComputeInstance")
        g = self.gpus[gi.gpu]
        made = g.gis.get(gi.gi)
        if made is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        if made.ci is not None or CI_PROFILES.get(profile_id, 99) > GI_PROFILES[made.gi_profile][0]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        slot = min(set(range(_MIG_SLOTS)) - set(g.migs))
        made.ci, made.slot = 0, slot
        mem = g.memory_mib // 8 * made.size
        name = f"{g.device.name}-mig{slot}"
        device = Device(name=name, kind=DeviceKind.MIG, index=slot, parent=g.device.name, memory_mib=mem,
                        uuid="MIG-" + str(uuidlib.uuid4()))
        g.migs[slot] = FakeMig(device=device, gpu=gi.gpu, slot=slot, gi=gi.gi, ci=0, gi_profile=made.gi_profile,
                               ci_profile=profile_id, memory_mib=mem, caps=cap_minors(g.minor, gi.gi, 0))
        return FakeInstance(gi.gpu, gi.gi, 0)

    def nvmlComputeInstanceDestroy(self, ci: FakeInstance) -> int:
        self._mig_call("nvmlComputeInstanceDestroy")
        g = self.gpus[ci.gpu]
        made = g.gis.get(ci.gi)
        if made is None or made.ci != ci.ci:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        g.migs.pop(made.slot or 0, None)
        made.ci, made.slot = None, None
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceDestroy(self, gi: FakeInstance) -> int:
        self._mig_call("nvmlGpuInstanceDestroy")
        g = self.gpus[gi.gpu]
        made = g.gis.get(gi.gi)
        if made is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        if made.ci is not None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)  # NVML: destroy the compute instances first
        del g.gis[gi.gi]
        return pynvml.NVML_SUCCESS

    def mig_instances(self, gpu: str | int) -> list[tuple[str, int, int, int | None]]:
        """The GPU instances made at run time: (profile name, start, GI ID, CI ID or None), by start."""
        g = self._gpu(gpu)
        table = table_for(g.model, g.memory_mib)
        return sorted((table.by_gi_profile(x.gi_profile).name if table else str(x.gi_profile),  # type: ignore[union-attr]
                       x.start, gi, x.ci) for gi, x in g.gis.items())

    # events
    def nvmlEventSetCreate(self) -> _EventSet:
        self._count("nvmlEventSetCreate")
        self._check_init()
        es = _EventSet()
        with self._lock:
            self._sets.append(es)
        return es

    def nvmlEventSetFree(self, es: _EventSet) -> None:
        self._count("nvmlEventSetFree")
        with self._lock:
            es.freed = True
            self._registered_cv.notify_all()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._count("nvmlDeviceGetSupportedEventTypes")
        self._h(handle)
        return self.supported_events

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, es: _EventSet) -> None:
        self._count("nvmlDeviceRegisterEvents")
        g = self._h(handle)
        if g.device.name in self.register_error:
            raise pynvml.NVMLError(self.register_error[g.device.name])
        if not isinstance(es, _EventSet) or es.freed:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if event_types & ~self.supported_events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            es.registered[g.handle.index] = es.registered.get(g.handle.index, 0) | event_types
            self._registered_cv.notify_all()

    def nvmlEventSetWait_v2(self, es: _EventSet, timeout_ms: int) -> FakeEventData:
        self._count("nvmlEventSetWait")
        with self._lock:
            self.wait_times.append(time.monotonic())
            failure = self._wait_failure
            if failure is not None:
                code, left = failure
                if left is not None:
                    self._wait_failure = (code, left - 1) if left > 1 else None
        self._check_init()
        if failure is not None:
            raise pynvml.NVMLError(failure[0])
        if es.freed:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        try:
            return es.events.get(timeout=max(0, timeout_ms) / 1000.0)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    nvmlEventSetWait = nvmlEventSetWait_v2

    # -- GPU health evidence (plugin/health/evidence.py) ------------------------------
    def _facts(self, gpu: str | int | FakeHandle) -> _HealthFacts:
        g = self.gpus[gpu.index] if isinstance(gpu, FakeHandle) else self._gpu(gpu)
        return self.health_facts.setdefault(g.handle.index, _HealthFacts())

    def set_health_facts(self, gpu: str | int, **facts: Any) -> None:
        """Set any of `recovery_action`, `remap_pending`, `remap_failed`, `retired_pending`, `volatile_dbe`."""
        f = self._facts(gpu)
        for k, v in facts.items():
            if not hasattr(f, k):
                raise ValueError(f"no health fact {k!r}")
            setattr(f, k, v)

    def reset_gpu(self, gpu: str | int) -> None:
        """A GPU reset (nvidia-smi -r): pending repairs take effect, volatile counts and the action clear."""
        f = self._facts(gpu)
        f.remap_pending = f.retired_pending = False
        f.volatile_dbe = 0
        f.recovery_action = 0
        self._gpu(gpu).lost = False

    def set_link(self, gpu: str | int, link: int, up: bool) -> None:
        """Take one NVLink of this GPU down (inactive, no remote end) or bring it back."""
        g = self._gpu(gpu)
        (g.down.discard if up else g.down.add)(link)

    @staticmethod
    def write_boot_id(proc_root: str, boot_id: str) -> str:
        path = os.path.join(proc_root, "sys", "kernel", "random", "boot_id")
        _write(path, boot_id + "\n")
        return path

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> list[FakeFieldValue]:
        self._count("nvmlDeviceGetFieldValues")
        f = self._facts(self._h(handle).handle)
        out = []
        for fid in field_ids:
            fid = fid[0] if isinstance(fid, tuple) else fid
            if fid == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and self.recovery_field:
                out.append(FakeFieldValue(fid, pynvml.NVML_SUCCESS, FakeValue(uiVal=f.recovery_action)))
            else:
                out.append(FakeFieldValue(fid, pynvml.NVML_ERROR_NOT_SUPPORTED, FakeValue()))
        return out

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        self._count("nvmlDeviceGetRemappedRows")
        f = self._facts(self._h(handle).handle)
        return (0, 1 if f.remap_pending or f.remap_failed else 0, int(f.remap_pending), int(f.remap_failed))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        self._count("nvmlDeviceGetRetiredPagesPendingStatus")
        return int(self._facts(self._h(handle).handle).retired_pending)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        self._count("nvmlDeviceGetTotalEccErrors")
        f = self._facts(self._h(handle).handle)
        return f.volatile_dbe if counter_type == pynvml.NVML_VOLATILE_ECC else f.aggregate_dbe + f.volatile_dbe


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def gpu_node_on_disk(root: str, node: str = "dgx-a100-mig", **fake_kw: Any) -> tuple[FakeNvml, dict[str, str]]:
    """A built-in node's GPUs (no NICs) as fake NVML plus its sysfs, procfs and /dev under `root`.

    Returns the fake and the roots by name (`sys`, `proc`, `dev`), ready for the hardware source;
    `fake_kw` goes to FakeNvml (e.g. `missing_functions=R470_MISSING`).
    """
    from plugin.sources.simulated import load_simulated

    sim = load_simulated(node)
    fake = FakeNvml(sim.without(d.name for d in sim.nics), **fake_kw)
    roots = {k: os.path.join(root, k) for k in ("sys", "proc", "dev")}
    fake.write_sysfs(roots["sys"])
    fake.write_proc(roots["proc"])
    fake.write_dev(roots["dev"])
    return fake, roots
