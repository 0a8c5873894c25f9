"""The error for unusable topology input (a simulated-node file, `nvidia-smi topo -m` text).

Why a dedicated type: start-up must stop with a message that names the file,
the place (line, field, token) and the fix; it is an `InputError`, so the CLI
exits 2 and live reloads log it and keep the last good topology. Failures of
the hardware itself (NVML missing) are `RuntimeFailure`s, not this.
"""

from __future__ import annotations

from ..errors import InputError


class TopologyError(InputError):
    """A topology source that cannot be used; `str()` is the whole user-facing message."""

    def __init__(self, source: str, message: str, line: int | None = None, fix: str | None = None):
        self.source = source
        self.line = line
        self.detail = message
        self.fix = fix
        where = f"{source}:{line}" if line is not None else source
        text = f"{where}: {message}"
        if fix:
            text += f" (fix: {fix})"
        super().__init__(text)
