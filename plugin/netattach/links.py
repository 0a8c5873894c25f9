"""Moving a NIC's netdev into a pod's network namespace, configuring it there, and bringing it back.

Why each step is written to be repeatable: the NetAttacher records a step before
doing it, and after a crash runs the attachment again from the start. So every
step first looks where the interface is and what it has (found by its hardware
address, which survives moves and renames), and does only what is missing: the
move happens once, an address or route is replaced rather than added twice.

The move and the rename are one request (RTM_NEWLINK with IFLA_NET_NS_FD and
IFLA_IFNAME): the kernel gives the device its pod name as it enters the pod's
namespace, so its host name never has to be free there and no temporary name
is needed; a clash with an existing pod interface is refused up front.
Moving a link closes it and flushes its addresses and routes, both ways; so
detaching removes what we configured by moving the link home, and restores the
name, MTU and admin state it had.

Capabilities: CAP_NET_ADMIN in both namespaces (moving and configuring links),
CAP_SYS_ADMIN to enter the pod's namespace (setns(2), see netns.py).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from . import rdma_netlink
from .netns import host_netns_fd, is_same_netns, open_netns, socket_in
from .spec import AttachError, Attached, DetachError, InterfaceSpec, Outcome

log = logging.getLogger(__name__)

IFF_UP = 0x1
#: The steps of an attachment, in order; `progress` hears each name before the step runs.
STEPS = ("move", "mtu", "up", "addresses", "routes", "rdma")
#: How long detach waits for the kernel to return a device from a namespace that has just died.
SETTLE_S = 3.0

Progress = Callable[[str], None]
P = ParamSpec("P")
R = TypeVar("R")


def blocking(fn: Callable[P, R]) -> Callable[P, R]:
    """Make `fn` callable from any thread. pyroute2's synchronous API runs its own event loop and
    fails in a thread whose loop is running (an async caller that asks for a quick answer, such as
    `max_mtu` in a validation); there the call runs in a short-lived thread, and still blocks."""
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return fn(*args, **kwargs)
        result: list[R] = []
        error: list[BaseException] = []

        def run() -> None:
            try:
                result.append(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 (handed to the caller's thread)
                error.append(e)

        t = threading.Thread(target=run, name=f"netattach-{fn.__name__}", daemon=True)
        t.start()
        t.join()
        if error:
            raise error[0]
        return result[0]
    return wrapper


class InterfaceNotFound(AttachError):
    """The named interface is not in the host's network namespace."""

    def __init__(self, ifname: str):
        super().__init__("find", ifname, "no such interface in the host network namespace")


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    mtu: int
    min_mtu: int
    max_mtu: int
    address: str
    up: bool
    #: The factory address of a physical NIC (IFLA_PERM_ADDRESS; "" for virtual ones): still finds it
    #: if the pod changed its address.
    perm_address: str = ""


def _link(msg) -> Link:
    return Link(index=int(msg["index"]), name=str(msg.get("IFLA_IFNAME")), mtu=int(msg.get("IFLA_MTU") or 0),
                min_mtu=int(msg.get("IFLA_MIN_MTU") or 0), max_mtu=int(msg.get("IFLA_MAX_MTU") or 0),
                address=str(msg.get("IFLA_ADDRESS") or "").lower(), up=bool(msg["flags"] & IFF_UP),
                perm_address=str(msg.get("IFLA_PERM_ADDRESS") or "").lower())


def _why(e: BaseException) -> str:
    if isinstance(e, NetlinkError):
        return f"{os.strerror(e.code)} (errno {e.code}){': ' + str(e.args[1]) if len(e.args) > 1 else ''}"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror} (errno {e.errno})"
    return str(e) or type(e).__name__


def _host() -> IPRoute:
    return IPRoute(groups=0, ext_ack=True)


def _inside(ns_fd: int) -> IPRoute:
    """An IPRoute whose socket lives in the namespace `ns_fd` (created there by a short-lived thread)."""
    sock = socket_in(ns_fd)
    return IPRoute(fileno=sock.detach(), groups=0, ext_ack=True)


def _links(ipr: IPRoute) -> list[Link]:
    return [_link(m) for m in ipr.link("dump")]


def _by_name(ipr: IPRoute, name: str) -> Link | None:
    return next((x for x in _links(ipr) if x.name == name), None)


