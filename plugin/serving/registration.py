"""Registering with the kubelet, and noticing when we must do it again.

Why it works this way (see shared/research/kubelet-device-manager.md §2):
- `Register` is synchronous: the kubelet dials our socket and calls
  `GetDevicePluginOptions` before it answers, so we serve first.
- The endpoint is a bare file name: the kubelet joins it to its directory.
- The kubelet never reconnects. When it restarts it deletes every socket in
  the directory and creates `kubelet.sock` again; we watch the directory
  with inotify (watchdog) for both signs and register again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import threading
from collections.abc import Callable

import grpc
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from ..api import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
API_VERSION = "v1beta1"


class RegistrationError(RuntimeError):
    pass


SocketIdentity = tuple[int, int, int]


def socket_identity(path: str) -> SocketIdentity | None:
    """(device, inode, ctime) of a unix socket file, or None when absent or not a socket.

    Why not the inode alone: filesystems reuse a freed inode at once, so a
    kubelet.sock deleted and created again can carry the same inode number.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns) if stat.S_ISSOCK(st.st_mode) else None


async def register(kubelet_socket: str, endpoint: str, resource_name: str, timeout: float | None = None,
                   slow_after: float | None = None) -> None:
    """Call Registration.Register on `kubelet_socket`; raise RegistrationError with the kubelet's reason.

    `timeout` gives up on the call; the daemon passes none. Why: the kubelet
    finishes a Register even when its caller has given up (it dials us back,
    then keeps the client), so a plugin that times out and registers again
    ends up with two registrations and two streams for one resource, and the
    first stream to end disconnects the newer client (kubernetes #121994).
    A call ends when that kubelet answers or dies (its connection closes).
    `slow_after` only logs, once, that the kubelet is slow to answer.
    """
    request = api_pb2.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
    )
    try:
        async with grpc.aio.insecure_channel(f"unix:{kubelet_socket}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)
            call = asyncio.ensure_future(stub.Register(request, timeout=timeout, wait_for_ready=False))
            try:
                if slow_after is not None:
                    done, _ = await asyncio.wait([call], timeout=slow_after)
                    if not done:
                        log.warning("the kubelet has not answered Register yet; still waiting for it rather than "
                                    "registering twice (kubernetes #121994)",
                                    extra={"resource": resource_name, "waited_s": slow_after})
                await call
            finally:
                if not call.done():  # we were cancelled (shutdown): end the RPC
                    call.cancel()
                    with contextlib.suppress(BaseException):
                        await call
    except grpc.aio.AioRpcError as e:
        raise RegistrationError(
            f"Register {resource_name} at {kubelet_socket} failed: {e.code().name}: {e.details()}"
        ) from None


class PluginDirWatcher(FileSystemEventHandler):
    """inotify on the device-plugin directory, forwarding the two events that matter to the loop.

    `on_kubelet_socket()` fires when kubelet.sock appears (created or moved in);
    `on_socket_removed(path)` when any socket file disappears. The callbacks run
    on the asyncio loop; deciding whether an event is stale is the daemon's job.
    """

    def __init__(self, plugin_dir: str, loop: asyncio.AbstractEventLoop,
                 on_kubelet_socket: Callable[[], None], on_socket_removed: Callable[[str], None]):
        self.plugin_dir = os.path.abspath(plugin_dir)
        self._loop = loop
        self._on_kubelet_socket = on_kubelet_socket
        self._on_socket_removed = on_socket_removed
        self._observer: BaseObserver | None = None
        self._lock = threading.Lock()

    def _post(self, fn: Callable, *args: object) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass  # loop closed during shutdown

    def on_created(self, event: FileSystemEvent) -> None:
        if not event.is_directory and os.path.basename(event.src_path) == KUBELET_SOCKET:
            self._post(self._on_kubelet_socket)

    def on_moved(self, event: FileSystemEvent) -> None:
        if os.path.basename(event.dest_path) == KUBELET_SOCKET:
            self._post(self._on_kubelet_socket)
        self._post(self._on_socket_removed, os.fsdecode(event.src_path))
        # Something renamed over a path replaces what was there (e.g. one of our sockets).
        self._post(self._on_socket_removed, os.fsdecode(event.dest_path))

    def on_deleted(self, event: FileSystemEvent) -> None:
        if not event.is_directory:
            self._post(self._on_socket_removed, os.fsdecode(event.src_path))

    def start(self) -> None:
        with self._lock:
            observer = Observer()
            observer.schedule(self, self.plugin_dir, recursive=False)
            observer.daemon = True
            observer.start()
            self._observer = observer

    def stop(self) -> None:
        with self._lock:
            if self._observer is not None:
                self._observer.stop()
                self._observer.join(timeout=5)
                self._observer = None
