"""The one error type for unusable topology input.

Why a dedicated type: start-up must stop with a message that names the file,
the place (line, field, token) and the fix, and the CLI maps exactly this type
to exit code 2. Live reloads catch it, log it and keep the last good topology.
"""

from __future__ import annotations


class TopologyError(ValueError):
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
