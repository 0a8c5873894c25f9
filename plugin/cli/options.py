"""The declared options (`plugin.config.flags`) as click options, and their one precedence step.

Why one place: every option can come from a flag, from `TOPO_DP_<OPTION>`
or from the config file's `flags:`; the order (flag > env > file > default)
is the same for every option and every command, serve-only ones included,
and a config reload resolves again through the same step. Bad values raise
`InputError`s (exit 2, see `plugin.cli`).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import click
from click.core import ParameterSource

from ..config import Config, ConfigError, load_config
from ..config.flags import BY_DEST, KIND_FIX, Option, options_for, restart_needed
from ..errors import OptionError
from ..model.cdi.toolkit import DEFAULT_TOOLKIT_DIRS
from ..model.gpu_allocate import GpuAllocateOptions
from ..model.imex import ChannelNode, ImexChannelsError, device_plugin_channels, expected_major
from ..observability.address import parse_address
from ..observability.logging_setup import release_early_logs
from ..model.nic_pools import NicPool, parse_pools
from ..model.resource_names import check_resource_name
from ..model.resources import ResourceOptions
from ..model.serving_modes import check_modes

log = logging.getLogger(__name__)

#: Commands that set up their own logging from their options (`--log-level`, `--log-format`); the
#: others, once their options are read, write warnings as text lines with their fields.
LOGGING_COMMANDS = frozenset(o for o in BY_DEST["log_level"].commands)


class EnvOption(click.Option):
    """An option whose bad value, when it came from TOPO_DP_<OPTION>, is reported with the variable's name.

    The help states the environment rule once instead of on every option (`help.py`), so the error must
    say where a value nobody typed came from.
    """

    def get_error_hint(self, ctx: click.Context | None) -> str:
        hint = super().get_error_hint(ctx)
        if ctx is not None and isinstance(self.envvar, str) and \
                ctx.get_parameter_source(self.name or "") is ParameterSource.ENVIRONMENT:
            hint += f" (from the environment variable {self.envvar})"
        return hint


def option(*decls: str, **kw: Any) -> Callable:
    """A command's own click option that also reads TOPO_DP_<OPTION> (for what-if arguments, not settings).

    Every option of every command reads its variable, so "every option reads TOPO_DP_<OPTION>" holds
    without exceptions; the help states the rule once (`help.py`) instead of on each option.
    """
    name = re.sub(r"^-+", "", [d for d in decls if d.startswith("--")][0]).split("/")[0].replace("-", "_")
    kw.setdefault("envvar", "TOPO_DP_" + name.upper())
    kw.setdefault("show_default", True)
    return click.option(*decls, cls=EnvOption, **kw)


class _Address(click.ParamType):
    """`HOST:PORT`, checked when the flag is read: a bad one is a usage error (exit 2), never a traceback."""

    name = "HOST:PORT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            parse_address(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)
        return value


class _AbsolutePath(click.ParamType):
    """An absolute path: the same rule as the config file's schema and the chart's (`kind="path"`)."""

    name = "PATH"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not str(value).startswith("/"):
            self.fail(f"{value!r} is not an absolute path (fix: {KIND_FIX['path']})", param, ctx)
        return value


class _ResourceName(click.ParamType):
    """An extended resource name the kubelet accepts, checked when the flag is read (`kind="resource-name"`)."""

    name = "DOMAIN/NAME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            check_resource_name(str(value))
        except OptionError as e:
            self.fail(str(e), param, ctx)
        return value


def _click_type(o: Option) -> Any:
    if o.kind == "address":
        return _Address()
    if o.kind == "path":
        return _AbsolutePath()
    if o.kind == "resource-name":
        return _ResourceName()
    if o.kind == "choice":
        return click.Choice(list(o.choices))
    if o.kind == "number":
        return click.FloatRange(min=0, min_open=not o.zero_ok, max=o.maximum)
    if o.kind == "text" and o.name == "config":
        return click.Path(dir_okay=False)
    return None


def click_option(o: Option, command: str) -> Callable:
    """The click option of a declaration, as `command` takes it."""
    decls = [f"{o.flag}/--no-{o.flag[2:]}" if o.kind == "bool" else o.flag]
    if o.param:
        decls.append(o.param)
    default = o.default_for(command)
    kw: dict[str, Any] = {"default": default, "help": o.help, "envvar": o.env, "cls": EnvOption}
    if o.default_text:
        kw["show_default"] = o.default_text
    elif default is not None:
        kw["show_default"] = True
    if o.metavar:
        kw["metavar"] = o.metavar
    ctype = _click_type(o)
    if ctype is not None:
        kw["type"] = ctype
    return click.option(*decls, **kw)


@dataclass
class Settings:
    """The resolved option values of one command plus the parsed config."""

    values: dict[str, Any]
    config: Config
    command: str
    #: What was given on the command line / environment, to resolve again when the config file changes.
    params: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, ParameterSource | None] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


def resolve(params: dict[str, Any], sources: dict[str, ParameterSource | None], command: str) -> Settings:
    """Apply the config file under flags and env. Raises `ConfigError` for a bad file."""
    config = load_config(params.get("config_path"))
    values = dict(params)
    for o in options_for(command):
        if o.key in config.flags and sources.get(o.dest) in (ParameterSource.DEFAULT, None):
            values[o.dest] = config.flags[o.key]
    for o in options_for(command):
        if o.kind in ("choice-list", "list") and isinstance(values.get(o.dest), str):
            values[o.dest] = [s.strip() for s in values[o.dest].split(",") if s.strip()]
        if o.kind == "address" and o.key in config.flags and values.get(o.dest) == config.flags[o.key]:
            try:
                parse_address(str(values[o.dest]))
            except ValueError as e:
                raise ConfigError(f"{config.path}: field flags.{o.key}: {e} (fix: see docs/configuration.md)") from None
    return Settings(values, config, command, dict(params), dict(sources))


def with_settings(command: str) -> Callable:
    """Decorator: add `command`'s declared options and pass them, resolved, as `settings`."""

    def decorate(fn: Callable) -> Callable:
        declared = options_for(command)

        @functools.wraps(fn)
        def wrapper(**params: Any) -> Any:
            ctx = click.get_current_context()
            mine = {o.dest: params.pop(o.dest) for o in declared}
            sources = {name: ctx.get_parameter_source(name) for name in mine}
            settings = resolve(mine, sources, command)
            if command not in LOGGING_COMMANDS:
                release_early_logs()  # offline commands: warnings with their fields, as they happen
            return fn(settings, **params)

        for o in reversed(declared):
            wrapper = click_option(o, command)(wrapper)
        return wrapper

    return decorate


