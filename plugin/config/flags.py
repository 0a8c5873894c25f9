"""Every option of the program, declared once.

Why one table: an option can come from a flag, from `TOPO_DP_<OPTION>` and
from the config file's `flags:`, in that order of precedence, and operators
set it through the Helm chart. The click options (`plugin.cli.options`), the
precedence step, the JSON schema of the config file's `flags:` section, the
`config.flags` part of the chart's `values.schema.json` and the options table
in docs/configuration.md are all derived from `OPTIONS`, so adding an option
is one declaration here (plus its use), then `python scripts/options_docs.py`
to rewrite the two generated files (a test fails while they are stale).
NVIDIA's plugin does the same with one typed flags struct
(`api/config/v1/flags.go`).

Each option says what it feeds (`Target`), and whether a config reload
applies it follows from that (`Option.live`), never from a hand-set flag: a
reload rebuilds the resources (names, IDs, policies, Allocate answers) and
nothing else. An option that also feeds discovery, the sockets, the DRA split
or logging keeps its running value everywhere until a restart (`--dev-root`
names the device nodes discovery found, so the Allocate answers keep it too);
a reload that changes one logs that it needs a restart and applies the rest.

Validation lives in the declarations too (`kind`: absolute paths, extended
resource names), so the flag, the environment variable, the config file's
schema and the chart's `values.schema.json` (`chart_schema_flags`, written by
scripts/options_docs.py) accept and refuse the same values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

#: How Allocate may name GPUs (`--device-list-strategy`); declared here, with the option, so that the
#: answers that follow it (`plugin.model.gpu_allocate`) import it downward: config imports no runtime module.
DEVICE_LIST_STRATEGIES = ("envvar", "cdi-cri", "cdi-annotations")

#: Commands that read the options shared by every command that looks at a node.
NODE_COMMANDS = frozenset({"serve", "discover", "demo", "allocate", "explain"})
SERVE = frozenset({"serve"})

LOG_LEVELS = ("debug", "info", "warning", "error")
MIG_STRATEGIES = ("none", "single", "mixed")

#: Option kinds and the JSON schema each stands for in the config file.
#: `list`: names, as a list in the config file or comma-separated on the command line / environment.
#: `path`: an absolute path (a relative one would depend on the daemon's working directory, which
#: nobody chooses in a pod). `resource-name`: an extended resource name the kubelet accepts.
KINDS = ("text", "choice", "choice-list", "list", "number", "bool", "address", "path", "resource-name")

#: An extended resource name the kubelet accepts in Register (its IsExtendedResourceName): `<domain>/<name>`,
#: the domain a DNS subdomain of at most 253 characters, the name at most 63. A plain pattern (no look-ahead):
#: the daemon checks it with Python's `re` (`plugin.model.resource_names`), helm the chart's schema with Go's RE2.
RESOURCE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
RESOURCE_NAME_MAX = 253 + 1 + 63
#: Names the kubelet keeps for itself (searched anywhere in the name).
RESERVED_PATTERNS = (r"kubernetes\.io/", r"^requests\.")

#: What to write instead, per kind with a rule of its own (click errors and config-file errors say it).
KIND_FIX = {
    "path": "give an absolute path, starting with /",
    "resource-name": "want <lowercase.domain>/<name>, not under kubernetes.io, e.g. nvidia.com/gpu",
}

#: What the docs table adds to an option's meaning, per kind with a rule of its own.
KIND_DOC = {"path": " Absolute path.", "resource-name": " An extended resource name (`<domain>/<name>`)."}


class Target(str, Enum):
    """What an option feeds; the part of the daemon a config reload rebuilds is `RESOURCES` only."""

    #: Which config file is read: read once, at start.
    INVOCATION = "invocation"
    #: The topology source (simulated node, NVML, sysfs, /dev, /proc): built once at start.
    DISCOVERY = "discovery"
    #: The resource build (names, IDs, policies, pairing, Allocate answers): rebuilt by a reload.
    RESOURCES = "resources"
    #: Sockets and endpoints (kubelet paths, metrics address, CDI spec dir, pod-resources client).
    SERVING = "serving"
    #: Which side serves a resource: never both, not even briefly, so never changed by a reload.
    DRA = "dra"
    #: Log level and format, set before the first line is logged.
    LOGGING = "logging"


#: The targets a config reload rebuilds; an option applies live exactly when its target is one of them.
LIVE_TARGETS = frozenset({Target.RESOURCES})


@dataclass(frozen=True)
class Option:
    """One option: its flag, environment variable, config key, type, default and help."""

    name: str
    help: str
    kind: str = "text"
    default: Any = None
    choices: tuple[str, ...] = ()
    #: Commands that take it.
    commands: frozenset[str] = NODE_COMMANDS
    #: What it feeds: decides whether a config reload applies it (`live`).
    target: Target | None = None
    #: In the config file's `flags:` (False for `--config` itself).
    in_config: bool = True
    #: The Helm chart sets it from its own values (not accepted under `config.flags`).
    chart_managed: bool = False
    metavar: str | None = None
    #: The click parameter name when it differs from `name` (`--config` -> `config_path`).
    param: str | None = None
    #: Default shown in help when `default` is None ("off", "<kubelet-root-dir>/device-plugins").
    default_text: str | None = None
    #: Per-command defaults (the demo is quieter than the daemon).
    command_defaults: Mapping[str, Any] = field(default_factory=dict)
    #: Extra JSON-schema keywords for the config file (patterns, lengths).
    schema_extra: Mapping[str, Any] = field(default_factory=dict)
    #: For numbers: 0 is allowed (numbers are > 0 otherwise), and the largest value (None: no limit).
    zero_ok: bool = False
    maximum: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"option {self.name}: unknown kind {self.kind!r}")
        if not isinstance(self.target, Target):
            raise ValueError(f"option {self.name}: declare what it feeds (target=Target.<...>)")

    @property
    def live(self) -> bool:
        """A config reload applies it: it feeds only what a reload rebuilds."""
        return self.target in LIVE_TARGETS

    @property
    def fix(self) -> str | None:
        """What to write instead of a value its kind refuses (None: the schema's message says it)."""
        return KIND_FIX.get(self.kind)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "TOPO_DP_" + self.name.upper()

    @property
    def key(self) -> str | None:
        """The config file's `flags:` key (camelCase), or None."""
        if not self.in_config:
            return None
        head, *rest = self.name.split("_")
        return head + "".join(p.capitalize() for p in rest)

    @property
    def dest(self) -> str:
        return self.param or self.name

    def default_for(self, command: str) -> Any:
        return self.command_defaults.get(command, self.default)

    def json_schema(self) -> dict[str, Any]:
        if self.kind == "choice":
            out: dict[str, Any] = {"enum": list(self.choices)}
        elif self.kind == "choice-list":
            one = {"enum": list(self.choices)}
            out = {"oneOf": [one, {"type": "array", "minItems": 1, "uniqueItems": True, "items": one}]}
        elif self.kind == "list":
            # `schema_extra["pattern"]` is one name's; the string form is a comma list of them.
            item = {"type": "string", "minLength": 1, **self.schema_extra}
            text = dict(item)
            if "pattern" in item:
                one = item["pattern"].removeprefix("^").removesuffix("$")
                text["pattern"] = f"^{one}(,{one})*$"
            return {"oneOf": [text, {"type": "array", "uniqueItems": True, "items": item}], "description": self.help}
        elif self.kind == "bool":
            out = {"type": "boolean"}
        elif self.kind == "number":
            out = {"type": "number", ("minimum" if self.zero_ok else "exclusiveMinimum"): 0}
            if self.maximum is not None:
                out["maximum"] = self.maximum
        elif self.kind == "address":
            out = {"type": "string", "pattern": "^.*:[0-9]{1,5}$"}
        elif self.kind == "path":
            out = {"type": "string", "pattern": "^/"}
        elif self.kind == "resource-name":
            # No look-ahead in the pattern: helm validates with Go's RE2, the daemon with Python's `re`.
            out = {"type": "string", "maxLength": RESOURCE_NAME_MAX, "pattern": RESOURCE_NAME_PATTERN,
                   "not": {"anyOf": [{"pattern": p} for p in RESERVED_PATTERNS]}}
        else:
            out = {"type": "string", "minLength": 1}
        out.update(self.schema_extra)
        out["description"] = self.help
        return out


# Short names for the table below only.
D, R, S, L = Target.DISCOVERY, Target.RESOURCES, Target.SERVING, Target.LOGGING

OPTIONS: tuple[Option, ...] = (
    Option("config", "YAML config: flags, GPU health, NIC pools (see docs/configuration.md).",
           in_config=False, param="config_path", metavar="FILE", target=Target.INVOCATION,
           commands=NODE_COMMANDS | {"health"}),  # health clear finds the state directory in it
    Option("simulate", "Serve a simulated node: a built-in name, a YAML node file or `nvidia-smi topo -m` text.",
           metavar="SOURCE", chart_managed=True, target=D),
    Option("device_id_strategy", "How GPU IDs are formed.", kind="choice", default="uuid",
           choices=("uuid", "index"), target=R),
    Option("gpu_resource_name", "Extended resource name for GPUs.", kind="resource-name", default="nvidia.com/gpu",
           target=R),
    Option("allocation_policy", "GPU preferred-allocation policy.", kind="choice", default="numa-first",
           choices=("numa-first", "link-first"), target=R),
    Option("time_budget_ms", "Search budget for a preferred allocation above 16 candidates.", kind="number",
           default=20.0, target=R),
    Option("pairing_window_ms", "GPU-NIC pairing: a GetPreferredAllocation is paired with the Allocates of the "
           "container's other resources that came at most this long before; 0 turns pairing off.",
           kind="number", default=1000.0, target=R, zero_ok=True, maximum=60000.0),
    Option("nic_resource_name", "Resource name for NICs when the config defines no NIC pools.",
           kind="resource-name", default="topo.dev/nic", target=R),
    Option("nic_id_strategy", "How NIC IDs are formed in device-plugin mode: name (the NIC's name: its PCI address "
           "on discovered hardware, the node file's name on a simulated node) or pci (its PCI address, as the SR-IOV "
           "network device plugin does: Multus hands the ID to the CNI, and host-device or sriov-cni find the "
           "function by it; docs/nics.md).", kind="choice", default="name", choices=("name", "pci"), target=R),
    Option("nic_allocation_policy", "NIC policy when the config defines no NIC pools.", kind="choice",
           default="spread", choices=("spread", "packed"), target=R),
    Option("device_list_strategy", f"Comma list of {', '.join(DEVICE_LIST_STRATEGIES)}: how Allocate names GPUs "
           "(CDI strategies name MIG devices and NICs with device nodes too; docs/sharing.md).",
           kind="choice-list", default="envvar", choices=DEVICE_LIST_STRATEGIES, target=R),
    Option("pass_device_specs", "List device nodes in Allocate answers. With --no-pass-device-specs and a CDI device "
           "list strategy, devices named through CDI get no device nodes from us: the container runtime injects "
           "them from the CDI spec (NVIDIA's passDeviceSpecs). Without a CDI strategy it changes nothing.",
           kind="bool", default=True, target=R),
    Option("mig_strategy", "How MIG devices are served, as NVIDIA's plugin: none (MIG-enabled GPUs are served whole), "
           "single (every GPU in MIG mode with one profile, as the GPU resource) or mixed (one resource per profile, "
           "<domain>/mig-<profile>).", kind="choice", default="none", choices=MIG_STRATEGIES, target=R),
    Option("cdi_specs", "With cdi-cri/cdi-annotations: write our own CDI spec per resource under --cdi-spec-dir and "
           "name devices from it (write), or name GPUs <cdi-vendor>/<cdi-class>=<UUID> from a spec another tool "
           "wrote, such as `nvidia-ctk cdi generate` (external).", kind="choice", default="write",
           choices=("write", "external"), target=R),
    Option("cdi_spec_dir", "Where our CDI specs go (with --cdi-specs write and a CDI device list strategy).",
           kind="path", default="/var/run/cdi", commands=SERVE, chart_managed=True, target=S),
    Option("cdi_vendor", "CDI vendor of the names with --cdi-specs external and --dra-toolkit-cdi.",
           default="nvidia.com", target=R),
    Option("mps_root", "Host directory of the MPS control daemons (sharing.mps, DRA MPS claims): each shared "
           "resource gets <root>/<resource>/pipe and /log; containers get the pipe directory mounted at "
           "/mps/<resource>/pipe (NVIDIA's mpsRoot; docs/sharing.md).", kind="path", default="/run/nvidia/mps",
           target=R),
    Option("mps_control_binary", "The MPS control program the daemon starts and talks to (NVIDIA's "
           "nvidia-cuda-mps-control, looked up on PATH unless a path is given).", default="nvidia-cuda-mps-control",
           commands=SERVE, target=S),
    Option("cdi_class", "CDI class of the names with --cdi-specs external and --dra-toolkit-cdi.", default="gpu",
           target=R),
    Option("toolkit_cdi_dirs", "Where the CDI spec of NVIDIA's container toolkit is looked for (comma separated): "
           "the names of --dra-toolkit-cdi and of --cdi-specs external are checked against the files of kind "
           "<cdi-vendor>/<cdi-class> here before an answer names them.", kind="list", metavar="DIRS",
           default_text="/etc/cdi,/var/run/cdi", target=R, schema_extra={"pattern": "^/"}),
    Option("cdi_annotation_prefix", "Key prefix of the cdi-annotations strategy's annotations.",
           default="cdi.k8s.io/", target=R, schema_extra={"pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/$"}),
    Option("dra_resources", "Resources served through Dynamic Resource Allocation (driver topo.dev, ResourceSlices and "
           "ResourceClaims) instead of the device-plugin API: the GPU resource name and/or NIC pool names, comma "
           "separated. Each device is served one way only (docs/dra.md).", kind="list", commands=SERVE,
           chart_managed=True, metavar="NAMES", target=Target.DRA, default_text="none (every resource through the device-plugin API)",
           schema_extra={"pattern": "^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"}),
    Option("dra_mig", "GPUs in MIG mode served through DRA: none (served whole), static (their existing MIG devices "
           "are the DRA devices) or dynamic (partitionable GPUs: every possible MIG placement is published with "
           "shared counters and created at prepare; the other GPUs in MIG mode are static). Needs the GPU resource in "
           "draResources (docs/dra.md).", kind="choice", default="none", choices=("none", "static", "dynamic"),
           commands=SERVE, target=Target.DRA),
    Option("dra_mig_gpus", "Under draMig dynamic: the indexes of the partitionable GPUs (comma separated); default: "
           "every GPU in MIG mode that has a profile table (80 GB A100/H100).", kind="list", commands=SERVE,
           metavar="INDEXES", target=Target.DRA, default_text="every GPU in MIG mode",
           schema_extra={"pattern": "^[0-9]+$"}),
    Option("dra_shared_gpus", "Publish the GPUs served through DRA with allowMultipleAllocations, so several claims "
           "can hold shares of one GPU's memory capacity (consumable capacity, KEP-5075; needs the "
           "DRAConsumableCapacity gate, on by default since 1.36). A claim that asks for no memory still takes the "
           "whole GPU (docs/dra.md).", kind="bool", default=False, commands=SERVE, target=Target.DRA),
    Option("dra_gpu_shares", "Shares by count (NVIDIA's --consumable-shares <count>): publish each GPU served "
           "through DRA with allowMultipleAllocations and a consumable capacity `shares` of this many, 1 per claim "
           "unless it asks more, so up to this many claims share a GPU without naming memory (memory then "
           "defaults to 0 per claim). 0: off. Not enforced on the GPU, as with memory shares (docs/dra.md).",
           kind="number", default=0, zero_ok=True, maximum=1024, commands=SERVE, target=Target.DRA,
           metavar="COUNT", schema_extra={"multipleOf": 1}),
    Option("dra_imex_channels", "Host-managed IMEX (multi-node NVLink, the IMEX daemon runs on the host): publish "
           "this many IMEX channels (channel 0 up) as DRA devices imex-channel-<n> carrying the node's clique, and "
           "give a claim's container /dev/nvidia-caps-imex-channels/channel<n> (major from <proc-root>/devices, "
           "nvidia-caps-imex-channels; the start fails with the fix where the driver has none). 0: none "
           "(docs/compared-with-nvidia.md).", kind="number", default=0, zero_ok=True, maximum=2048, commands=SERVE,
           target=Target.DRA, metavar="COUNT", schema_extra={"multipleOf": 1}),
    Option("imex_control_binary", "Host-managed IMEX: before a claim's IMEX channel is handed out, run this "
           "program as `<program> -q --u=<--imex-control-socket>` (NVIDIA's nvidia-imex-ctl, looked up on PATH "
           "unless a path is given); prepare fails, and the kubelet retries it, unless it answers READY. Empty: "
           "channels are handed out unchecked; on a simulated node it runs only when given "
           "(docs/compared-with-nvidia.md).", default="nvidia-imex-ctl", commands=SERVE, target=Target.DRA,
           schema_extra={"minLength": 0}),  # "" is a value here (no check), in the config file too
    Option("imex_control_socket", "The host IMEX daemon's command socket --imex-control-binary asks "
           "(IMEX_CMD_UNIX_DOMAIN_PATH in /etc/nvidia-imex/config.cfg, with IMEX_CMD_ENABLED=1).", kind="path",
           default="/etc/nvidia-imex/imex_ctrl.sock", commands=SERVE, target=Target.DRA),
    Option("dra_toolkit_cdi", "DRA mode: give each prepared GPU and MIG device NVIDIA's container toolkit's CDI "
           "device beside ours (<cdi-vendor>/<cdi-class>=<UUID> with uuid; =<index>, a MIG device "
           "<GPU index>:<slot>, with index), so the container also gets the driver's libraries, nvidia-smi, "
           "firmware and hooks from the toolkit's spec; prepare checks each name against that spec in "
           "--toolkit-cdi-dirs and fails the claim with the fix when the spec or the name is missing. off: our "
           "spec alone (device nodes and env; docs/nvidia-toolkit.md).", kind="choice", default="off",
           choices=("off", "uuid", "index"), commands=SERVE, chart_managed=True, target=Target.DRA),
    Option("netdev_attach", "DRA mode: move each prepared NIC's network interface (and its RDMA device, when the "
           "RDMA subsystem is in exclusive netns mode) into its pod's network namespace when the pod's sandbox "
           "starts, configured as the claim's NicConfig says, and back when the pod goes (auto: through the "
           "container runtime's NRI, whenever DRA serves NICs; off: NICs stay in the node's namespace and a claim "
           "with a NicConfig is refused). Needs NET_ADMIN and SYS_ADMIN and the host network namespace "
           "(docs/networking.md).", kind="choice", default="auto", choices=("auto", "off"), commands=SERVE,
           chart_managed=True, target=S),
    Option("nri_socket", "The container runtime's NRI socket (containerd: on by default in 2.x, off in 1.7), used with "
           "--netdev-attach auto.", kind="path", default="/var/run/nri/nri.sock", commands=SERVE,
           chart_managed=True, target=S),
    Option("pod_primary_interface", "The interface the pod's primary CNI creates in every pod; no attached NIC may "
           "take its name (nor `lo`).", default="eth0", commands=SERVE, target=S,
           schema_extra={"pattern": "^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,14}$"}),
    Option("sysfs_root", "Where sysfs is mounted (real hardware).", kind="path", default="/sys", target=D),
    Option("dev_root", "Where device nodes are (real hardware; Allocate answers name the nodes found here).",
           kind="path", default="/dev", target=D),
    Option("proc_root", "Where procfs is mounted (default route check, MIG capability device minors).",
           kind="path", default="/proc", target=D),
    Option("fail_on_init_error", "Exit when NVML cannot start; with --no-fail-on-init-error serve zero GPUs instead.",
           kind="bool", default=True, target=D),
    Option("nic_link_health", "Mark a NIC Unhealthy while its link is down (polled every 2 s).", kind="bool",
           default=False, target=D),
    Option("fabric_labels_file", "Keep the GPUs' NVLink fabric clique as the node label nvidia.com/gpu.clique="
           "<cluster UUID>.<clique ID> in this Node Feature Discovery feature file (a file in NFD's features.d "
           "directory, mounted into the container); rewritten when the clique changes, removed when there is "
           "none (docs/platforms.md).", kind="path", commands=SERVE, chart_managed=True, metavar="FILE",
           default_text="off", target=D),
    Option("fabric_labels_node", "Keep the GPUs' NVLink fabric clique as the label nvidia.com/gpu.clique="
           "<cluster UUID>.<clique ID> of this node's Node object (named by NODE_NAME), patched through the API "
           "server (RBAC: get and patch nodes); only that label is touched, removed when there is no clique, "
           "retried while the API server is unreachable (docs/platforms.md).", kind="bool", default=False,
           commands=SERVE, chart_managed=True, target=D),
    Option("fabric_recheck_s", "Re-read the GPUs' NVLink fabric state (NVML's fabric info: registration state, "
           "cluster UUID, clique ID) this often, in seconds, so a GPU the fabric manager registers after start "
           "gets its clique label and DRA attribute; a change triggers a rescan and is published (as GPU Feature "
           "Discovery re-labels every 60 s). 0: only at start, rescans and GPU health events.", kind="number",
           default=60.0, zero_ok=True, maximum=86400.0, commands=SERVE, target=D),
    Option("kubelet_root_dir", "The kubelet's --root-dir.", kind="path", default="/var/lib/kubelet", commands=SERVE,
           chart_managed=True, target=S),
    Option("device_plugin_path", "Where kubelet.sock is and our sockets go.", kind="path", commands=SERVE,
           chart_managed=True, default_text="<kubelet-root-dir>/device-plugins", target=S),
    Option("pod_resources", "Check pairing partners against the kubelet's pod-resources API (List on "
           "<kubelet-root-dir>/pod-resources/kubelet.sock); quietly off while the socket is missing.",
           kind="bool", default=False, commands=SERVE, target=S),
    Option("nrt", "Publish this node's NodeResourceTopology object (topology.node.k8s.io/v1alpha2: a zone per NUMA "
           "node with every device-plugin resource's capacity, allocatable and available, NUMA distances, the "
           "Topology Manager policy and scope, free GPU-NIC pairs per zone) for a topology-aware scheduler, kept "
           "current from pod-resources (polled every second) and coalesced to at most one write a second; deleted "
           "at shutdown; never written when another manager (NFD's topology-updater) owns it (docs/scheduling.md). "
           "Needs NODE_NAME and RBAC on noderesourcetopologies (chart: nrt.enabled).", kind="bool", default=False,
           commands=SERVE, chart_managed=True, target=S),
    Option("kubelet_config", "The kubelet's config file, read with --nrt for topologyManagerPolicy and "
           "topologyManagerScope (absent fields: the kubelet's defaults none and container; unreadable: both "
           "left out of the object, a warning says why).", kind="path", default="/var/lib/kubelet/config.yaml",
           commands=SERVE, chart_managed=True, target=S),
    Option("nccl_env", "Tell NCCL which NICs are the container's: NCCL_IB_HCA (RDMA devices) and NCCL_SOCKET_IFNAME "
           "(netdevs without RDMA) listing its NICs, each GPU's paired NIC first, in Allocate answers and DRA claims' "
           "CDI specs (the DRA driver reads it at start; docs/networking.md).", kind="bool", default=False, target=R),
    Option("log_level", "Log level.", kind="choice", default="info", choices=LOG_LEVELS,
           commands=frozenset({"serve", "demo"}), command_defaults={"demo": "warning"}, target=L),
    Option("log_format", "Log format.", kind="choice", default="text", choices=("text", "json"), commands=SERVE, target=L),
    Option("metrics_address", "Serve Prometheus /metrics, /healthz and /readyz here.", kind="address",
           commands=SERVE, chart_managed=True, metavar="HOST:PORT", default_text="off", target=S),
)

del D, R, S, L

BY_NAME: Mapping[str, Option] = {o.name: o for o in OPTIONS}
BY_DEST: Mapping[str, Option] = {o.dest: o for o in OPTIONS}


def options_for(command: str) -> tuple[Option, ...]:
    return tuple(o for o in OPTIONS if command in o.commands)


def flags_schema() -> dict[str, Any]:
    """The JSON schema of the config file's `flags:` section."""
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "Any option in camelCase; a command-line flag or TOPO_DP_<OPTION> environment "
                       "variable wins over these.",
        "properties": {o.key: o.json_schema() for o in OPTIONS if o.key},
    }


