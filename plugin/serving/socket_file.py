"""Serving a gRPC server on a unix socket that appears at its path already private, in one step.

Why: the device-plugin directory is shared with the kubelet, which deletes
every socket in it when it restarts, and possibly with other local users.
Binding at the final path and fixing the mode afterwards left a window in
which the socket had the umask's mode, could vanish (a traceback and a
started server that was never stopped) or be swapped for a symlink that the
`chmod` then followed. Changing the umask instead is process-wide, so other
threads' files got the wrong mode while it was held.

So: bind inside a fresh private directory (mode 0700, made by `mkdtemp` in
the plugin directory, hence on the same filesystem), set the socket's mode
there where nobody else can reach it, start serving, then `rename()` it into
place. `rename` is atomic, replaces a stale socket or a planted symlink
without following it, and fails on a directory. gRPC unlinks the path it
bound when the server stops: after the rename that is the temporary name,
which is gone, so gRPC never removes a socket at the final path that may no
longer be ours; the caller removes it only after checking its identity.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time

import grpc

from .registration import SocketIdentity, socket_identity

_TMP_PREFIX = ".topo-bind-"


async def serve_at(server: grpc.aio.Server, path: str, mode: int = 0o600) -> SocketIdentity | None:
    """Bind `server` to the unix socket `path` with `mode`, start it, and move the socket into place.

    Returns the identity of the socket now at `path`, or None when something
    replaced it between the rename and the check (the caller treats it as not
    ours and serves again). On any failure the server is stopped and the
    exception (OSError, or RuntimeError from gRPC's bind) is raised.
    """
    tmpdir = tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=os.path.dirname(path) or ".")
    tmp = os.path.join(tmpdir, "s")  # short: unix socket paths are limited to 108 bytes
    try:
        try:
            server.add_insecure_port(f"unix:{tmp}")
            st = os.lstat(tmp)
            if not stat.S_ISSOCK(st.st_mode):
                raise OSError(f"{tmp} is not the socket we bound")
            os.chmod(tmp, mode)  # in our 0700 directory: nobody can have swapped it for a symlink
            await server.start()
            os.rename(tmp, path)
        except BaseException:
            await server.stop(0)
            raise
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    ident = socket_identity(path)
    # rename() changes the ctime, so compare (device, inode) with what we bound.
    if ident is None or ident[:2] != (st.st_dev, st.st_ino):
        return None
    return ident


def prune_stale_bind_dirs(directory: str, older_than_s: float = 60.0) -> list[str]:
    """Remove our temporary bind directories that a killed process left behind; returns their names.

    Why the age: a bind lasts milliseconds, so a directory older than a minute
    belongs to no live bind (a daemon killed mid-bind, e.g. by SIGKILL), while a
    younger one may be a bind in progress that must not be pulled from under it.
    """
    removed = []
    now = time.time()
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(directory):
            if not entry.name.startswith(_TMP_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(FileNotFoundError):
                if now - entry.stat(follow_symlinks=False).st_mtime < older_than_s:
                    continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed


def remove_if_ours(path: str, identity: SocketIdentity | None) -> bool:
    """Unlink `path` only when it is still the socket we created (never a newer one of someone else)."""
    if identity is None or socket_identity(path) != identity:
        return False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return True
