"""Options shared by `serve`, `discover` and `demo`, and their precedence.

Why one place: every option can come from a flag, from `TOPO_DP_<OPTION>`
or from the config file's `flags:`; the order (flag > env > file > default)
must be the same for every command, and a bad value must exit 2 with a
message naming where it came from.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click
from click.core import ParameterSource

from ..config import Config, ConfigError, load_config
from ..gpu_allocate import DEVICE_LIST_STRATEGIES, GpuAllocateOptions
from ..resources import NicPool, ResourceOptions
from ..sources.base import TopologySource
from ..sources.errors import TopologyError

log = logging.getLogger(__name__)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def _env(name: str) -> str:
    return "TOPO_DP_" + name.upper()


def option(*decls: str, **kw: Any) -> Callable:
    """A click option that also reads TOPO_DP_<OPTION>."""
    name = re.sub(r"^-+", "", [d for d in decls if d.startswith("--")][0]).split("/")[0].replace("-", "_")
    kw.setdefault("envvar", _env(name))
    kw.setdefault("show_envvar", True)
    kw.setdefault("show_default", True)
    return click.option(*decls, **kw)


COMMON = [
    option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
           help="YAML config: flags, GPU health, NIC pools (see docs/configuration.md)."),
    option("--simulate", default=None, metavar="SOURCE",
           help="Serve a simulated node: a built-in name, a YAML node file or `nvidia-smi topo -m` text."),
    option("--device-id-strategy", type=click.Choice(["uuid", "index"]), default="uuid",
           help="How GPU IDs are formed."),
    option("--gpu-resource-name", default="nvidia.com/gpu", help="Extended resource name for GPUs."),
    option("--allocation-policy", type=click.Choice(["numa-first", "link-first"]), default="numa-first",
           help="GPU preferred-allocation policy."),
    option("--time-budget-ms", type=click.FloatRange(min=0, min_open=True), default=20.0,
           help="Search budget for a preferred allocation above 16 candidates."),
    option("--nic-resource-name", default="topo.dev/nic",
           help="Resource name for NICs when the config defines no NIC pools."),
    option("--nic-allocation-policy", type=click.Choice(["spread", "packed"]), default="spread",
           help="NIC policy when the config defines no NIC pools."),
    option("--device-list-strategy", default="envvar",
           help=f"Comma list of {', '.join(DEVICE_LIST_STRATEGIES)}: how Allocate names GPUs."),
    option("--cdi-vendor", default="nvidia.com", help="CDI vendor for cdi-cri/cdi-annotations names."),
    option("--cdi-class", default="gpu", help="CDI class for cdi-cri/cdi-annotations names."),
    option("--sysfs-root", default="/sys", help="Where sysfs is mounted (real hardware)."),
    option("--dev-root", default="/dev", help="Where device nodes are (real hardware)."),
    option("--proc-root", default="/proc", help="Where procfs is mounted (default route check)."),
    option("--fail-on-init-error/--no-fail-on-init-error", default=True,
           help="Exit when NVML cannot start; with --no-fail-on-init-error serve zero GPUs instead."),
    option("--nic-link-health/--no-nic-link-health", default=False,
           help="Mark a NIC Unhealthy while its link is down (polled every 2 s)."),
    option("--fake-nvml", default=None, metavar="SOURCE",
           help="Testing without a GPU: answer NVML calls from a simulated node (built-in, YAML or topo text) "
                "instead of the driver; sysfs/udev stay real."),
]


def common_options(fn: Callable) -> Callable:
    for opt in reversed(COMMON):
        fn = opt(fn)
    return fn


@dataclass
class Settings:
    """The resolved option values plus the parsed config."""

    values: dict[str, Any]
    config: Config
    #: what was given on the command line / environment, to resolve again when the config file changes
    params: dict[str, Any] = field(default_factory=dict)
    ctx: click.Context | None = None

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


def resolve(ctx: click.Context, params: dict[str, Any]) -> Settings:
    """Apply the config file under flags and env; raise click.UsageError (exit 2) on a bad file."""
    try:
        config = load_config(params.get("config_path"))
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    values = dict(params)
    for name in params:
        key = _camel(name)
        source = ctx.get_parameter_source(name)
        if key in config.flags and source in (ParameterSource.DEFAULT, None):
            values[name] = config.flags[key]
    if isinstance(values.get("device_list_strategy"), str):
        values["device_list_strategy"] = [s.strip() for s in values["device_list_strategy"].split(",") if s.strip()]
    return Settings(values, config, dict(params), ctx)


def _nic_pools(settings: Settings) -> tuple[NicPool, ...]:
    if not settings.config.nic_resource_list:
        return ()
    try:
        from ..nic_pools import parse_pools
    except ImportError:  # pragma: no cover
        raise click.UsageError(f"{settings.config.path}: nics.resourceList is not supported by this build") from None
    try:
        return tuple(parse_pools(settings.config.nic_resource_list, settings.config.path or "<config>",
                                 dev_root=settings.values["dev_root"]))
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def resource_options(settings: Settings) -> ResourceOptions:
    v = settings.values
    try:
        return ResourceOptions(
            device_id_strategy=v["device_id_strategy"],
            gpu_resource_name=v["gpu_resource_name"],
            gpu_policy=v["allocation_policy"],
            gpu_policy_options={"time_budget_s": float(v["time_budget_ms"]) / 1000.0},
            gpu_allocate=GpuAllocateOptions(
                device_list_strategy=tuple(v["device_list_strategy"]),
                dev_root=v["dev_root"],
                cdi_vendor=v["cdi_vendor"],
                cdi_class=v["cdi_class"],
            ),
            nic_pools=_nic_pools(settings),
            nic_resource_name=v["nic_resource_name"],
            nic_policy=v["nic_allocation_policy"],
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def resource_reloader(settings: Settings) -> Callable[[], ResourceOptions]:
    """Re-read the config file and rebuild the resource options (flags and env still win).

    Raises ValueError with the same file/field/fix message start-up would give.
    """

    def reload() -> ResourceOptions:
        try:
            fresh = resolve(settings.ctx, settings.params)
            options = resource_options(fresh)
        except click.UsageError as e:
            raise ValueError(e.format_message()) from None
        stale = sorted(k for k in _SOURCE_OPTIONS if fresh.values.get(k) != settings.values.get(k))
        if stale:
            log.warning("config change needs a restart for some options; applied the rest",
                        extra={"options": ", ".join(stale)})
        return options

    return reload


#: Options that decide how devices are discovered: they take effect at the next start only.
_SOURCE_OPTIONS = ("simulate", "sysfs_root", "dev_root", "proc_root", "fail_on_init_error", "fake_nvml",
                   "nic_link_health")


def make_source(settings: Settings) -> TopologySource:
    """The simulated node when --simulate is given, else real hardware (NVML + sysfs)."""
    v = settings.values
    if v.get("simulate"):
        from ..sources.simulated.source import SimulatedSource

        return SimulatedSource(v["simulate"])
    from ..sources.hardware import hardware_source_from_options

    nvml = None
    if v.get("fake_nvml"):
        from ..sources.fake_nvml import FakeNvml
        from ..sources.simulated import load_simulated

        try:
            node = load_simulated(v["fake_nvml"])
        except TopologyError as e:
            raise click.UsageError(f"--fake-nvml: {e}") from None
        nvml = FakeNvml(node.without(d.name for d in node.nics))
    return hardware_source_from_options(
        sysfs_root=v["sysfs_root"], dev_root=v["dev_root"], proc_root=v["proc_root"],
        fail_on_init_error=v["fail_on_init_error"], gpu_health=settings.config.gpu_health,
        nic_link_health=v["nic_link_health"], nvml=nvml,
    )


def startup_error(e: TopologyError) -> click.ClickException:
    """Exit 1 when the hardware could not be read (a runtime failure), 2 for a bad topology file."""
    from ..sources.nvml_gpus import DiscoveryError

    if isinstance(e, DiscoveryError):
        return click.ClickException(str(e))
    return click.UsageError(str(e))


def load_now(source: TopologySource):
    """Discover once for the one-shot commands."""
    try:
        return source.load()
    except TopologyError as e:
        raise startup_error(e) from None


def pass_settings(fn: Callable) -> Callable:
    """Decorator: resolve the common options into `settings` before the command body runs."""

    @functools.wraps(fn)
    def wrapper(**params: Any) -> Any:
        ctx = click.get_current_context()
        common = {k: params.pop(k) for k in list(params) if k in _COMMON_NAMES}
        return fn(resolve(ctx, common), **params)

    return wrapper


_COMMON_NAMES = {
    "config_path", "simulate", "device_id_strategy", "gpu_resource_name", "allocation_policy", "time_budget_ms",
    "nic_resource_name", "nic_allocation_policy", "device_list_strategy", "cdi_vendor", "cdi_class",
    "sysfs_root", "dev_root", "proc_root", "fail_on_init_error", "nic_link_health", "fake_nvml",
}
