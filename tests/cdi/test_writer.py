"""The spec writer: atomic replace, only when changed, stale files of ours removed, others kept."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import stat

import pytest

from plugin.cdi_files.writer import CdiSpecWriter, CdiWriteError, fix_for
from plugin.model.cdi import CdiOptions, spec_for_resource

from cdi_nodes import mig_resource, nic_resource, resources_of

OPTS = CdiOptions()


def specs(source: str = "pcie-2socket-4gpu-2nic"):
    out = [spec_for_resource(r, OPTS) for r in resources_of(source)]
    out += [spec_for_resource(mig_resource(), OPTS), spec_for_resource(nic_resource(), OPTS)]
    return [s for s in out if s is not None]


def test_sync_writes_one_file_per_resource(tmp_path: pathlib.Path) -> None:
    w = CdiSpecWriter(str(tmp_path / "cdi"))  # created on first write
    result = w.sync(specs())
    names = sorted(p.name for p in (tmp_path / "cdi").iterdir())
    assert names == ["topo-dp.nvidia.com-gpu.json", "topo-dp.nvidia.com-mig-1g_10gb.json",
                     "topo-dp.topo.dev-rdma_vfs.json"]
    assert sorted(result.written) == names and not result.unchanged and not result.removed
    doc = json.loads((tmp_path / "cdi" / "topo-dp.nvidia.com-gpu.json").read_text())
    assert doc["kind"] == "topo-dp.nvidia.com/gpu" and doc["cdiVersion"] == "0.5.0"
    mode = (tmp_path / "cdi" / "topo-dp.nvidia.com-gpu.json").stat().st_mode
    assert stat.S_IMODE(mode) == 0o644


def test_unchanged_specs_are_not_rewritten(tmp_path: pathlib.Path) -> None:
    w = CdiSpecWriter(str(tmp_path))
    w.sync(specs())
    gpu = tmp_path / "topo-dp.nvidia.com-gpu.json"
    inode = gpu.stat().st_ino
    result = w.sync(specs())
    assert not result.written and len(result.unchanged) == 3
    assert gpu.stat().st_ino == inode  # not even replaced by an identical file


def test_changed_devices_replace_the_file_atomically(tmp_path: pathlib.Path) -> None:
    w = CdiSpecWriter(str(tmp_path))
    w.sync(specs("dgx-a100"))
    gpu = tmp_path / "topo-dp.nvidia.com-gpu.json"
    before = json.loads(gpu.read_text())
    inode = gpu.stat().st_ino
    result = w.sync(specs("pcie-2socket-4gpu-2nic"))  # 8 GPUs became 4
    assert "topo-dp.nvidia.com-gpu.json" in result.written
    after = json.loads(gpu.read_text())
    assert len(before["devices"]) == 16 and len(after["devices"]) == 8
    assert gpu.stat().st_ino != inode  # a new file renamed over the old one, never edited in place
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_specs_of_gone_resources_and_crash_leftovers_are_removed_others_kept(tmp_path: pathlib.Path) -> None:
    foreign = tmp_path / "nvidia.yaml"
    foreign.write_text("cdiVersion: 0.5.0\n")
    other_vendor = tmp_path / "k8s.device-plugin.nvidia.com-gpu.json"
    other_vendor.write_text("{}")
    stale = tmp_path / "topo-dp.example.com-old.json"
    stale.write_text("{}")
    leftover = tmp_path / ".topo-dp.nvidia.com-gpu.json.abc123.tmp"
    leftover.write_text("{")
    w = CdiSpecWriter(str(tmp_path))
    result = w.sync(specs()[:1])
    assert sorted(result.removed) == sorted([stale.name, leftover.name])
    assert foreign.exists() and other_vendor.exists() and not stale.exists() and not leftover.exists()
    assert w.remove_all() == ["topo-dp.nvidia.com-gpu.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([foreign.name, other_vendor.name])


def test_two_resources_with_one_spec_file_are_refused(tmp_path: pathlib.Path) -> None:
    s = specs()[0]
    with pytest.raises(ValueError, match="topo-dp.nvidia.com-gpu.json"):
        CdiSpecWriter(str(tmp_path)).sync([s, s])


def test_a_kind_that_is_not_ours_is_refused(tmp_path: pathlib.Path) -> None:
    s = specs()[0]
    with pytest.raises(ValueError, match="not ours"):
        CdiSpecWriter(str(tmp_path), vendor_prefix="acme").write(s)


def test_write_error_names_the_path(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(CdiWriteError, match="not-a-dir"):
        CdiSpecWriter(str(blocker)).sync(specs()[:1])
    # A missing directory is simply empty for removal.
    assert CdiSpecWriter(str(tmp_path / "missing")).remove_all() == []


def test_a_spec_directory_replaced_by_a_file_is_an_error_with_the_fix_for_every_operation(
        tmp_path: pathlib.Path) -> None:
    """Listing (start, shutdown), writing and removing: a CdiWriteError naming the path, and a fix that
    names what is in the way, never a bare NotADirectoryError."""
    cdi = tmp_path / "cdi"
    writer = CdiSpecWriter(str(cdi))
    writer.sync(specs()[:1])
    name = specs()[0].file_name
    for f in cdi.iterdir():
        f.unlink()
    cdi.rmdir()
    cdi.write_text("in the way\n")
    for operation in (writer.owned_files, writer.remove_all, lambda: writer.write(specs()[0]),
                      lambda: writer.remove(name)):
        with pytest.raises(CdiWriteError) as e:
            operation()
        assert str(cdi) in str(e.value) and "Not a directory" in str(e.value)
        assert e.value.fix.startswith(f"{cdi} is not a directory: remove or rename it"), e.value.fix
    # Deeper: the directory's parent is the file; the fix names the parent.
    for operation in (CdiSpecWriter(str(cdi / "deeper")).owned_files,
                      lambda: CdiSpecWriter(str(cdi / "deeper")).write(specs()[0])):
        with pytest.raises(CdiWriteError) as e:
            operation()
        assert e.value.fix.startswith(f"{cdi} is not a directory")


@pytest.mark.parametrize("code,words", [
    (errno.EROFS, "writable"), (errno.EACCES, "writable"), (errno.ENOSPC, "free space"), (errno.EIO, "check"),
])
def test_the_fix_follows_the_cause(tmp_path: pathlib.Path, code: int, words: str) -> None:
    fix = fix_for(OSError(code, os.strerror(code)), str(tmp_path))
    assert words in fix and str(tmp_path) in fix


def test_shutdown_with_a_broken_directory_is_a_warning(tmp_path: pathlib.Path, caplog) -> None:
    from plugin.cdi_files.sync import SpecSync
    from plugin.model.gpu_allocate import GpuAllocateOptions
    from plugin.model.resources import ResourceOptions, build_resources
    from plugin.sources.simulated import load_simulated

    cdi = tmp_path / "cdi"
    sync = SpecSync(str(cdi))
    sync.sync(build_resources(load_simulated("dgx-h100"), ResourceOptions(gpu_allocate=GpuAllocateOptions(device_list_strategy=("cdi-cri",)))))
    assert sync.active and list(cdi.iterdir())
    for f in cdi.iterdir():
        f.unlink()
    cdi.rmdir()
    cdi.write_text("in the way\n")
    sync.remove_all()  # never raises: the service has already stopped
    [line] = [r for r in caplog.records if "not removed at shutdown" in r.getMessage()]
    assert line.levelname == "WARNING" and "is not a directory" in line.fix and not line.exc_info


def test_a_reader_never_sees_a_partial_file(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the temporary write and the rename the target still holds the old, complete spec,
    and the temporary name is one a CDI runtime skips (not .json/.yaml)."""
    w = CdiSpecWriter(str(tmp_path))
    w.sync(specs("dgx-a100")[:1])
    gpu = tmp_path / "topo-dp.nvidia.com-gpu.json"
    old = gpu.read_text()
    seen = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        seen.append((pathlib.Path(src).name, gpu.read_text()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    w.sync(specs("dgx-h100")[:1])
    assert len(seen) == 1
    tmp_name, content_at_rename = seen[0]
    assert content_at_rename == old
    assert tmp_name.startswith(".topo-dp.nvidia.com-gpu.json.") and tmp_name.endswith(".tmp")