def nic_pools(settings: Settings) -> tuple[NicPool, ...]:
    """The NIC pools of the config file (`nics.resourceList`); none: the default pool takes every NIC."""
    if not settings.config.nic_resource_list:
        return ()
    return parse_pools(settings.config.nic_resource_list, settings.config.path or "<config>",
                       dev_root=settings.values["dev_root"])


def imex_channels(settings: Settings) -> tuple[ChannelNode, ...]:
    """NVIDIA's `imex:` of the config file as the channels every GPU container gets (plugin/model/imex.py):
    each must be a character device under --dev-root with the channels' major (/proc/devices, or a simulated
    node's `imexChannelsMajor`); a missing one fails the start only with `imex.required`."""
    c = settings.config
    if not c.imex_channel_ids:
        return ()
    v = settings.values
    where = f"{c.path}: field imex.channelIDs"
    try:
        major = expected_major(v.get("proc_root") or "/proc", v.get("simulate") or None)
        return device_plugin_channels(c.imex_channel_ids, c.imex_required, v.get("dev_root") or "/dev", major, where)
    except ImexChannelsError as e:
        raise ConfigError(str(e)) from None


def resource_options(settings: Settings) -> ResourceOptions:
    """What the resource layer needs; raises `InputError`s (`OptionError`, `NicPoolError`) for bad values."""
    v = settings.values
    options = ResourceOptions(
        device_id_strategy=v["device_id_strategy"],
        gpu_resource_name=v["gpu_resource_name"],
        gpu_policy=v["allocation_policy"],
        gpu_policy_options={"time_budget_s": float(v["time_budget_ms"]) / 1000.0},
        gpu_allocate=GpuAllocateOptions(
            device_list_strategy=tuple(v["device_list_strategy"]),
            dev_root=v["dev_root"],
            cdi_specs=v["cdi_specs"],
            cdi_vendor=v["cdi_vendor"],
            cdi_class=v["cdi_class"],
            cdi_annotation_prefix=v["cdi_annotation_prefix"],
            pass_device_specs=v["pass_device_specs"],
            toolkit_dirs=tuple(v.get("toolkit_cdi_dirs") or DEFAULT_TOOLKIT_DIRS),
            imex_channels=imex_channels(settings),
        ),
        nic_pools=nic_pools(settings),
        nic_resource_name=v["nic_resource_name"],
        nic_id_strategy=v["nic_id_strategy"],
        nic_policy=v["nic_allocation_policy"],
        dev_root=v["dev_root"],
        pairing_window_s=float(v["pairing_window_ms"]) / 1000.0,
        nccl_env=bool(v["nccl_env"]),
        mig_strategy=v["mig_strategy"],
        time_slicing=settings.config.time_slicing,
        mps_root=v["mps_root"],
    )
    if not options.gpu_allocate.pass_device_specs and not options.gpu_allocate.uses_cdi:
        # NVIDIA's default is false with envvar (its runtime hook makes the nodes); here nodes still come from us.
        log.warning("passDeviceSpecs false has no effect without a CDI device list strategy: device nodes are "
                    "still passed", extra={"device_list_strategy": ",".join(options.gpu_allocate.device_list_strategy)})
    dra = list(v.get("dra_resources") or [])
    if (v.get("dra_mig") or "none") != "none" and options.gpu_resource_name not in dra:
        raise OptionError(f"{option_source(settings, 'dra_mig')}: MIG through DRA needs the GPU resource "
                          f"{options.gpu_resource_name} in draResources (fix: add it, or set draMig none)")
    if not dra:
        return options
    return replace(options, dra_resources=check_modes(options, dra, option_source(settings, "dra_resources")))


