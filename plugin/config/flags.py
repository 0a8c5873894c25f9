"""Every option of the program, declared once.

Why one table: an option can come from a flag, from `TOPO_DP_<OPTION>` and
from the config file's `flags:`, in that order of precedence, and operators
set it through the Helm chart. The click options (`plugin.cli.options`), the
precedence step, the JSON schema of the config file's `flags:` section, the
check of the chart's `values.schema.json` and the options table in
docs/configuration.md are all derived from `OPTIONS`, so adding an option is
one declaration here (plus its use). NVIDIA's plugin does the same with one
typed flags struct (`api/config/v1/flags.go`).

`live`: a config reload applies the option at once (it only shapes the
resources: names, IDs, policies, Allocate answers). Options that decide how
devices are discovered or where the daemon listens need a restart; a reload
that changes one logs so and applies the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..gpu_allocate import DEVICE_LIST_STRATEGIES

#: Commands that read the options shared by every command that looks at a node.
NODE_COMMANDS = frozenset({"serve", "discover", "demo", "allocate", "explain"})
SERVE = frozenset({"serve"})

LOG_LEVELS = ("debug", "info", "warning", "error")
MIG_STRATEGIES = ("none", "single", "mixed")

#: Option kinds and the JSON schema each stands for in the config file.
#: `list`: names, as a list in the config file or comma-separated on the command line / environment.
KINDS = ("text", "choice", "choice-list", "list", "number", "bool", "address")


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
    #: A config reload applies it (True) or it needs a restart (False).
    live: bool = False
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
        else:
            out = {"type": "string", "minLength": 1}
        out.update(self.schema_extra)
        out["description"] = self.help
        return out


OPTIONS: tuple[Option, ...] = (
    Option("config", "YAML config: flags, GPU health, NIC pools (see docs/configuration.md).",
           in_config=False, param="config_path", metavar="FILE"),
    Option("simulate", "Serve a simulated node: a built-in name, a YAML node file or `nvidia-smi topo -m` text.",
           metavar="SOURCE", chart_managed=True),
    Option("device_id_strategy", "How GPU IDs are formed.", kind="choice", default="uuid",
           choices=("uuid", "index"), live=True),
    Option("gpu_resource_name", "Extended resource name for GPUs.", default="nvidia.com/gpu", live=True,
           schema_extra={"minLength": 3}),
    Option("allocation_policy", "GPU preferred-allocation policy.", kind="choice", default="numa-first",
           choices=("numa-first", "link-first"), live=True),
    Option("time_budget_ms", "Search budget for a preferred allocation above 16 candidates.", kind="number",
           default=20.0, live=True),
    Option("pairing_window_ms", "GPU-NIC pairing: a GetPreferredAllocation is paired with the Allocates of the "
           "container's other resources that came at most this long before; 0 turns pairing off.",
           kind="number", default=1000.0, live=True, zero_ok=True, maximum=60000.0),
    Option("nic_resource_name", "Resource name for NICs when the config defines no NIC pools.",
           default="topo.dev/nic", live=True, schema_extra={"minLength": 3}),
    Option("nic_allocation_policy", "NIC policy when the config defines no NIC pools.", kind="choice",
           default="spread", choices=("spread", "packed"), live=True),
    Option("device_list_strategy", f"Comma list of {', '.join(DEVICE_LIST_STRATEGIES)}: how Allocate names GPUs "
           "(CDI strategies name MIG devices and NICs with device nodes too; docs/sharing.md).",
           kind="choice-list", default="envvar", choices=DEVICE_LIST_STRATEGIES, live=True),
    Option("pass_device_specs", "List device nodes in Allocate answers. With --no-pass-device-specs and a CDI device "
           "list strategy, devices named through CDI get no device nodes from us: the container runtime injects "
           "them from the CDI spec (NVIDIA's passDeviceSpecs). Without a CDI strategy it changes nothing.",
           kind="bool", default=True, live=True),
    Option("mig_strategy", "How MIG devices are served, as NVIDIA's plugin: none (MIG-enabled GPUs are served whole), "
           "single (every GPU in MIG mode with one profile, as the GPU resource) or mixed (one resource per profile, "
           "<domain>/mig-<profile>).", kind="choice", default="none", choices=MIG_STRATEGIES, live=True),
    Option("cdi_specs", "With cdi-cri/cdi-annotations: write our own CDI spec per resource under --cdi-spec-dir and "
           "name devices from it (write), or name GPUs <cdi-vendor>/<cdi-class>=<UUID> from a spec another tool "
           "wrote, such as `nvidia-ctk cdi generate` (external).", kind="choice", default="write",
           choices=("write", "external"), live=True),
    Option("cdi_spec_dir", "Where our CDI specs go (with --cdi-specs write and a CDI device list strategy).",
           default="/var/run/cdi", commands=SERVE, chart_managed=True, schema_extra={"pattern": "^/"}),
    Option("cdi_vendor", "CDI vendor of the names with --cdi-specs external.", default="nvidia.com", live=True),
    Option("cdi_class", "CDI class of the names with --cdi-specs external.", default="gpu", live=True),
    Option("cdi_annotation_prefix", "Key prefix of the cdi-annotations strategy's annotations.",
           default="cdi.k8s.io/", live=True, schema_extra={"pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/$"}),
    Option("dra_resources", "Resources served through Dynamic Resource Allocation (driver topo.dev, ResourceSlices and "
           "ResourceClaims) instead of the device-plugin API: the GPU resource name and/or NIC pool names, comma "
           "separated. Each device is served one way only (docs/dra.md).", kind="list", commands=SERVE,
           chart_managed=True, metavar="NAMES", default_text="none (every resource through the device-plugin API)",
           schema_extra={"pattern": "^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"}),
    Option("sysfs_root", "Where sysfs is mounted (real hardware).", default="/sys"),
    Option("dev_root", "Where device nodes are (real hardware).", default="/dev"),
    Option("proc_root", "Where procfs is mounted (default route check, MIG capability device minors).",
           default="/proc"),
    Option("fail_on_init_error", "Exit when NVML cannot start; with --no-fail-on-init-error serve zero GPUs instead.",
           kind="bool", default=True),
    Option("nic_link_health", "Mark a NIC Unhealthy while its link is down (polled every 2 s).", kind="bool",
           default=False),
    Option("fabric_labels_file", "Keep the GPUs' NVLink fabric clique as the node label nvidia.com/gpu.clique="
           "<cluster UUID>.<clique ID> in this Node Feature Discovery feature file (a file in NFD's features.d "
           "directory, mounted into the container); rewritten when the clique changes, removed when there is "
           "none (docs/platforms.md).", commands=SERVE, chart_managed=True, metavar="FILE", default_text="off",
           schema_extra={"pattern": "^/"}),
    Option("fabric_labels_node", "Keep the GPUs' NVLink fabric clique as the label nvidia.com/gpu.clique="
           "<cluster UUID>.<clique ID> of this node's Node object (named by NODE_NAME), patched through the API "
           "server (RBAC: get and patch nodes); only that label is touched, removed when there is no clique, "
           "retried while the API server is unreachable (docs/platforms.md).", kind="bool", default=False,
           commands=SERVE, chart_managed=True),
    Option("kubelet_root_dir", "The kubelet's --root-dir.", default="/var/lib/kubelet", commands=SERVE,
           chart_managed=True),
    Option("device_plugin_path", "Where kubelet.sock is and our sockets go.", commands=SERVE, chart_managed=True,
           default_text="<kubelet-root-dir>/device-plugins"),
    Option("pod_resources", "Check pairing partners against the kubelet's pod-resources API (List on "
           "<kubelet-root-dir>/pod-resources/kubelet.sock); quietly off while the socket is missing.",
           kind="bool", default=False, commands=SERVE),
    Option("log_level", "Log level.", kind="choice", default="info", choices=LOG_LEVELS,
           commands=frozenset({"serve", "demo"}), command_defaults={"demo": "warning"}),
    Option("log_format", "Log format.", kind="choice", default="text", choices=("text", "json"), commands=SERVE),
    Option("metrics_address", "Serve Prometheus /metrics, /healthz and /readyz here.", kind="address",
           commands=SERVE, chart_managed=True, metavar="HOST:PORT", default_text="off"),
)

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
    rows = ["| flag | environment | `flags:` key | default | live | commands | meaning |",
            "|---|---|---|---|---|---|---|"]
    for o in OPTIONS:
        flag = f"`{o.flag}/--no-{o.flag[2:]}`" if o.kind == "bool" else f"`{o.flag}`"
        values = f" (`{'`, `'.join(o.choices)}`)" if o.choices else ""
        commands = "all" if o.commands == NODE_COMMANDS else ", ".join(sorted(o.commands))
        rows.append(f"| {flag} | `{o.env}` | {f'`{o.key}`' if o.key else '-'} | {_default_cell(o)} | "
                    f"{'yes' if o.live else 'restart'} | {commands} | {o.help}{values} |")
    return "\n".join(rows) + "\n"
