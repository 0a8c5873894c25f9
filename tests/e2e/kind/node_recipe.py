"""What the kind node image and its component images are made of (no code, only data).

Kept apart from node_image.py so that a recipe change is one small diff, and so that the
cache keys (a hash of these dictionaries) are easy to see.
"""

from __future__ import annotations

KUBERNETES_VERSION = "v1.37.2"
#: The node image's name in the private podman storage; kind is given it with --image.
NODE_IMAGE = f"localhost/kind-node:{KUBERNETES_VERSION}"

SOURCES = [
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
]
PATH_EXCLUDE = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
                "/usr/share/lintian/*", "/usr/share/bash-completion/*"]

#: The node's root filesystem: bookworm, because its systemd (252) still boots on a cgroup v1
#: host (systemd 256 and later refuse a legacy hierarchy); the userland kind's base image has,
#: less NFS/iSCSI/fuse (no test uses them), plus runc and the CNI plugins from Debian.
ROOTFS_RECIPE = {
    "suite": "bookworm",
    "variant": "minbase",
    "sources": SOURCES,
    "packages": ["systemd", "systemd-sysv", "dbus", "conntrack", "iptables", "nftables", "iproute2",
                 "ethtool", "util-linux", "mount", "kmod", "libseccomp2", "e2fsprogs", "bash",
                 "ca-certificates", "procps", "runc", "containernetworking-plugins"],
    "path_exclude": PATH_EXCLUDE,
}

#: The one layer every component image (kube-apiserver, etcd, kube-proxy, ...) shares: the
#: component binaries are cgo builds linked against glibc, and kube-proxy runs iptables.
COMPONENT_BASE_RECIPE = {
    "suite": "bookworm",
    "variant": "minbase",
    "sources": SOURCES,
    "packages": ["ca-certificates", "iptables", "nftables", "conntrack"],
    "path_exclude": PATH_EXCLUDE,
}

#: containerd's sandbox image in the node (etc/containerd/config.toml); kubeadm names its own pause tag too.
SANDBOX_IMAGE = "registry.k8s.io/pause:3.10"
