"""Our CDI spec files on disk: written atomically, kept in step with what is served, removed at the end.

Why a package of its own, outside `plugin/model/`: the model (`plugin.model.cdi`) says what a spec
holds and is pure; this package is the file side — temporary files, renames, fsyncs, the spec
directory's errors and their fixes — used by the device plugin's daemon (`sync.SpecSync`) and the
DRA driver's per-claim specs (`writer.CdiSpecWriter`).
"""

from .sync import SpecSync
from .writer import CdiSpecWriter, CdiWriteError, SyncResult, fix_for

__all__ = ["CdiSpecWriter", "CdiWriteError", "SpecSync", "SyncResult", "fix_for"]