def chart_schema_flags() -> dict[str, Any]:
    """The `config.flags` part of the chart's values.schema.json (written by scripts/options_docs.py).

    The same rules as the config file's, less what the chart sets from its own values
    (`chart_managed`) and NVIDIA's keys (for NVIDIA config files brought along, not chart values).
    """
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "Daemon options in camelCase, generated from plugin/config/flags.py (the options the "
                       "chart sets from its own values are not accepted here).",
        "properties": {o.key: o.json_schema() for o in OPTIONS if o.key and not o.chart_managed},
    }


def restart_needed(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Flags (`--name`) whose value changed between two resolutions and that only a restart applies."""
    return sorted(o.flag for o in OPTIONS if not o.live and o.dest in new and old.get(o.dest) != new.get(o.dest))


def _default_cell(o: Option) -> str:
    if o.default is None:
        return o.default_text or "none"
    if o.kind == "bool":
        return "true" if o.default else "false"
    text = f"{o.default:g}" if isinstance(o.default, float) else str(o.default)
    extra = "".join(f"; `{c}`: {v}" for c, v in o.command_defaults.items())
    return f"`{text}`" + extra


def markdown_table() -> str:
    """The options table of docs/configuration.md (checked by a test, so the doc cannot drift)."""
    rows = ["| flag | environment | `flags:` key | default | feeds: applies | commands | meaning |",
            "|---|---|---|---|---|---|---|"]
    for o in OPTIONS:
        flag = f"`{o.flag}/--no-{o.flag[2:]}`" if o.kind == "bool" else f"`{o.flag}`"
        values = f" (`{'`, `'.join(o.choices)}`)" if o.choices else ""
        commands = "all" if o.commands == NODE_COMMANDS else ", ".join(sorted(o.commands))
        rule = KIND_DOC.get(o.kind, "")
        rows.append(f"| {flag} | `{o.env}` | {f'`{o.key}`' if o.key else '-'} | {_default_cell(o)} | "
                    f"{o.target.value if o.target else '?'}: {'live' if o.live else 'restart'} | {commands} | {o.help}{values}{rule} |")
    return "\n".join(rows) + "\n"
