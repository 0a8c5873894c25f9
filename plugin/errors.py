"""The program's errors, by kind: what the user must fix, what the environment lacks, and bugs.

Why kinds and not `ValueError`: the kind decides what happens next. Bad input
(a flag, a config file, a node file) stops start-up with exit 2 and a message
that names the file, the field and the fix, and on a live edit is logged
while the last good state stays in service. A runtime failure (no NVML, no
kubelet) stops start-up with exit 1 and the fix. Anything else is a bug: it
is logged with its traceback and never reported as "your file is wrong".
`plugin.cli` maps the kinds to exit codes in one place.
"""

from __future__ import annotations


class TopoDevicePluginError(Exception):
    """Base of the errors this program raises on purpose; `str()` is the whole user-facing message."""

    exit_code = 1


class InputError(TopoDevicePluginError):
    """A bad flag, environment value, config file or node file: exit 2, the message names what to fix."""

    exit_code = 2


class OptionError(InputError):
    """An option value the daemon cannot use (e.g. an invalid resource name), from any of its sources."""


class RuntimeFailure(TopoDevicePluginError):
    """The environment cannot do what was asked (NVML missing, kubelet unreachable): exit 1 with the fix."""

    exit_code = 1


def clip(text: str, limit: int = 80) -> str:
    """`text` cut to about `limit` characters: error messages must stay small whatever the input holds."""
    return text if len(text) <= limit else text[: limit - 5] + "…" + text[-4:]


def shorten(value: object, limit: int = 80) -> str:
    """`repr(value)`, clipped."""
    return clip(repr(value), limit)
