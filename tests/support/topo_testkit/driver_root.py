"""A simulated NVIDIA driver root for NVIDIA's container toolkit: what `nvidia-ctk cdi generate` reads on a node.

Why: the toolkit decides which files a container gets from the driver's files on disk and
from NVML, so both must be there for it to run. This builds, for the GPUs of a simulated
topology (our `discover --format json`), a directory laid out like a driver install:

- `usr/lib/x86_64-linux-gnu/lib<name>.so.<version>` for the driver's libraries (real ELF
  shared objects, each with its `lib<name>.so.1` soname and soname link, as the installer
  leaves them); `libnvidia-ml.so.<version>` is the NVML shim (tests/support/nvml_shim), which
  answers for exactly these GPUs;
- `usr/bin/nvidia-smi`: the static NVML probe under that name (`nvidia-smi -L` prints the
  shim's GPUs the way the real one does);
- `lib/firmware/nvidia/<version>/gsp_*.bin`: the GSP firmware the toolkit mounts;
- `dev/nvidia<minor>`, `dev/nvidiactl`, `dev/nvidia-uvm`, `dev/nvidia-uvm-tools`: character
  devices made with mknod (195:<minor>, 195:255, and the uvm pair), so it needs root.

The C parts are built with gcc and cached under $TOPO_DP_CACHE_DIR/nvml-shim by a hash of
their sources and the GPU table, so a test run compiles each node once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
SHIM_DIR = ROOT / "tests" / "support" / "nvml_shim"
#: A driver version of the R570 branch (H100/H200 era); any `X.Y.Z` works for the toolkit.
DRIVER_VERSION = "570.86.15"
CUDA_VERSION = 12080
LIB_DIR = "usr/lib/x86_64-linux-gnu"
#: The driver libraries a simulated root carries besides NVML: the CUDA driver and two it loads.
STUB_LIBS = ("cuda", "nvidia-ptxjitcompiler", "nvidia-nvvm")
NVIDIA_MAJOR = 195
UVM_MAJOR = 510
#: 80 GiB, when the topology gives no memory size.
DEFAULT_MEMORY = 80 << 30


class DriverRootError(RuntimeError):
    """The simulated driver root cannot be built here (no gcc, not root); the message says which."""


@dataclass(frozen=True)
class SimGpu:
    """One GPU as the shim reports it; `index` is its NVML index (its position)."""

    index: int
    uuid: str
    name: str
    minor: int
    pci: tuple[int, int, int, int]  # domain, bus, device, function
    memory: int = DEFAULT_MEMORY


def gpus_from_discover(report: dict[str, Any]) -> list[SimGpu]:
    """The GPUs of `topo-device-plugin discover --format json`, in NVML index order.

    A simulated node has no PCI address or minor of its own: the minor is the index (as our
    simulated device nodes are numbered) and bus ids are made up (0x18, 0x2a, ...), distinct per GPU.
    """
    gpus = sorted((d for d in report["devices"] if d["kind"] == "gpu"), key=lambda d: d["index"])
    out = []
    for pos, d in enumerate(gpus):
        domain, bus, dev, fn = 0, 0x18 + 0x12 * pos, 0, 0
        if d.get("pciBusId"):
            dom_s, bus_s, rest = d["pciBusId"].split(":")
            dev_s, fn_s = rest.split(".")
            domain, bus, dev, fn = int(dom_s, 16), int(bus_s, 16), int(dev_s, 16), int(fn_s, 16)
        minor = d.get("minor")
        out.append(SimGpu(index=pos, uuid=d["uuid"], name=d.get("model") or "NVIDIA GPU",
                          minor=int(minor) if minor is not None else int(d["index"]), pci=(domain, bus, dev, fn)))
    return out


def discover(simulate: str) -> dict[str, Any]:
    """Our own `discover --format json` of a built-in simulated node (what the daemon would serve)."""
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "topo-device-plugin"), "discover", "--simulate", simulate,
                           "--format", "json"], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(proc.stdout)


def _c_str(s: str) -> str:
    return json.dumps(s)  # a JSON string of ASCII text is a valid C string literal


def shim_header(gpus: Sequence[SimGpu], dev_root: str, version: str = DRIVER_VERSION, cuda: int = CUDA_VERSION) -> str:
    rows = ", ".join(f"{{{_c_str(g.uuid)}, {_c_str(g.name)}, {g.minor}u, {g.pci[0]}u, {g.pci[1]}u, {g.pci[2]}u, "
                     f"{g.pci[3]}u, {g.memory}ull}}" for g in gpus)
    return (f"#define SHIM_DRIVER_VERSION {_c_str(version)}\n"
            f"#define SHIM_NVML_VERSION {_c_str('12.' + version)}\n"
            f"#define SHIM_CUDA_VERSION {cuda}\n"
            f"#define SHIM_GPUS {rows}\n"
            f"#define SHIM_DEV_ROOT {_c_str(dev_root)}\n")


def _cache_dir() -> Path:
    base = os.environ.get("TOPO_DP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "topo-device-plugin")
    return Path(base) / "nvml-shim"


def _gcc(args: Sequence[str]) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise DriverRootError("gcc is not installed (apt-get install gcc libc6-dev): the NVML shim is C")
    proc = subprocess.run([gcc, *args], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise DriverRootError(f"gcc {' '.join(args)} failed:\n{proc.stderr[-2000:]}")


#: The shim has no libc at all (see nvml_shim.c): no builtins, no loop-to-strlen rewrite, no stack protector.
FREESTANDING = ("-shared", "-fPIC", "-nostdlib", "-ffreestanding", "-fno-builtin", "-fno-tree-loop-distribute-patterns",
                "-fno-stack-protector", "-O2", "-Wall", "-Wextra", "-Werror", "-Wl,-z,defs")


@dataclass
class Built:
    """The compiled parts, cached: the NVML shim for one GPU table, the other libraries by name, the static probe."""

    nvml: Path
    #: `STUB_LIBS` name -> a library whose soname is `lib<name>.so.1` (the toolkit reads it to make its links).
    stubs: dict[str, Path]
    probe: Path


#: Cached builds not used for this long are removed (each driver root has its own shim: its /dev is compiled in).
CACHE_DAYS = 2


def _prune(cache: Path, keep: Path) -> None:
    old = time.time() - CACHE_DAYS * 86400
    for d in cache.iterdir() if cache.is_dir() else ():
        if d != keep and d.stat().st_mtime < old:
            shutil.rmtree(d, ignore_errors=True)


def build_parts(gpus: Sequence[SimGpu], dev_root: str, version: str = DRIVER_VERSION) -> Built:
    """The C parts for `gpus`, whose shim lists a GPU where `dev_root`/nvidia<minor> or /dev/nvidia<minor> exists."""
    header = shim_header(gpus, dev_root, version)
    sources = [SHIM_DIR / "nvml_shim.c", SHIM_DIR / "nvml_probe.c", Path(__file__)]  # this file has the gcc flags
    key = hashlib.sha256(header.encode() + b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    out = _cache_dir() / key
    built = Built(nvml=out / f"libnvidia-ml.so.{version}", stubs={n: out / f"lib{n}.so.{version}" for n in STUB_LIBS},
                  probe=out / "nvml-probe")
    if all(p.exists() for p in (built.nvml, *built.stubs.values(), built.probe)):
        os.utime(out)
        return built
    _prune(out.parent, out)
    tmp = out.with_name(f"{key}.tmp.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "shim_devices.h").write_text(header)
    _gcc([*FREESTANDING, f"-I{tmp}", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(tmp / built.nvml.name),
          str(SHIM_DIR / "nvml_shim.c")])
    (tmp / "stub.c").write_text("/* a driver library of a simulated node: an ELF with a soname, no code */\n"
                                "void topo_simulated_driver_library(void) {}\n")
    for name, path in built.stubs.items():
        _gcc([*FREESTANDING, f"-Wl,-soname,{_soname(name)}", "-o", str(tmp / path.name), str(tmp / "stub.c")])
    # The link warns that a static dlopen needs the glibc it was linked with: only for libraries that need
    # libc, which the shim does not.
    _gcc(["-static", "-O2", "-Wall", "-o", str(tmp / "nvml-probe"), str(SHIM_DIR / "nvml_probe.c")])
    try:
        tmp.rename(out)
    except OSError:  # another process built the same key meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return built


@dataclass
class DriverRoot:
    """A built root: `path` for `--driver-root`/`--dev-root`, and what it holds (paths inside the root)."""

    path: Path
    version: str
    gpus: list[SimGpu]
    libraries: list[str] = field(default_factory=list)
    firmware: list[str] = field(default_factory=list)
    binaries: list[str] = field(default_factory=list)
    device_nodes: list[str] = field(default_factory=list)

    def host(self, inside: str) -> Path:
        return self.path / inside.lstrip("/")


def _mknod(path: Path, major: int, minor: int) -> None:
    try:
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))  # S_IFCHR
    except PermissionError:
        raise DriverRootError(f"mknod {path}: not permitted (the simulated driver root's /dev nodes need "
                              "root)") from None


def _soname(lib: str) -> str:
    return f"lib{lib}.so.1"


def build_driver_root(root: Path, gpus: Sequence[SimGpu], version: str = DRIVER_VERSION) -> DriverRoot:
    """Lay out a driver root for `gpus` under `root` (created; must not hold another root)."""
    parts = build_parts(gpus, str(root / "dev"), version)
    libdir = root / LIB_DIR
    libdir.mkdir(parents=True, exist_ok=True)
    out = DriverRoot(path=root, version=version, gpus=list(gpus))
    for lib, src in [("nvidia-ml", parts.nvml), *parts.stubs.items()]:
        versioned = libdir / f"lib{lib}.so.{version}"
        shutil.copyfile(src, versioned)
        os.symlink(versioned.name, libdir / _soname(lib))
        out.libraries.append(f"/{LIB_DIR}/{versioned.name}")
    os.symlink(_soname("cuda"), libdir / "libcuda.so")  # the development link the installer also leaves
    bindir = root / "usr" / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(parts.probe, bindir / "nvidia-smi")
    os.chmod(bindir / "nvidia-smi", 0o755)
    out.binaries.append("/usr/bin/nvidia-smi")
    fw = root / "lib" / "firmware" / "nvidia" / version
    fw.mkdir(parents=True, exist_ok=True)
    for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        (fw / name).write_bytes(b"simulated GSP firmware\n")
        out.firmware.append(f"/lib/firmware/nvidia/{version}/{name}")
    dev = root / "dev"
    dev.mkdir(exist_ok=True)
    nodes = [(f"nvidia{g.minor}", NVIDIA_MAJOR, g.minor) for g in gpus]
    nodes += [("nvidiactl", NVIDIA_MAJOR, 255), ("nvidia-uvm", UVM_MAJOR, 0), ("nvidia-uvm-tools", UVM_MAJOR, 1)]
    for name, major, minor in nodes:
        _mknod(dev / name, major, minor)
        out.device_nodes.append(f"/dev/{name}")
    return out