def _find(ipr: IPRoute, att: Attached, name: str | None = None) -> Link | None:
    """The link of `att`, by its hardware address or its factory one: the one called `name` if there is
    one, else the only one."""
    ours = {att.hw_address, att.perm_address} - {""}
    links = [x for x in _links(ipr) if x.address in ours or x.perm_address in ours]
    if name is not None:
        named = [x for x in links if x.name == name]
        if named:
            return named[0]
    return links[0] if len(links) == 1 else None


@blocking
def exists(host_name: str) -> bool:
    """Whether the host's network namespace has an interface called `host_name`."""
    with _host() as ipr:
        return _by_name(ipr, host_name) is not None


@blocking
def max_mtu(host_name: str) -> int:
    """The largest MTU the interface's driver accepts (IFLA_MAX_MTU; 65535 where the driver sets none)."""
    with _host() as ipr:
        link = _by_name(ipr, host_name)
    if link is None:
        raise InterfaceNotFound(host_name)
    return link.max_mtu or 65535


def rdma_netns_mode() -> str | None:
    """'shared' or 'exclusive': the host's RDMA netns mode; None where the kernel has no RDMA netlink."""
    return rdma_netlink.rdma_netns_mode()


@blocking
def prepare(spec: InterfaceSpec, netns_path: str) -> Attached:
    """Check that `spec` can be attached into `netns_path` and read what undoing it needs; changes nothing.

    Raises AttachError (step "check" or "find") naming the interface and why.
    """
    try:
        spec.validate()
    except ValueError as e:
        raise AttachError("check", spec.host_name, str(e)) from None
    try:
        ns_fd = open_netns(netns_path)
    except OSError as e:
        raise AttachError("check", spec.host_name, f"cannot open the pod network namespace {netns_path}: "
                          f"{_why(e)}") from None
    try:
        st = os.fstat(ns_fd)
        ident = (st.st_dev, st.st_ino)  # of the namespace itself: the path may later name another
        with _host() as host:
            link = _by_name(host, spec.host_name)
            if link is None:
                raise InterfaceNotFound(spec.host_name)
            if spec.mtu is not None and link.max_mtu and spec.mtu > link.max_mtu:
                raise AttachError("check", spec.host_name,
                                  f"MTU {spec.mtu} is above the device's maximum {link.max_mtu}")
            if spec.mtu is not None and spec.mtu < link.min_mtu:
                raise AttachError("check", spec.host_name,
                                  f"MTU {spec.mtu} is below the device's minimum {link.min_mtu}")
            if not link.address:
                raise AttachError("check", spec.host_name, "the device has no hardware address to track it by")
        with _inside(ns_fd) as ns:
            if _by_name(ns, spec.pod_name) is not None:
                raise AttachError("check", spec.host_name,
                                  f"the name {spec.pod_name} is taken in the pod network namespace {netns_path}; "
                                  "choose another interface name")
        rdma_move = False
        if spec.rdma_device and rdma_netns_mode() == "exclusive":
            rdma_move = True
            nl = rdma_netlink.open_rdma()
            with ExitStack() as stack:
                found = nl is not None and stack.enter_context(nl).device_index(spec.rdma_device) is not None
            if not found:
                raise AttachError("check", spec.host_name,
                                  f"RDMA device {spec.rdma_device} is not in the host network namespace")
    except AttachError:
        raise
    except Exception as e:
        raise AttachError("check", spec.host_name, _why(e)) from e
    finally:
        os.close(ns_fd)
    return Attached(spec=spec, netns=netns_path, original_mtu=link.mtu, hw_address=link.address,
                    perm_address=link.perm_address,
                    was_up=link.up, rdma_moved=rdma_move, netns_id=ident)


