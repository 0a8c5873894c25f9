"""The PCI VPD parser: the board serial from a well-formed `vpd`, a clear reason for anything else."""

from __future__ import annotations

import pytest

from plugin.sources.pci_vpd import VpdError, board_serial, parse_vpd
from topo_testkit.sysfs_fixture import make_vpd


def test_serial_name_and_keywords_of_a_well_formed_vpd():
    vpd = parse_vpd(make_vpd("MT2452XZ0A01", name="NVIDIA ConnectX-8 SuperNIC", part="900-9X81Q"))
    assert vpd.serial == "MT2452XZ0A01"
    assert vpd.name == "NVIDIA ConnectX-8 SuperNIC"
    assert vpd.keywords["PN"] == b"900-9X81Q"


def test_bytes_after_the_end_tag_are_ignored():
    """The sysfs file is often longer than the VPD (padding the device returns)."""
    assert parse_vpd(make_vpd("SN1") + b"\xff" * 64).serial == "SN1"


@pytest.mark.parametrize(("data", "reason"), [
    (make_vpd("SN1", checksum_ok=False), "checksum"),
    (make_vpd("SN1")[:-1], "no end tag"),
    (make_vpd("SN1")[:2], "header cut short"),
    (make_vpd("SN1")[:40], "runs past"),
    (b"", "empty"),
    (b"\xff" * 16, "runs past"),
    (b"\x82\x02\x00ab\x78", "no read-only section"),
])
def test_malformed_vpd_is_an_error_saying_what_is_wrong(data, reason):
    with pytest.raises(VpdError, match=reason):
        parse_vpd(data)


def test_a_read_only_section_without_rv_is_refused():
    body = b"SN\x03AB1"
    data = b"\x90" + len(body).to_bytes(2, "little") + body + b"\x78"
    with pytest.raises(VpdError, match="no RV checksum"):
        parse_vpd(data)


def test_board_serial_reads_the_function_directory(tmp_path):
    (tmp_path / "vpd").write_bytes(make_vpd("MT2501XZ0B00"))
    assert board_serial(str(tmp_path)) == "MT2501XZ0B00"
    (tmp_path / "vpd").write_bytes(make_vpd(None))
    with pytest.raises(VpdError, match="no serial number"):
        board_serial(str(tmp_path))
    with pytest.raises(VpdError, match="cannot read"):
        board_serial(str(tmp_path / "absent"))
