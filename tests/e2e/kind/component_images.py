"""The component images a kind node preloads (kube-apiserver, etcd, kube-proxy, pause, ...).

kubeadm runs every control-plane component, and kube-proxy, as a pod of an image it names
itself (`kubeadm config images list`). Here there is no registry, so this writes one OCI
image-layout archive holding all of them under exactly those names: a shared bookworm layer
(glibc, which the cgo-built binaries link; iptables for kube-proxy) and one small layer per
binary in /usr/local/bin (the static pods call `kube-apiserver` and `etcd` by bare name).
`ctr -n k8s.io images import` takes every image from it at once, sharing the base blob.
Layers are left uncompressed: containerd accepts them and the 2-core build saves the CPU.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass

LAYER = "application/vnd.oci.image.layer.v1.tar"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Component:
    """One image: its full name, the binaries it carries (name in the image -> file here)."""

    name: str
    binaries: dict[str, pathlib.Path]
    entrypoint: list[str] | None = None
    with_base: bool = True


def _sha256_file(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _binary_layer(binaries: dict[str, pathlib.Path], dest: pathlib.Path) -> None:
    """A tar layer with each binary at usr/local/bin/<name> (fixed owner and mtime: same input, same digest)."""
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tf:
        for d in ("usr", "usr/local", "usr/local/bin"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 0
            tf.addfile(ti)
        for name, src in sorted(binaries.items()):
            ti = tarfile.TarInfo(f"usr/local/bin/{name}")
            ti.size, ti.mode, ti.mtime = src.stat().st_size, 0o755, 0
            with open(src, "rb") as f:
                tf.addfile(ti, f)


def _add_bytes(out: tarfile.TarFile, data: bytes, written: set[str]) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    if digest not in written:
        ti = tarfile.TarInfo(f"blobs/sha256/{digest}")
        ti.size, ti.mtime, ti.mode = len(data), 0, 0o644
        out.addfile(ti, io.BytesIO(data))
        written.add(digest)
    return "sha256:" + digest, len(data)


def _add_file(out: tarfile.TarFile, path: pathlib.Path, written: set[str]) -> tuple[str, int]:
    digest = _sha256_file(path)
    size = path.stat().st_size
    if digest not in written:
        ti = tarfile.TarInfo(f"blobs/sha256/{digest}")
        ti.size, ti.mtime, ti.mode = size, 0, 0o644
        with open(path, "rb") as f:
            out.addfile(ti, f)
        written.add(digest)
    return "sha256:" + digest, size


def write_archive(dest: pathlib.Path, base_layer: pathlib.Path, components: Iterable[Component],
                  workdir: pathlib.Path) -> list[str]:
    """Write every component into one OCI archive at `dest`; return the image names written."""
    written: set[str] = set()
    manifests = []
    names = []
    with tarfile.open(dest, "w") as out:
        base_digest, base_size = _add_file(out, base_layer, written)
        for c in components:
            layer_path = workdir / (hashlib.sha256(c.name.encode()).hexdigest()[:12] + ".tar")
            _binary_layer(c.binaries, layer_path)
            layer_digest, layer_size = _add_file(out, layer_path, written)
            layer_path.unlink()
            layers = ([(base_digest, base_size)] if c.with_base else []) + [(layer_digest, layer_size)]
            config = {
                "architecture": "amd64", "os": "linux",
                "config": {"Env": [PATH_ENV], "Entrypoint": c.entrypoint, "WorkingDir": "/"},
                # An uncompressed layer's diff ID is its own digest.
                "rootfs": {"type": "layers", "diff_ids": [d for d, _ in layers]},
                "history": [{"created_by": "tests/e2e/kind/component_images.py"}],
            }
            cfg_digest, cfg_size = _add_bytes(out, json.dumps(config, sort_keys=True).encode(), written)
            manifest = {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg_digest,
                           "size": cfg_size},
                "layers": [{"mediaType": LAYER, "digest": d, "size": s} for d, s in layers],
            }
            man_digest, man_size = _add_bytes(out, json.dumps(manifest, sort_keys=True).encode(), written)
            manifests.append({
                "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": man_digest, "size": man_size,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": c.name,
                                "org.opencontainers.image.ref.name": c.name.rsplit(":", 1)[-1]},
            })
            names.append(c.name)
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests}
        for fname, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                            ("index.json", json.dumps(index, sort_keys=True).encode())):
            ti = tarfile.TarInfo(fname)
            ti.size, ti.mtime, ti.mode = len(data), 0, 0o644
            out.addfile(ti, io.BytesIO(data))
    os.sync()
    return names