def _family(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> int:
    return socket.AF_INET if addr.version == 4 else socket.AF_INET6


def _configure(att: Attached, ns_fd: int, progress: Progress | None, state: list[str]) -> None:
    spec = att.spec

    def step(name: str) -> None:
        state[0] = name
        if progress is not None:
            try:
                progress(name)
            except BaseException as e:  # a failed record is a crash: leave things for the resume
                raise _RecordFailed() from e

    step("move")
    with _host() as host, _inside(ns_fd) as ns:
        link = _find(ns, att, spec.pod_name)
        if link is None:
            home = _find(host, att, spec.host_name)
            if home is None:
                raise RuntimeError("the interface is in neither the host nor the pod network namespace")
            host.link("set", index=home.index, net_ns_fd=ns_fd, ifname=spec.pod_name)
            link = _find(ns, att, spec.pod_name)
            if link is None:
                raise RuntimeError("moved, but not found in the pod network namespace")
        elif link.name != spec.pod_name:
            raise RuntimeError(f"found in the pod network namespace as {link.name}, not {spec.pod_name}")
        step("mtu")
        if spec.mtu is not None and link.mtu != spec.mtu:
            ns.link("set", index=link.index, mtu=spec.mtu)
        step("up")
        ns.link("set", index=link.index, state="up")
        step("addresses")
        for text in spec.addresses:
            iface = ipaddress.ip_interface(text)
            ns.addr("replace", index=link.index, address=str(iface.ip), prefixlen=iface.network.prefixlen,
                    family=_family(iface.ip))
        step("routes")
        for r in spec.routes:
            net = ipaddress.ip_network(r.destination, strict=False)
            route: dict[str, int | str] = {"oif": link.index, "family": _family(net.network_address), "dst_len": net.prefixlen}
            if net.prefixlen:
                route["dst"] = str(net.network_address)
            if r.gateway is not None:
                route["gateway"] = r.gateway
            ns.route("replace", **route)
    step("rdma")
    if att.rdma_moved and spec.rdma_device:
        nl = rdma_netlink.open_rdma()
        if nl is None:
            raise RuntimeError("the kernel has no RDMA netlink")
        with nl:
            index = nl.device_index(spec.rdma_device)
            if index is not None:
                nl.move(index, ns_fd)
        if index is None:  # not in the host: moved before a crash?
            inner = rdma_netlink.open_rdma(ns_fd)
            with ExitStack() as stack:
                there = inner is not None and stack.enter_context(inner).device_index(spec.rdma_device) is not None
            if not there:
                raise RuntimeError(f"RDMA device {spec.rdma_device} is in neither namespace")


class _RecordFailed(Exception):
    """`progress` raised: the caller could not record the step, so nothing more is done or undone."""


@blocking
def apply(att: Attached, progress: Progress | None = None) -> Attached:
    """Carry out the attachment `att` (from prepare): move, rename, MTU, up, addresses, routes, RDMA.

    Repeatable: run again after a crash it finishes what is missing. `progress(step)` is called before
    each step (the NetAttacher records it); if it raises, its exception propagates and nothing is undone.
    Any other failure undoes what was done (the interface back in the host under its name, MTU, state)
    and raises AttachError naming the step.
    """
    state = ["open"]
    try:
        ns_fd = open_netns(att.netns)
    except OSError as e:
        raise AttachError("open", att.spec.host_name,
                          f"cannot open the pod network namespace {att.netns}: {_why(e)}") from None
    try:
        _configure(att, ns_fd, progress, state)
    except _RecordFailed as e:
        raise (e.__cause__ or e) from None  # _RecordFailed is always raised from the failure it records
    except Exception as e:
        try:
            detach(att, settle_s=0)
        except Exception as undo:  # noqa: BLE001 (the original failure is what the caller needs; the undo's goes to the log)
            log.error("undoing a failed attachment failed",
                      extra={"interface": att.spec.host_name, "netns": att.netns, "error": str(undo)})
        raise AttachError(state[0], att.spec.host_name, _why(e)) from e
    finally:
        os.close(ns_fd)
    log.info("attached interface", extra={"interface": att.spec.host_name, "pod_name": att.spec.pod_name,
                                          "netns": att.netns, "rdma_moved": att.rdma_moved})
    return att


@blocking
def attach(spec: InterfaceSpec, netns_path: str, progress: Progress | None = None) -> Attached:
    """Move `spec.host_name` into the namespace at `netns_path` and configure it; see prepare and apply."""
    return apply(prepare(spec, netns_path), progress)


def _restore(host: IPRoute, link: Link, att: Attached) -> bool:
    """Give a link in the host its original name, hardware address, MTU and admin state; whether anything
    changed."""
    spec = att.spec
    changed = False
    if link.name != spec.host_name:
        other = _by_name(host, spec.host_name)
        if other is not None:
            raise DetachError("rename", spec.host_name,
                              f"back in the host as {link.name}, but another device ({other.address}) "
                              f"is called {spec.host_name} now; rename or remove it, the next detach retries")
        if link.up:
            host.link("set", index=link.index, state="down")
        host.link("set", index=link.index, ifname=spec.host_name)
        changed = True
    if link.address != att.hw_address and att.hw_address:
        host.link("set", index=link.index, address=att.hw_address)
        changed = True
    if link.mtu != att.original_mtu:
        host.link("set", index=link.index, mtu=att.original_mtu)
        changed = True
    now = _link(host.link("get", index=link.index)[0])
    if now.up != att.was_up:
        host.link("set", index=link.index, state="up" if att.was_up else "down")
        changed = True
    return changed


def _rdma_home(ns_fd: int, name: str) -> None:
    """Move RDMA device `name` from the namespace `ns_fd` back to the host's, if it is there."""
    inner = rdma_netlink.open_rdma(ns_fd)
    if inner is None:
        return
    with inner:
        index = inner.device_index(name)
        if index is None:
            return
        fd = host_netns_fd()
        try:
            inner.move(index, fd)
        finally:
            os.close(fd)


@blocking
def detach(att: Attached, *, settle_s: float = SETTLE_S) -> Outcome:
    """Return the interface of `att` to the host with its original name, MTU and admin state.

    Idempotent: already home and as it was → ALREADY_HOME, nothing done. In the pod's namespace → moved
    back (the move flushes the addresses and routes we gave it) → RESTORED. The namespace gone (the pod
    was killed): the kernel returns a physical device to the host by itself, under its pod name or one it
    chooses; it is found by hardware address (waiting up to `settle_s` for the dying namespace) and renamed
    → RECOVERED. A virtual device is destroyed with its namespace → LOST (logged). Raises DetachError when
    the kernel refuses a step; the caller keeps its record and retries.
    """
    spec = att.spec
    step = "find"
    try:
        with _host() as host:
            home = _find(host, att, spec.host_name)
            if home is not None and home.name == spec.host_name:
                step = "restore"
                return Outcome.RESTORED if _restore(host, home, att) else Outcome.ALREADY_HOME
            ns_fd = None
            if is_same_netns(att.netns, att.netns_id):
                try:
                    ns_fd = open_netns(att.netns)
                except OSError:
                    ns_fd = None
            if ns_fd is not None:
                try:
                    if att.rdma_moved and spec.rdma_device:
                        step = "rdma"
                        _rdma_home(ns_fd, spec.rdma_device)
                    step = "move"
                    with _inside(ns_fd) as ns:
                        # by address, or by the name we gave it (the pod may have changed its address)
                        link = _find(ns, att, spec.pod_name) or _by_name(ns, spec.pod_name)
                        if link is not None:
                            if link.address != att.hw_address and att.hw_address:
                                # before the move: whatever happens next, it is findable by address
                                ns.link("set", index=link.index, address=att.hw_address)
                            taken = _by_name(host, spec.host_name) is not None
                            name = f"tdp{secrets.token_hex(4)}" if taken else spec.host_name
                            fd = host_netns_fd()
                            try:
                                ns.link("set", index=link.index, net_ns_fd=fd, ifname=name)
                            finally:
                                os.close(fd)
                            back = _by_name(host, name)
                            if back is None:
                                raise RuntimeError("moved, but not found in the host network namespace")
                            step = "restore"
                            _restore(host, back, att)  # raises DetachError when the name is taken
                            log.info("detached interface", extra={"interface": spec.host_name, "netns": att.netns})
                            return Outcome.RESTORED
                finally:
                    os.close(ns_fd)
            step = "recover"
            deadline = time.monotonic() + (0.0 if ns_fd is not None else settle_s)
            while True:
                link = _find(host, att, spec.pod_name)
                if link is not None:
                    _restore(host, link, att)
                    log.info("recovered interface from a dead pod namespace",
                             extra={"interface": spec.host_name, "found_as": link.name, "netns": att.netns})
                    return Outcome.RECOVERED
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
    except DetachError:
        raise
    except Exception as e:
        raise DetachError(step, spec.host_name, _why(e)) from e
    log.warning("interface lost: in neither the host nor the pod network namespace (a virtual device "
                "is destroyed with its namespace)", extra={"interface": spec.host_name, "netns": att.netns,
                                                           "hw_address": att.hw_address})
    return Outcome.LOST
