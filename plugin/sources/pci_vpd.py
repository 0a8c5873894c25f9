"""A PCI function's Vital Product Data (the sysfs `vpd` file): the board serial number.

Why we read it: a ConnectX-8 shows its Data Direct DMA function (15b3:2100)
in a different part of the PCIe tree than its network PF, and the only thing
the two share is the board they are on. Both functions expose the board's
VPD, whose read-only section carries the serial number (keyword `SN`), so the
serial ties a DMA function to its PF (rdma-core's `rdma_topo` pairs them the
same way).

The format (PCI Local Bus spec, "Vital Product Data"): a list of resources,
each starting with a tag byte. Large resources (bit 7 set) carry a 16-bit
little-endian length after the tag: `0x82` the identifier string (board
name), `0x90` the read-only keywords (VPD-R), `0x91` the writable ones. Small
resources keep their length in the tag's low 3 bits; `0x78` ends the list.
A keyword is two ASCII letters, one length byte, then the value. The
read-only section must hold `RV`, whose first byte makes the sum of every
byte from the start of the VPD up to and including it zero (mod 256).

Anything that does not follow this (cut short, wrong checksum, no serial) is
a `VpdError` saying what is wrong, never a crash: discovery then falls back to
pairing by PCIe path and says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["Vpd", "VpdError", "board_serial", "parse_vpd"]

TAG_ID_STRING = 0x82
TAG_READ_ONLY = 0x90
TAG_READ_WRITE = 0x91
TAG_END = 0x78
_LARGE = 0x80
#: Never read more than this from a `vpd` file (the format's own limit is 32 KiB).
MAX_VPD_BYTES = 32 * 1024


class VpdError(ValueError):
    """The VPD cannot be used; `str()` says why (the caller names the device)."""


@dataclass(frozen=True)
class Vpd:
    """What the read-only section says, plus the board name."""

    name: str | None = None
    keywords: dict[str, bytes] = field(default_factory=dict)

    @property
    def serial(self) -> str | None:
        raw = self.keywords.get("SN")
        text = raw.decode("ascii", errors="replace").strip(" \x00") if raw is not None else ""
        return text or None


def _keywords(body: bytes, offset: int, data: bytes) -> dict[str, bytes]:
    """Keywords of one read-only section; `offset` is where `body` starts within `data` (for RV)."""
    out: dict[str, bytes] = {}
    i = 0
    while i < len(body):
        if len(body) - i < 3:
            raise VpdError(f"keyword header cut short at byte {offset + i}")
        key = body[i:i + 2].decode("ascii", errors="replace")
        length = body[i + 2]
        if i + 3 + length > len(body):
            raise VpdError(f"keyword {key!r} runs past its section ({length} bytes at byte {offset + i})")
        value = body[i + 3:i + 3 + length]
        if key == "RV":
            if length < 1:
                raise VpdError("RV keyword holds no checksum byte")
            if sum(data[:offset + i + 4]) % 256 != 0:
                raise VpdError("checksum (RV) does not match the data")
            out[key] = value
            return out  # RV closes the read-only data
        out[key] = value
        i += 3 + length
    raise VpdError("read-only section has no RV checksum")


def parse_vpd(data: bytes) -> Vpd:
    """Parse a `vpd` file's bytes; raise VpdError when they do not follow the format."""
    if not data:
        raise VpdError("empty")
    i = 0
    name: str | None = None
    keywords: dict[str, bytes] | None = None
    while True:
        if i >= len(data):
            raise VpdError("no end tag (cut short)")
        tag = data[i]
        if tag == TAG_END:
            break
        if tag & _LARGE:
            if i + 3 > len(data):
                raise VpdError(f"resource 0x{tag:02x} header cut short")
            length = int.from_bytes(data[i + 1:i + 3], "little")
            start = i + 3
        else:
            length = tag & 0x07
            start = i + 1
        if start + length > len(data):
            raise VpdError(f"resource 0x{tag:02x} runs past the data ({length} bytes at byte {i})")
        body = data[start:start + length]
        if tag == TAG_ID_STRING:
            name = body.decode("ascii", errors="replace").strip(" \x00") or None
        elif tag == TAG_READ_ONLY:
            keywords = _keywords(body, start, data)
        i = start + length
    if keywords is None:
        raise VpdError("no read-only section (VPD-R)")
    return Vpd(name=name, keywords=keywords)


def board_serial(function_dir: str) -> str:
    """The board serial number from `<function_dir>/vpd`; VpdError when missing or malformed."""
    path = os.path.join(function_dir, "vpd")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_VPD_BYTES)
    except OSError as e:
        raise VpdError(f"cannot read {path}: {e.strerror or e}") from None
    vpd = parse_vpd(data)
    if vpd.serial is None:
        raise VpdError("no serial number (SN keyword) in the read-only section")
    return vpd.serial
