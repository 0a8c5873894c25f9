"""RDMA netlink (NETLINK_RDMA, the `rdma` tool's channel): the netns mode, and moving an RDMA device.

Why by hand: pyroute2 does not speak the RDMA family, and we need three
messages of it. In exclusive netns mode (`rdma system set netns exclusive`) an
RDMA device is visible only in one network namespace, so a pod that gets a
RoCE NIC's netdev needs its RDMA device (mlx5_0...) moved too; in shared mode
(the default) every namespace sees every RDMA device and nothing moves.

The messages (include/uapi/rdma/rdma_netlink.h): a netlink header whose type is
RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, command) = (client << 10) + command, then
netlink attributes directly (no family header):
- RDMA_NLDEV_CMD_SYS_GET → answer carries RDMA_NLDEV_SYS_ATTR_NETNS_MODE (u8: 1 shared, 0 exclusive);
- RDMA_NLDEV_CMD_GET with NLM_F_DUMP → one message per device (DEV_INDEX u32, DEV_NAME string);
- RDMA_NLDEV_CMD_SET with DEV_INDEX (u32) + RDMA_NLDEV_NET_NS_FD (u32) → the device moves (needs
  CAP_NET_ADMIN; exclusive mode only).
The constants below are checked against the installed uapi header by tests/netattach.
"""

from __future__ import annotations

import errno
import itertools
import os
import socket
import struct
from collections.abc import Iterator

from .netns import socket_in

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5
RDMA_NLDEV_CMD_GET = 1
RDMA_NLDEV_CMD_SET = 2
RDMA_NLDEV_CMD_SYS_GET = 6
RDMA_NLDEV_ATTR_DEV_INDEX = 1
RDMA_NLDEV_ATTR_DEV_NAME = 2
RDMA_NLDEV_SYS_ATTR_NETNS_MODE = 66
RDMA_NLDEV_NET_NS_FD = 68

NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_ATTR = struct.Struct("=HH")  # nlattr: length, type


class RdmaNetlinkError(OSError):
    """The kernel refused an RDMA netlink request (errno from its NLMSG_ERROR answer)."""


def rdma_nl_get_type(client: int, op: int) -> int:
    """RDMA_NL_GET_TYPE of the uapi header."""
    return (client << 10) + op


