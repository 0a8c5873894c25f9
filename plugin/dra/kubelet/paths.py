"""Where the DRA driver's sockets and files live under the kubelet's root directory.

Layout (kubelet root `/var/lib/kubelet` by default):

    plugins_registry/<driver>-<instance>-reg.sock   registration socket (plugin watcher)
    plugins/<driver>/dra-<instance>.sock            the DRA gRPC service (PluginInfo.endpoint)
    plugins/<driver>/checkpoint.json                prepared claims (shared by all instances)
    plugins/<driver>/mig-instances.json             MIG instances made for claims (dynamic MIG)
    plugins/<driver>/serialize.lock                 flock taken around every prepare/unprepare
    plugins/<driver>/netattach.json                 NICs attached to pods (--netdev-attach auto)

Why one socket pair per *instance* (the pod UID in a DaemonSet, else a random
ID per process): during a rolling update with `maxSurge` the old and the new
pod run at once. The kubelet's plugin watcher (pkg/kubelet/pluginmanager,
README "Seamless Upgrade") registers every registration socket it sees, keeps
all instances of a driver and uses the newest connected one; it deregisters
an instance when *its* socket disappears. With a shared socket name the new
pod would unlink the old pod's live socket (the kubelet then deregisters the
driver) and the old pod could not be fallen back to. The kubelet also refuses
a second registration of an endpoint already registered, so the service
socket is per instance too.

A new instance removes only sockets of its own driver that nobody listens on
any more (connect() is refused): sockets of a live older instance are never
touched, and a crashed instance's sockets do not pile up. Anything else found
where a directory or one of this instance's sockets goes (a file, a
directory) is never removed: start-up stops before serving anything, with
`DraPathError` naming the path and the fix (exit 1).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import stat
import uuid
from dataclasses import dataclass

from ...errors import RuntimeFailure

#: Longest path a unix socket may have on Linux (sun_path is 108 bytes with the NUL).
UNIX_PATH_MAX = 107
_INSTANCE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class DraPathError(RuntimeFailure):
    """Something that is not ours sits where the driver's directories or sockets go (exit 1, with the fix)."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a file" if stat.S_ISREG(mode) else "something other than a socket"


def new_instance_id() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True)
class DraPaths:
    kubelet_root: str
    driver: str
    instance: str

    def __post_init__(self) -> None:
        if not _INSTANCE_RE.match(self.instance):
            raise ValueError(f"instance ID {self.instance!r}: use letters, digits, '.', '_' or '-' (a pod UID)")

    @property
    def registry_dir(self) -> str:
        return os.path.join(self.kubelet_root, "plugins_registry")

    @property
    def plugin_dir(self) -> str:
        return os.path.join(self.kubelet_root, "plugins", self.driver)

    @property
    def registration_socket(self) -> str:
        """`<driver>-<instance>-reg.sock`, shortened to a hash of the instance when the path is too long."""
        for tag in (self.instance, hashlib.sha256(self.instance.encode()).hexdigest()[:16]):
            path = os.path.join(self.registry_dir, f"{self.driver}-{tag}-reg.sock")
            if len(path) <= UNIX_PATH_MAX:
                return path
        raise ValueError(f"kubelet root {self.kubelet_root!r} is too long for a unix socket path")

    @property
    def service_socket(self) -> str:
        for tag in (self.instance, hashlib.sha256(self.instance.encode()).hexdigest()[:16]):
            path = os.path.join(self.plugin_dir, f"dra-{tag}.sock")
            if len(path) <= UNIX_PATH_MAX:
                return path
        raise ValueError(f"kubelet root {self.kubelet_root!r} is too long for a unix socket path")

    @property
    def checkpoint(self) -> str:
        return os.path.join(self.plugin_dir, "checkpoint.json")

    @property
    def lock(self) -> str:
        return os.path.join(self.plugin_dir, "serialize.lock")

    @property
    def mig_book(self) -> str:
        """MIG instances made for claims (dynamic MIG; plugin/dra/mig/prepare.py)."""
        return os.path.join(self.plugin_dir, "mig-instances.json")

    @property
    def netattach_ledger(self) -> str:
        """The NICs attached to pods (plugin/netattach ledger; shared by all instances, like the checkpoint)."""
        return os.path.join(self.plugin_dir, "netattach.json")

    def make_dirs(self) -> None:
        """Create the directories, and check that nothing but a socket sits at this instance's socket paths:
        raises `DraPathError` (before anything is served, so nothing is left to clean up)."""
        for directory, mode in ((self.registry_dir, 0o755), (self.plugin_dir, 0o750)):
            try:
                os.makedirs(directory, mode=mode, exist_ok=True)
            except OSError as e:
                raise DraPathError(f"cannot create the DRA directory {directory}: {e.strerror or e} (fix: make "
                                   f"{directory} a directory the plugin can write: remove a file of that name, or "
                                   "mount the kubelet's root directory writable)") from None
        for path in (self.registration_socket, self.service_socket):
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            if not stat.S_ISSOCK(mode):
                raise DraPathError(f"{path}: {_kind(mode)} sits where the DRA driver's socket goes (fix: remove it; "
                                   "the driver creates its socket there and never removes what is not a socket)")

    def stale_sockets(self) -> list[str]:
        """Sockets of this driver (any instance but ours) that refuse connections."""
        ours = {self.registration_socket, self.service_socket}
        candidates = []
        if os.path.isdir(self.registry_dir):
            candidates += [os.path.join(self.registry_dir, n) for n in os.listdir(self.registry_dir)
                           if n.startswith(f"{self.driver}-") and n.endswith("-reg.sock")]
        if os.path.isdir(self.plugin_dir):
            candidates += [os.path.join(self.plugin_dir, n) for n in os.listdir(self.plugin_dir)
                           if n.startswith("dra-") and n.endswith(".sock")]
        return sorted(p for p in candidates if p not in ours and is_socket(p) and not is_listening(p))

    def remove_stale_sockets(self) -> list[str]:
        removed = []
        for path in self.stale_sockets():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(path)
        return removed


def is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def is_listening(path: str) -> bool:
    """True when a process accepts connections on the unix socket `path`."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect(path)
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # e.g. a full backlog: someone is there; never remove a socket we are unsure about
    finally:
        s.close()
