"""Writing our CDI spec files: atomically, replaced when devices change, removed on shutdown.

Why atomic: runtimes (containerd's CDI cache watches the spec directories
with inotify) may read a spec at any moment; they must see the old file or
the new one, never half of one. So each file is written to a temporary name
in the same directory (one a runtime skips: it does not end in .json or
.yaml), flushed and fsync'ed, renamed over the target, and the directory is
fsync'ed so the rename survives a crash.

Which files are ours: `<vendor>-<class>.json` with a vendor starting with our
prefix (`topo-dp.`), the CDI library's own naming. `sync` writes the given
specs and removes our other files, also those a crashed predecessor left;
files of anyone else in the directory are never touched.

The daemon drives it (wiring phase): `sync(specs)` after it built the
resources and before it advertises them (a kubelet may allocate as soon as
a device is listed), again on every topology or config change, and
`remove_all()` on shutdown.
"""

from __future__ import annotations

import errno
import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass

from ..model.cdi.spec import DEFAULT_SPEC_DIR, VENDOR_PREFIX, CdiSpec

log = logging.getLogger(__name__)


class CdiWriteError(OSError):
    """A spec file could not be written, listed or removed; the message names the path and the cause.

    `fix` says what to change on the node, chosen by the cause: the directory replaced by a file,
    a read-only or unwritable mount, a full disk. Callers add it to their own message (a start-up
    error, a claim's error, a shutdown warning).
    """

    def __init__(self, message: str, directory: str, cause: OSError | None = None):
        super().__init__(message)
        self.directory = directory
        self.fix = fix_for(cause, directory)


def fix_for(cause: OSError | None, directory: str) -> str:
    """What to change on the node for `cause`, an error met in the spec directory `directory`."""
    code = cause.errno if cause is not None else None
    if code in (errno.ENOTDIR, errno.EEXIST):
        return (f"{_not_a_directory(directory)} is not a directory: remove or rename it (the runtime reads CDI "
                "specs from a directory), or point --cdi-spec-dir at the runtime's spec directory")
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"mount the host's {directory} into the container writable, or point --cdi-spec-dir at a "
                "directory the runtime reads")
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"free space on the filesystem that holds {directory}"
    return f"check {directory} on the node: it must be a writable directory the container runtime reads"


def _not_a_directory(directory: str) -> str:
    """`directory` or the nearest of its parents that exists and is not a directory (the one to fix)."""
    path = os.path.abspath(directory)
    while path != os.path.dirname(path):
        if os.path.lexists(path) and not os.path.isdir(path):
            return path
        path = os.path.dirname(path)
    return directory


def _cause(e: OSError) -> str:
    return e.strerror or str(e)


@dataclass(frozen=True)
class SyncResult:
    written: tuple[str, ...]
    unchanged: tuple[str, ...]
    removed: tuple[str, ...]


class CdiSpecWriter:
    def __init__(self, directory: str = DEFAULT_SPEC_DIR, vendor_prefix: str = VENDOR_PREFIX):
        self.directory = directory
        self.prefix = vendor_prefix + "."

    def _ours(self, name: str) -> bool:
        if name.startswith("." + self.prefix) and name.endswith(".tmp"):
            return True  # a temporary file a crashed writer left
        return name.startswith(self.prefix) and name.endswith((".json", ".yaml"))

    def owned_files(self) -> list[str]:
        """Our spec files (and stale temporary files) in the directory, sorted."""
        try:
            return sorted(n for n in os.listdir(self.directory) if self._ours(n))
        except FileNotFoundError:
            return []
        except OSError as e:
            raise CdiWriteError(f"cannot list CDI specs in {self.directory}: {_cause(e)}", self.directory, e) from e

    def write(self, spec: CdiSpec, file_name: str | None = None) -> bool:
        """Write `spec` atomically; False (and nothing touched) when the file already holds it.

        `file_name`: for several files of one kind (the DRA side's one spec per claim, the CDI
        library's "transient" specs); it must be ours too. Default: `spec.file_name`.
        """
        file_name = file_name or spec.file_name
        if not file_name.startswith(self.prefix) or not file_name.endswith((".json", ".yaml")) or "/" in file_name:
            raise ValueError(f"spec file {file_name!r} is not ours (its name must start with {self.prefix!r} and "
                             "end in .json)")
        text = spec.to_json()
        target = os.path.join(self.directory, file_name)
        try:
            with open(target, encoding="utf-8") as f:
                if f.read() == text:
                    return False
        except (FileNotFoundError, UnicodeDecodeError):
            pass
        except OSError as e:
            raise CdiWriteError(f"cannot read CDI spec {target}: {_cause(e)}", self.directory, e) from e
        try:
            os.makedirs(self.directory, mode=0o755, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{file_name}.", suffix=".tmp", dir=self.directory)
        except OSError as e:
            raise CdiWriteError(f"cannot create a CDI spec in {self.directory}: {_cause(e)}", self.directory,
                                e) from e
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fchmod(f.fileno(), 0o644)
                os.fsync(f.fileno())
            os.replace(tmp, target)
            self._sync_dir()
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise CdiWriteError(f"cannot write CDI spec {target}: {_cause(e)}", self.directory, e) from e
        log.info("wrote CDI spec", extra={"path": target, "kind": spec.kind, "devices": len(spec.devices)})
        return True

    def sync(self, specs: Iterable[CdiSpec]) -> SyncResult:
        """Make our files in the directory exactly `specs`: write new or changed ones, remove the rest."""
        specs = list(specs)
        names = [s.file_name for s in specs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"two resources map to the same CDI spec file: {', '.join(dup)}")
        written: list[str] = []
        unchanged: list[str] = []
        for s in specs:
            (written if self.write(s) else unchanged).append(s.file_name)
        keep = set(names)
        removed = [n for n in self.owned_files() if n not in keep]
        for n in removed:
            self._remove(n)
        return SyncResult(tuple(written), tuple(unchanged), tuple(removed))

    def remove_all(self) -> list[str]:
        """Remove every file of ours (shutdown); returns their names."""
        files = self.owned_files()
        for n in files:
            self._remove(n)
        return files

    def remove(self, file_name: str) -> bool:
        """Remove one file of ours; False when it was not there (removing is idempotent)."""
        if not self._ours(file_name) or "/" in file_name:
            raise ValueError(f"spec file {file_name!r} is not ours")
        present = os.path.exists(os.path.join(self.directory, file_name))
        self._remove(file_name)
        return present

    def _remove(self, name: str) -> None:
        path = os.path.join(self.directory, name)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as e:
            raise CdiWriteError(f"cannot remove CDI spec {path}: {_cause(e)}", self.directory, e) from e
        try:
            self._sync_dir()
        except OSError as e:
            raise CdiWriteError(f"cannot sync {self.directory} after removing {name}: {_cause(e)}",
                                self.directory, e) from e
        log.info("removed CDI spec", extra={"path": path})

    def _sync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
