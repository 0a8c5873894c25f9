"""The RDMA netlink messages we send, against the kernel's own definitions.

There is no RDMA device here (no ib_core in this kernel), so the move cannot run.
What can be checked: every constant and the byte layout of every request
against include/uapi/rdma/rdma_netlink.h as installed (Debian: linux-libc-dev,
installed by `scripts/kubelet_tests.sh prepare`), the parsing of answers from a
stand-in kernel on a socket pair (the hardware boundary), and what this kernel
really answers to `rdma_netns_mode()`.
"""

from __future__ import annotations

import errno
import pathlib
import re
import socket
import struct
import threading

import pytest

from plugin.netattach import rdma_netlink as rn
from plugin.netattach import rdma_netns_mode

HEADER = pathlib.Path("/usr/include/rdma/rdma_netlink.h")


def uapi_text() -> str:
    if not HEADER.exists():
        pytest.fail(f"{HEADER} is missing: it is the kernel's definition of RDMA netlink that these tests check "
                    "our messages against; install it with `apt-get install linux-libc-dev` "
                    "(scripts/kubelet_tests.sh prepare does)")
    text = re.sub(r"/\*.*?\*/", " ", HEADER.read_text(), flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def enums(text: str) -> dict[str, int]:
    """Every enumerator of every enum in `text`, valued as C does (implicit: previous + 1)."""
    values: dict[str, int] = {}
    for body in re.findall(r"enum\s*\w*\s*\{(.*?)\}", text, flags=re.S):
        nxt = 0
        for item in (x.strip() for x in body.split(",")):
            if not item or item.startswith("#"):
                continue
            name, _, expr = (p.strip() for p in item.partition("="))
            if expr:
                nxt = eval(expr, {"__builtins__": {}}, dict(values))  # ints, earlier names, << and |
            values[name] = nxt
            nxt += 1
    return values


@pytest.fixture(scope="module")
def uapi() -> dict[str, int]:
    return enums(uapi_text())


def test_our_constants_are_the_kernels(uapi):
    for name in ("RDMA_NL_NLDEV", "RDMA_NLDEV_CMD_GET", "RDMA_NLDEV_CMD_SET", "RDMA_NLDEV_CMD_SYS_GET",
                 "RDMA_NLDEV_ATTR_DEV_INDEX", "RDMA_NLDEV_ATTR_DEV_NAME", "RDMA_NLDEV_SYS_ATTR_NETNS_MODE",
                 "RDMA_NLDEV_NET_NS_FD"):
        assert getattr(rn, name) == uapi[name], name
    # the parser reads the enums right: a few the kernel documents by value
    assert uapi["RDMA_NL_IWCM"] == 2 and uapi["RDMA_NLDEV_CMD_RES_GET"] == 9


def test_the_message_type_is_the_headers_macro():
    """RDMA_NL_GET_TYPE(client, op), evaluated from the header's own #define."""
    m = re.search(r"#define\s+RDMA_NL_GET_TYPE\((\w+),\s*(\w+)\)\s+(.+)", uapi_text())
    assert m, "RDMA_NL_GET_TYPE not found in the header"
    client_arg, op_arg, body = m.groups()
    for op in (rn.RDMA_NLDEV_CMD_GET, rn.RDMA_NLDEV_CMD_SET, rn.RDMA_NLDEV_CMD_SYS_GET):
        expected = eval(body, {"__builtins__": {}}, {client_arg: rn.RDMA_NL_NLDEV, op_arg: op})
        assert rn.rdma_nl_get_type(rn.RDMA_NL_NLDEV, op) == expected


def header(msg: bytes) -> tuple[int, int, int, int, int]:
    return struct.unpack_from("=IHHII", msg)


def test_sys_get_is_a_bare_request(uapi):
    msg = rn.sys_get_message(seq=7)
    length, kind, flags, seq, pid = header(msg)
    assert (length, len(msg), seq, pid) == (16, 16, 7, 0)
    assert kind == (uapi["RDMA_NL_NLDEV"] << 10) + uapi["RDMA_NLDEV_CMD_SYS_GET"]
    assert flags == 0x1  # NLM_F_REQUEST: one answer, no acknowledgement


def test_the_move_carries_the_device_index_and_the_namespace_fd_as_u32_attributes(uapi):
    msg = rn.move_message(dev_index=3, ns_fd=41, seq=9)
    length, kind, flags, seq, _ = header(msg)
    assert length == len(msg) == 16 + 8 + 8
    assert kind == (uapi["RDMA_NL_NLDEV"] << 10) + uapi["RDMA_NLDEV_CMD_SET"]
    assert flags == 0x1 | 0x4  # NLM_F_REQUEST | NLM_F_ACK: the kernel answers with an error code
    # struct nlattr {u16 nla_len; u16 nla_type;} then the u32 payload, in host byte order
    assert struct.unpack_from("=HHI", msg, 16) == (8, uapi["RDMA_NLDEV_ATTR_DEV_INDEX"], 3)
    assert struct.unpack_from("=HHI", msg, 24) == (8, uapi["RDMA_NLDEV_NET_NS_FD"], 41)


def test_the_device_dump_is_a_get_with_the_dump_flags(uapi):
    length, kind, flags, _, _ = header(rn.dev_dump_message())
    assert kind == (uapi["RDMA_NL_NLDEV"] << 10) + uapi["RDMA_NLDEV_CMD_GET"]
    assert length == 16 and flags == 0x1 | 0x300


def test_a_device_name_attribute_is_nul_terminated_and_padded():
    a = rn.attr_str(rn.RDMA_NLDEV_ATTR_DEV_NAME, "mlx5_0")
    assert struct.unpack_from("=HH", a) == (4 + 7, rn.RDMA_NLDEV_ATTR_DEV_NAME)
    assert a[4:11] == b"mlx5_0\0" and len(a) == 12


class StandInKernel:
    """The kernel's side of a NETLINK_RDMA socket, on a socket pair: answers what a test tells it to."""

    def __init__(self) -> None:
        self.ours, self.kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.ours.settimeout(5)

    def request(self) -> tuple[int, int, int, bytes]:
        data = self.kernel.recv(65536)
        kind, flags, seq, payload = next(rn.parse_messages(data))
        return kind, flags, seq, payload

    def answer(self, kind: int, seq: int, attrs: bytes = b"", flags: int = 0) -> bytes:
        return struct.pack("=IHHII", 16 + len(attrs), kind, flags, seq, 0) + attrs

    def error(self, seq: int, code: int) -> bytes:
        return struct.pack("=IHHIIi", 16 + 4 + 16, rn.NLMSG_ERROR, 0, seq, 0, -code) + bytes(16)


@pytest.mark.parametrize("value, mode", [(1, "shared"), (0, "exclusive")])
def test_the_netns_mode_is_read_from_the_sys_get_answer(value, mode):
    k = StandInKernel()
    nl = rn.RdmaNetlink(k.ours)
    asked: list[int] = []

    def kernel_side() -> None:
        kind, _, seq, _ = k.request()
        asked.append(kind)
        other = k.answer(kind, seq + 100, rn.attr(rn.RDMA_NLDEV_SYS_ATTR_NETNS_MODE, bytes([1 - value])))
        k.kernel.send(other)  # an answer to someone else's request is not ours
        k.kernel.send(k.answer(kind, seq, rn.attr_u32(1, 0) + rn.attr(rn.RDMA_NLDEV_SYS_ATTR_NETNS_MODE,
                                                                       bytes([value]))))

    t = threading.Thread(target=kernel_side)
    t.start()
    assert nl.netns_mode() == mode
    t.join()
    assert asked == [rn.rdma_nl_get_type(rn.RDMA_NL_NLDEV, rn.RDMA_NLDEV_CMD_SYS_GET)]


def test_the_device_dump_and_the_move_against_a_stand_in_kernel():
    k = StandInKernel()
    nl = rn.RdmaNetlink(k.ours)
    seen: list[tuple[int, int, bytes]] = []

    def kernel_side() -> None:
        kind, flags, seq, _ = k.request()
        seen.append((kind, flags, b""))
        devs = b"".join(k.answer(kind, seq, rn.attr_u32(rn.RDMA_NLDEV_ATTR_DEV_INDEX, i)
                                 + rn.attr_str(rn.RDMA_NLDEV_ATTR_DEV_NAME, name), flags=0x2)
                        for i, name in ((0, "mlx5_0"), (4, "mlx5_1")))
        k.kernel.send(devs)
        k.kernel.send(k.answer(rn.NLMSG_DONE, seq, struct.pack("=i", 0), flags=0x2))
        kind, flags, seq, payload = k.request()
        seen.append((kind, flags, payload))
        k.kernel.send(k.error(seq, errno.EPERM))

    t = threading.Thread(target=kernel_side)
    t.start()
    assert nl.device_index("mlx5_1") == 4
    with pytest.raises(rn.RdmaNetlinkError) as e:
        nl.move(4, 17)
    t.join()
    assert e.value.errno == errno.EPERM
    attrs = rn.parse_attrs(seen[1][2])
    assert struct.unpack("=I", attrs[rn.RDMA_NLDEV_ATTR_DEV_INDEX])[0] == 4
    assert struct.unpack("=I", attrs[rn.RDMA_NLDEV_NET_NS_FD])[0] == 17


def test_rdma_netns_mode_on_this_kernel():
    """What this machine's kernel really answers: no RDMA netlink at all (no ib_core) gives None, and
    the socket call itself says so; a kernel with RDMA answers a mode."""
    mode = rdma_netns_mode()
    try:
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, rn.NETLINK_RDMA)
    except OSError as e:
        assert e.errno == errno.EPROTONOSUPPORT
        assert mode is None
    else:
        s.close()
        assert mode in ("shared", "exclusive")