def option_source(settings: Settings, dest: str) -> str:
    """Where an option's value came from, as an error message names it: flag, variable or file and field."""
    o = BY_DEST[dest]
    source = settings.sources.get(dest)
    if source is ParameterSource.COMMANDLINE:
        return o.flag
    if source is ParameterSource.ENVIRONMENT:
        return o.env
    if o.key in settings.config.flags:
        return f"{settings.config.path}: field flags.{o.key}"
    return o.flag


def resource_reloader(settings: Settings) -> Callable[[], ResourceOptions]:
    """Re-read the config file and rebuild the resource options (flags and env still win).

    Raises the same `InputError` start-up would give. Changed options that
    only a restart applies (`Option.live` false) are logged and keep their
    running value; the rest is returned to be applied.
    """

    def reload() -> ResourceOptions:
        fresh = resolve(settings.params, settings.sources, settings.command)
        stale = restart_needed(settings.values, fresh.values)
        # Restart options keep their running value in the rebuilt resources too: `--dev-root` names the
        # device nodes discovery found, and which side serves a resource never changes, not even briefly.
        fresh.values.update({o.dest: settings.values[o.dest] for o in options_for(settings.command)
                             if not o.live and o.dest in settings.values})
        options = resource_options(fresh)
        if fresh.config.gpu_health != settings.config.gpu_health:
            stale.append("gpus.health")
        if stale:
            log.warning("config change needs a restart for some options; applied the rest",
                        extra={"options": ", ".join(stale)})
        return options

    return reload


def _given(settings: Settings, dest: str) -> bool:
    """Whether the user set `dest` (flag, variable or config file), not just left its default."""
    source = settings.sources.get(dest)
    return (source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
            or BY_DEST[dest].key in settings.config.flags)


def check_simulate(settings: Settings) -> None:
    """`--simulate` says what it reads: an empty value is a mistake, not a request for real hardware, and
    the real-hardware roots given beside it would be ignored, so both stop start-up with the fix."""
    v = settings.values
    if v.get("simulate") == "" and _given(settings, "simulate"):
        raise OptionError(f"{option_source(settings, 'simulate')} is empty (fix: give a built-in name, a YAML node "
                          "file or `nvidia-smi topo -m` text, or leave it out to serve the real hardware)")
    if not v.get("simulate"):
        return
    for dest, what in (("sysfs_root", "sysfs"), ("proc_root", "procfs")):
        if _given(settings, dest):
            raise OptionError(f"{option_source(settings, dest)} has no effect with --simulate: a simulated node "
                              f"reads no {what} (fix: drop {BY_DEST[dest].flag}, or drop --simulate to discover "
                              "the real hardware under it)")