def _align(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    raw = _ATTR.pack(_ATTR.size + len(payload), kind) + payload
    return raw + b"\0" * (_align(len(raw)) - len(raw))


def attr_u32(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=I", value))


def attr_str(kind: int, value: str) -> bytes:
    return attr(kind, value.encode() + b"\0")


def message(command: int, attrs: bytes = b"", *, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    """A whole NLDEV request: header (type RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, command)) and attributes."""
    return _HEADER.pack(_HEADER.size + len(attrs), rdma_nl_get_type(RDMA_NL_NLDEV, command), flags, seq, 0) + attrs


def sys_get_message(seq: int = 0) -> bytes:
    return message(RDMA_NLDEV_CMD_SYS_GET, seq=seq)


def dev_dump_message(seq: int = 0) -> bytes:
    return message(RDMA_NLDEV_CMD_GET, flags=NLM_F_REQUEST | NLM_F_DUMP, seq=seq)


def move_message(dev_index: int, ns_fd: int, seq: int = 0) -> bytes:
    return message(RDMA_NLDEV_CMD_SET,
                   attr_u32(RDMA_NLDEV_ATTR_DEV_INDEX, dev_index) + attr_u32(RDMA_NLDEV_NET_NS_FD, ns_fd),
                   flags=NLM_F_REQUEST | NLM_F_ACK, seq=seq)


def parse_messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """(type, flags, seq, payload) of each netlink message in one datagram."""
    off = 0
    while off + _HEADER.size <= len(data):
        length, kind, flags, seq, _ = _HEADER.unpack_from(data, off)
        if length < _HEADER.size or off + length > len(data):
            raise ValueError(f"truncated netlink message at byte {off} (length {length}, {len(data)} received)")
        yield kind, flags, seq, data[off + _HEADER.size: off + length]
        off += _align(length)


def parse_attrs(payload: bytes) -> dict[int, bytes]:
    """Attribute type → payload (the last one wins), nested flags stripped."""
    out: dict[int, bytes] = {}
    off = 0
    while off + _ATTR.size <= len(payload):
        length, kind = _ATTR.unpack_from(payload, off)
        if length < _ATTR.size:
            break
        out[kind & 0x3FFF] = payload[off + _ATTR.size: off + length]
        off += _align(length)
    return out


class RdmaNetlink:
    """Requests over one NETLINK_RDMA socket (of the namespace it was created in)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._seq = itertools.count(1)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RdmaNetlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _exchange(self, request_of_seq) -> list[bytes]:
        """Send one request, collect the payloads answered for its sequence number until it is complete."""
        seq = next(self._seq)
        request = request_of_seq(seq)
        _, _, flags, _, _ = _HEADER.unpack_from(request)
        self.sock.send(request)
        payloads: list[bytes] = []
        while True:
            data = self.sock.recv(65536)
            for kind, _, mseq, payload in parse_messages(data):
                if mseq != seq:
                    continue
                if kind == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", payload)
                    if code:
                        raise RdmaNetlinkError(-code, os.strerror(-code))
                    return payloads  # the acknowledgement
                if kind == NLMSG_DONE:
                    return payloads
                payloads.append(payload)
                if not flags & (NLM_F_DUMP | NLM_F_ACK):  # a plain request: one answer
                    return payloads

    def netns_mode(self) -> str:
        """'shared' or 'exclusive' (RDMA_NLDEV_SYS_ATTR_NETNS_MODE)."""
        for payload in self._exchange(sys_get_message):
            value = parse_attrs(payload).get(RDMA_NLDEV_SYS_ATTR_NETNS_MODE)
            if value:
                return "shared" if value[0] else "exclusive"
        raise RdmaNetlinkError(errno.EPROTO, "RDMA_NLDEV_CMD_SYS_GET answered without a netns mode")

    def devices(self) -> dict[str, int]:
        """name → index of the RDMA devices visible in this socket's namespace."""
        out: dict[str, int] = {}
        for payload in self._exchange(dev_dump_message):
            a = parse_attrs(payload)
            if RDMA_NLDEV_ATTR_DEV_INDEX in a and RDMA_NLDEV_ATTR_DEV_NAME in a:
                name = a[RDMA_NLDEV_ATTR_DEV_NAME].split(b"\0", 1)[0].decode()
                out[name] = struct.unpack_from("=I", a[RDMA_NLDEV_ATTR_DEV_INDEX])[0]
        return out

    def device_index(self, name: str) -> int | None:
        return self.devices().get(name)

    def move(self, dev_index: int, ns_fd: int) -> None:
        """Move RDMA device `dev_index` into the namespace `ns_fd` (exclusive mode; CAP_NET_ADMIN)."""
        self._exchange(lambda seq: move_message(dev_index, ns_fd, seq))


def open_rdma(ns_fd: int | None = None) -> RdmaNetlink | None:
    """A RDMA netlink channel in the host's namespace (or in `ns_fd`'s); None when the kernel has none
    (no ib_core: socket() answers EPROTONOSUPPORT)."""
    try:
        sock = (socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_RDMA) if ns_fd is None
                else socket_in(ns_fd, NETLINK_RDMA))
    except OSError as e:
        if e.errno in (errno.EPROTONOSUPPORT, errno.EAFNOSUPPORT):
            return None
        raise
    sock.settimeout(5.0)
    return RdmaNetlink(sock)


def rdma_netns_mode() -> str | None:
    """'shared', 'exclusive', or None when this kernel has no RDMA netlink (no RDMA subsystem loaded)."""
    nl = open_rdma()
    if nl is None:
        return None
    with nl:
        try:
            return nl.netns_mode()
        except RdmaNetlinkError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # kernels before netns mode (< 5.2)
                return None
            raise
