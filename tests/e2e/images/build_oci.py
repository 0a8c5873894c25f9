"""Build tiny OCI image archives locally (no registry, no Docker).

Two images are built for the real-kubelet e2e test:

* ``localhost/topo-e2e/busybox:1.35`` — Debian's ``busybox-static`` binary with its applet
  links, used as the test pod's container;
* the pod sandbox image (name given by the caller, by default ``registry.k8s.io/pause:3.10``:
  only a name, which containerd's ``sandbox_image`` points at; no kubelet version pins it)
  holding a static Go "pause" binary.

The archive is an OCI image layout tarball (``oci-layout``, ``index.json``, ``blobs/sha256``)
that ``ctr images import`` accepts; ``io.containerd.image.name`` in the index names the image.
Everything is deterministic (fixed mtimes, sorted entries), so the same inputs give the same
digests and the cache can key on them.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

EPOCH = 0
BUSYBOX_APPLETS = [
    "sh", "ash", "cat", "echo", "env", "ls", "sleep", "true", "false", "ls", "mkdir",
    "test", "grep", "sed", "awk", "head", "tail", "wc", "tr", "cut", "sort", "id", "date",
]


def _tar_layer(entries: list[tuple[str, str, bytes | str, int]]) -> bytes:
    """entries: (path, kind 'file'|'dir'|'symlink', data-or-target, mode) → uncompressed tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for path, kind, data, mode in sorted(entries, key=lambda e: e[0]):
            ti = tarfile.TarInfo(path)
            ti.mtime = EPOCH
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = "root"
            ti.mode = mode
            if kind == "dir":
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            elif kind == "symlink":
                ti.type = tarfile.SYMTYPE
                ti.linkname = str(data)
                tf.addfile(ti)
            else:
                assert isinstance(data, bytes)
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _blob(out: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    ti = tarfile.TarInfo(f"blobs/sha256/{digest}")
    ti.size = len(data)
    ti.mtime = EPOCH
    ti.mode = 0o644
    out.addfile(ti, io.BytesIO(data))
    return "sha256:" + digest


def write_image(dest: Path, name: str, layer_entries, entrypoint, cmd=None, env=None) -> str:
    """Write an OCI archive for one single-layer linux/amd64 image; return the manifest digest."""
    raw = _tar_layer(layer_entries)
    gz = gzip.compress(raw, compresslevel=6, mtime=0)
    diff_id = "sha256:" + hashlib.sha256(raw).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": entrypoint,
            "Cmd": cmd,
            "Env": env or ["PATH=/bin:/usr/bin:/sbin:/usr/sbin"],
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "tests/e2e/images/build_oci.py"}],
    }
    cfg = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as out:
        layer_d = _blob(out, gz)
        cfg_d = _blob(out, cfg)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": cfg_d, "size": len(cfg)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": layer_d, "size": len(gz)}],
        }
        man = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        man_d = _blob(out, man)
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": man_d, "size": len(man),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": name,
                                "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]},
            }],
        }
        for fname, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                            ("index.json", json.dumps(index, sort_keys=True).encode())):
            ti = tarfile.TarInfo(fname)
            ti.size = len(data)
            ti.mtime = EPOCH
            ti.mode = 0o644
            out.addfile(ti, io.BytesIO(data))
    os.replace(tmp, dest)
    return man_d


def busybox_entries(busybox: Path):
    data = busybox.read_bytes()
    entries = [("bin", "dir", b"", 0o755), ("tmp", "dir", b"", 0o1777), ("etc", "dir", b"", 0o755),
               ("dev", "dir", b"", 0o755), ("proc", "dir", b"", 0o755), ("sys", "dir", b"", 0o755),
               ("bin/busybox", "file", data, 0o755),
               ("etc/passwd", "file", b"root:x:0:0:root:/:/bin/sh\n", 0o644),
               ("etc/group", "file", b"root:x:0:\n", 0o644)]
    entries += [(f"bin/{a}", "symlink", "busybox", 0o777) for a in sorted(set(BUSYBOX_APPLETS))]
    return entries


def pause_entries(pause: Path):
    return [("pause", "file", pause.read_bytes(), 0o755)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busybox", type=Path, default=Path("/bin/busybox"))
    ap.add_argument("--pause-bin", type=Path, required=True)
    ap.add_argument("--busybox-name", default="localhost/topo-e2e/busybox:1.35")
    ap.add_argument("--pause-name", default="registry.k8s.io/pause:3.10")
    ap.add_argument("--out", type=Path, required=True, help="directory for busybox.tar and pause.tar")
    a = ap.parse_args(argv)
    # Debian's busybox-static must be a static binary, or the image would need a libc.
    info = subprocess.run(["file", "-L", str(a.busybox)], capture_output=True, text=True).stdout \
        if Path("/usr/bin/file").exists() else ""
    if info and "statically linked" not in info and "static-pie" not in info:
        print(f"{a.busybox} is not static ({info.strip()}); install busybox-static", file=sys.stderr)
        return 2
    d1 = write_image(a.out / "busybox.tar", a.busybox_name, busybox_entries(a.busybox),
                     entrypoint=None, cmd=["/bin/sh"])
    d2 = write_image(a.out / "pause.tar", a.pause_name, pause_entries(a.pause_bin),
                     entrypoint=["/pause"])
    print(json.dumps({"busybox": {"name": a.busybox_name, "digest": d1},
                      "pause": {"name": a.pause_name, "digest": d2}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
