"""Network namespaces by path: opening one, telling whether it is still the same, and a socket inside it.

Why our own small helper and not pyroute2's `netns=` argument: pyroute2 opens a
namespace by name under /var/run/netns, creates a missing one by default
(O_CREAT: a dead pod's path would be brought back as an empty namespace) and
forks a child process to make the socket. Container runtimes hand us a path
(/var/run/netns/cni-...), and forking a process that runs gRPC and asyncio
threads is asking for trouble. A netlink socket stays bound to the namespace it
was created in, so creating it in a short-lived thread that has entered the
namespace (setns(2) changes only the calling thread's network namespace) gives
a socket to configure the pod's namespace with while every other thread stays
in the host's.

Capabilities: setns(2) into a network namespace needs CAP_SYS_ADMIN (in the
namespace's owning user namespace as well as ours); moving and configuring links
needs CAP_NET_ADMIN in both the host's and the pod's namespace.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import threading

CLONE_NEWNET = 0x40000000
NETLINK_ROUTE = 0

_libc = ctypes.CDLL(None, use_errno=True)


def open_netns(path: str) -> int:
    """An O_RDONLY descriptor of the namespace file at `path` (caller closes). Never creates one.

    Raises FileNotFoundError when the namespace is gone. Do not keep it open: an open descriptor keeps a
    namespace alive, and with it any device inside, after its pod has died.
    """
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def host_netns_fd() -> int:
    """A descriptor of this process's own network namespace: the host's, where NICs come from."""
    return os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)


def netns_id(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the namespace behind `path`, or None when the path is gone or not a namespace."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def is_same_netns(path: str, ident: tuple[int, int]) -> bool:
    """Whether `path` still names the namespace recorded as `ident` ((0, 0): not recorded, any is taken)."""
    now = netns_id(path)
    if now is None:
        return False
    return ident == (0, 0) or now == ident


def socket_in(ns_fd: int, proto: int = NETLINK_ROUTE) -> socket.socket:
    """A netlink socket of protocol `proto` created inside the namespace `ns_fd` (see the module doc)."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            if _libc.setns(ns_fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into the network namespace: {os.strerror(err)}"
                              + (" (needs CAP_SYS_ADMIN)" if err == errno.EPERM else ""))
            made.append(socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, proto))
        except BaseException as e:  # noqa: BLE001 (handed to the caller's thread)
            failed.append(e)

    # A fresh thread, never one of a pool: it ends inside the pod's namespace and nobody reuses it.
    t = threading.Thread(target=run, name="netns-socket", daemon=True)
    t.start()
    t.join()
    if failed:
        raise failed[0]
    return made[0]
