"""The parts of the podman path of the kind e2e that need no cluster: the component-image
archive that the node preloads, the kind config written for this host, and the private podman
configuration. The cluster itself is test_kind.py."""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import resource
import sys
import tarfile
import tomllib

import yaml

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import component_images
import podman_env


def _read(tf: tarfile.TarFile, name: str | tarfile.TarInfo) -> bytes:
    f = tf.extractfile(name)
    assert f is not None, f"{name} is not a regular file in the archive"
    return f.read()


def _blob(tf: tarfile.TarFile, digest: str) -> bytes:
    return _read(tf, f"blobs/sha256/{digest.removeprefix('sha256:')}")


def test_component_archive_names_every_image_and_shares_the_base(tmp_path):
    base = tmp_path / "base.tar"
    with tarfile.open(base, "w") as tf:
        (tmp_path / "os-release").write_text("ID=debian\n")
        tf.add(tmp_path / "os-release", "etc/os-release")
    bins = {}
    for name in ("kube-apiserver", "etcd", "pause"):
        bins[name] = tmp_path / name
        bins[name].write_bytes(name.encode() * 100)
    comps = [component_images.Component("registry.k8s.io/kube-apiserver:v1.37.2", {"kube-apiserver": bins["kube-apiserver"]}),
             component_images.Component("registry.k8s.io/etcd:3.7.0-0", {"etcd": bins["etcd"]}),
             component_images.Component("registry.k8s.io/pause:3.10", {"pause": bins["pause"]},
                                        entrypoint=["/usr/local/bin/pause"], with_base=False)]
    out = tmp_path / "components.oci.tar"
    names = component_images.write_archive(out, base, comps, tmp_path)
    assert names == [c.name for c in comps]
    with tarfile.open(out) as tf:
        index = json.loads(_read(tf, "index.json"))
        # ctr images import names each image from this annotation.
        assert [m["annotations"]["io.containerd.image.name"] for m in index["manifests"]] == names
        base_digest = "sha256:" + hashlib.sha256(base.read_bytes()).hexdigest()
        layers_of = {}
        for m in index["manifests"]:
            manifest = json.loads(_blob(tf, m["digest"]))
            config = json.loads(_blob(tf, manifest["config"]["digest"]))
            digests = [layer["digest"] for layer in manifest["layers"]]
            # Uncompressed layers: each diff ID is the layer's own digest, and every blob is what it says.
            assert config["rootfs"]["diff_ids"] == digests
            for layer in manifest["layers"]:
                data = _blob(tf, layer["digest"])
                assert "sha256:" + hashlib.sha256(data).hexdigest() == layer["digest"]
                assert len(data) == layer["size"]
            assert "/usr/local/bin" in config["config"]["Env"][0]
            layers_of[m["annotations"]["io.containerd.image.name"]] = digests
        assert layers_of["registry.k8s.io/kube-apiserver:v1.37.2"][0] == base_digest
        assert layers_of["registry.k8s.io/etcd:3.7.0-0"][0] == base_digest
        assert base_digest not in layers_of["registry.k8s.io/pause:3.10"]
        # The base blob is stored once, not once per image.
        assert sum(1 for n in tf.getnames() if n == f"blobs/sha256/{base_digest[7:]}") == 1
        top = tarfile.open(fileobj=io.BytesIO(_blob(tf, layers_of["registry.k8s.io/etcd:3.7.0-0"][1])))
        member = top.getmember("usr/local/bin/etcd")
        assert member.mode == 0o755
        assert _read(top, member) == bins["etcd"].read_bytes()


def test_kind_config_for_this_host():
    import kind_cluster

    one = yaml.safe_load(kind_cluster.kind_config(1))
    assert [n["role"] for n in one["nodes"]] == ["control-plane"]
    assert one["nodes"][0]["labels"] == {"topo-e2e/gpu-node": "true"}
    assert one["networking"]["disableDefaultCNI"] is True
    two = yaml.safe_load(kind_cluster.kind_config(2))
    # Two nodes: exactly run.sh's own kind-config.yaml nodes (what Docker users get).
    assert two["nodes"] == yaml.safe_load((HERE / "kind-config.yaml").read_text())["nodes"]
    patches = [yaml.safe_load(p) for p in two["kubeadmConfigPatches"]]
    by_kind = {p["kind"]: p for p in patches}
    assert by_kind["KubeletConfiguration"]["failCgroupV1"] is False
    for k in ("InitConfiguration", "JoinConfiguration"):
        assert by_kind[k]["nodeRegistration"] == {"ignorePreflightErrors": ["SystemVerification"],
                                                  "imagePullPolicy": "Never"}
    assert by_kind["ClusterConfiguration"]["dns"] == {"disabled": True}


def test_podman_config_is_private_and_within_this_machines_limits(tmp_path):
    env = podman_env.PodmanEnv(tmp_path / "podman").env()
    conf = tomllib.loads(pathlib.Path(env["CONTAINERS_CONF"]).read_text())
    assert conf["engine"]["cgroup_manager"] == "cgroupfs"
    assert conf["engine"]["events_logger"] == "file"
    storage = tomllib.loads(pathlib.Path(env["CONTAINERS_STORAGE_CONF"]).read_text())
    assert storage["storage"]["graphroot"].startswith(str(tmp_path))
    limits = dict(u.split("=", 1) for u in conf["containers"]["default_ulimits"])
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, hard = (int(v) for v in limits[name].split(":"))
        cap = resource.getrlimit(which)[1]
        assert soft == hard and (cap == resource.RLIM_INFINITY or hard <= cap)
    assert tomllib.loads(pathlib.Path(env["CONTAINERS_REGISTRIES_CONF"]).read_text())["unqualified-search-registries"] == []
