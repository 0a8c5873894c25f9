"""The kubelet's device-plugin directory, claimed by one daemon at a time.

Why a claim: our sockets reach their final path by `rename()` (socket_file.py),
which replaces whatever is there. A second daemon on the same directory (a
stray `serve` beside the DaemonSet's pod, two releases of the chart) therefore
took over the first one's sockets without a word, and each re-registration
took them back. The claim is an exclusive `flock` on the directory itself: the
kubelet deletes the files in it when it restarts, but never the directory, so
a lock file inside it would be lost with them. A flock is released by the
kernel when its holder dies, so a killed daemon never blocks the next one.

Why we no longer create a missing kubelet root: the kubelet makes its
`device-plugins` directory when it starts. On a machine without a kubelet,
`serve` used to create `/var/lib/kubelet/device-plugins` and wait forever for
a `kubelet.sock` that would never come. The directory itself is still created
when its parent exists (a kubelet that is installed but not yet started).
"""

from __future__ import annotations

import fcntl
import os

from ..errors import RuntimeFailure

__all__ = ["PluginDirClaim", "claim_plugin_dir"]


class PluginDirClaim:
    """An exclusive claim on a plugin directory; `release()` (or process exit) gives it up."""

    def __init__(self, path: str, fd: int):
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the flock


def claim_plugin_dir(path: str, mode: int = 0o750) -> PluginDirClaim:
    """Make `path` if its parent exists, then claim it; `RuntimeFailure` (exit 1, with the fix) when
    the parent is missing or another daemon holds the claim."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(path):
        if not os.path.isdir(parent):
            raise RuntimeFailure(f"{parent} does not exist, so no kubelet runs here (fix: run on a node with the "
                                 "kubelet, or point --kubelet-root-dir / --device-plugin-path at its directory)")
        os.makedirs(path, mode=mode, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RuntimeFailure(f"another topo-device-plugin daemon already serves {path} (fix: stop it first; two "
                             "daemons on one directory would take over each other's sockets)") from None
    except BaseException:
        os.close(fd)
        raise
    return PluginDirClaim(path, fd)
