"""Keeping our CDI spec directory in step with the resources the daemon serves.

Why a class of its own: the daemon makes one call at start, one per topology
or config change and one at shutdown; what to write, when the directory may
be touched at all, and what a failure means belong here.

- Specs come from the resources (`Resource.cdi_spec`, built with them), so
  the file a runtime reads and the names Allocate returns always agree.
- The directory is only touched once a resource has a spec (a CDI device
  list strategy with `--cdi-specs write`), or to remove what this process
  wrote: a daemon with `envvar` never creates or cleans /var/run/cdi.
- At start a failure stops the daemon (exit 1 with the fix the cause calls
  for: a container given CDI names without a spec cannot be created); later
  it is logged and the last written specs stay; at shutdown it is a warning
  (the exit stays 0).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from ..errors import RuntimeFailure
from ..model.cdi.spec import CdiSpec
from .writer import CdiSpecWriter, CdiWriteError

log = logging.getLogger(__name__)


class CdiSyncError(RuntimeFailure):
    """Our CDI specs cannot be written at start (exit 1, with the fix)."""


class WithSpec(Protocol):
    """A served resource as far as its spec goes (`plugin.model.resource.Resource` is one; a protocol: the
    resource layer imports this package, never the other way round)."""

    @property
    def cdi_spec(self) -> CdiSpec | None: ...


class SpecSync:
    def __init__(self, directory: str | None):
        self.writer = CdiSpecWriter(directory) if directory else None
        #: Files of ours are in the directory (written by this process).
        self.active = False

    def sync(self, resources: Iterable[WithSpec], at_start: bool = True) -> None:
        """Write the specs of `resources` and remove our others (blocking: run it in a thread)."""
        if self.writer is None:
            return
        specs = [r.cdi_spec for r in resources if r.cdi_spec is not None]
        if not specs and not self.active:
            return
        try:
            result = self.writer.sync(specs)
        except CdiWriteError as e:
            if at_start:
                raise CdiSyncError(f"{e} (fix: {e.fix})") from None
            log.error("CDI specs not updated; containers may get stale devices",
                      extra={"reason": str(e), "fix": e.fix})
            return
        self.active = bool(specs)
        if result.written or result.removed:
            log.info("CDI specs in step", extra={"directory": self.writer.directory,
                                                 "written": ", ".join(result.written) or "-",
                                                 "removed": ", ".join(result.removed) or "-"})

    def remove_all(self) -> None:
        """Shutdown: remove the specs this process wrote. A failure is a warning, never a failed exit:
        the service is already stopped, and the next start replaces or removes what is left."""
        if self.writer is None or not self.active:
            return
        try:
            self.writer.remove_all()
            self.active = False
        except CdiWriteError as e:
            log.warning("CDI specs not removed at shutdown", extra={"reason": str(e), "fix": e.fix})
