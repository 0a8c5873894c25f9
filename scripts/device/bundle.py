"""The parts scripts/device/real_gpu_check.sh brings to a GPU machine that can reach nothing: find, pack, unpack.

    python3 scripts/device/bundle.py pack DIR      # here: xz-compressed binaries, images, wheels -> DIR (<= 60 MiB)
    python3 scripts/device/bundle.py unpack DIR W  # there: DIR -> W/bin, W/images, W/wheels
    python3 scripts/device/bundle.py locate W      # here, for --simulated: the same layout from the local caches

Parts: the kubelet (tests/kubelet/kubelet_build.py, current line), containerd v2 with its client ctr in
one binary (scripts/device/containerd; `ctr` is a link to it) and its runc shim (tests/e2e/dra), runc
(Debian's), NVIDIA's nvidia-ctk and nvidia-cdi-hook (tests/support/nvidia_ctk), Go programs built
stripped (STRIP=1), the busybox and pause images of the e2e, and wheels of our
runtime dependencies for the GPU machine's Python (3.12, manylinux x86-64). Our own code travels as the
working tree (PYTHONPATH), so no wheel of ours is needed. Everything is built here, cached, and
compressed; the device tool's whole transfer is limited to 64 MiB.
"""

from __future__ import annotations

import lzma
import re
import os
import pathlib
import shutil
import subprocess
import sys
from importlib import metadata

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "kubelet")]
LIMIT = 60 << 20  # leaves room for the working tree (~5 MiB) under the tool's 64 MiB
#: The GPU machine's Python (KINDS.md of the device tool: 3.12.3).
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def _go(script: list[str]) -> str:
    proc = subprocess.run(["bash", *script], cwd=ROOT, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "STRIP": "1"})
    if proc.returncode != 0:
        sys.exit(f"bundle: {' '.join(script)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def binaries() -> dict[str, str]:
    """name in the bundle -> built binary here (building what is not cached yet)."""
    import kubelet_build

    out = {"kubelet": str(kubelet_build.kubelet_binary())}
    gb = "scripts/go_build_cached.sh"
    out["containerd"] = _go([gb, "scripts/device/containerd", "containerd-ctr-v2"])
    out["containerd-shim-runc-v2"] = _go([gb, "tests/e2e/dra/containerd-shim", "runc-shim-v2-stripped"])
    out["nvidia-ctk"] = _go(["tests/support/nvidia_ctk/build.sh", "nvidia-ctk"])
    out["nvidia-cdi-hook"] = _go(["tests/support/nvidia_ctk/build.sh", "nvidia-cdi-hook"])
    runc = shutil.which("runc")
    if runc is None:
        sys.exit("bundle: runc is not installed (apt-get install runc; scripts/kubelet_tests.sh prepare does)")
    out["runc"] = runc
    return out


def images() -> dict[str, str]:
    import kubelet_build

    built = kubelet_build.e2e_images()
    return {"busybox.tar": str(built["busybox"]), "pause.tar": str(built["pause"])}


def runtime_requirements() -> list[str]:
    """`name==version` of every installed runtime dependency of the project, transitively (not test extras)."""
    from packaging.requirements import Requirement  # pip's own dependency, in any venv with pip

    seen: dict[str, str] = {}
    todo = ["topo-device-plugin"]
    while todo:
        dist = metadata.distribution(todo.pop())
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": "", "python_version": PYTHON_VERSION}):
                continue  # test extras, other platforms and Pythons
            name = req.name
            key = re.sub(r"[-_.]+", "-", name).lower()
            if key not in seen:
                seen[key] = metadata.version(name)
                todo.append(name)
    return [f"{n}=={v}" for n, v in sorted(seen.items())]


def pack(out: pathlib.Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    (out / "bin").mkdir(parents=True)
    (out / "images").mkdir()
    for name, path in binaries().items():
        with open(path, "rb") as src, lzma.open(out / "bin" / f"{name}.xz", "wb",
                                                preset=9 | lzma.PRESET_EXTREME) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    for name, path in images().items():
        shutil.copyfile(path, out / "images" / name)
    wheels = out / "wheels"
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           PYTHON_VERSION, "--implementation", "cp", *(f"--platform={p}" for p in PLATFORMS), "-d", str(wheels),
           *runtime_requirements()]
    subprocess.run(cmd, check=True, timeout=1800)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    for f in sorted(out.rglob("*")):
        if f.is_file():
            print(f"  {f.relative_to(out)}  {f.stat().st_size / 2**20:.1f} MiB")
    print(f"bundle: {out} {size / 2**20:.1f} MiB (limit {LIMIT >> 20} MiB)")
    if size > LIMIT:
        sys.exit("bundle: too large for the device tool's transfer")


def unpack(src: pathlib.Path, w: pathlib.Path) -> None:
    (w / "bin").mkdir(parents=True, exist_ok=True)
    for f in (src / "bin").glob("*.xz"):
        target = w / "bin" / f.name[:-3]
        with lzma.open(f, "rb") as s, open(target, "wb") as d:
            shutil.copyfileobj(s, d, 1 << 20)
        os.chmod(target, 0o755)
    _ctr_link(w / "bin")
    shutil.copytree(src / "images", w / "images", dirs_exist_ok=True)
    if (src / "wheels").is_dir():
        shutil.copytree(src / "wheels", w / "wheels", dirs_exist_ok=True)


def locate(w: pathlib.Path) -> None:
    for sub, parts in (("bin", binaries()), ("images", images())):
        (w / sub).mkdir(parents=True, exist_ok=True)
        for name, path in parts.items():
            target = w / sub / name
            target.unlink(missing_ok=True)
            os.symlink(path, target)
    _ctr_link(w / "bin")


def _ctr_link(bin_dir: pathlib.Path) -> None:
    """`ctr` is the containerd binary called by that name (scripts/device/containerd/main.go)."""
    (bin_dir / "ctr").unlink(missing_ok=True)
    os.symlink("containerd", bin_dir / "ctr")


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] not in ("pack", "unpack", "locate"):
        print(__doc__, file=sys.stderr)
        return 2
    if sys.argv[1] == "pack":
        pack(pathlib.Path(sys.argv[2]))
    elif sys.argv[1] == "unpack":
        unpack(pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]))
    else:
        locate(pathlib.Path(sys.argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
