"""A private podman for the kind e2e: its own configuration, storage and namespaces.

Why: this machine's podman configuration is not ours to change, PID 1 is not systemd (so
podman must use the cgroupfs manager and a file events log), and a kind cluster's bridge,
addresses and iptables rules must not touch the machine's network. So podman always runs with
CONTAINERS_CONF / CONTAINERS_STORAGE_CONF / CONTAINERS_REGISTRIES_CONF pointing at files under
the cache, and inside a *holder*: one `unshare --mount --net --uts` process whose namespaces
every podman (and kind, kubectl, helm) call enters with nsenter. In the holder /run is a fresh
tmpfs (podman's run root, netavark's state), so killing the holder drops every network link,
mount and run-time state at once. The image store (graphroot) stays in the cache: the node
image is built once and reused.
"""

from __future__ import annotations

import os
import pathlib
import resource
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

CONTAINERS_CONF = """# written by tests/e2e/kind/podman_env.py
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{run}/events.log"
runtime = "runc"
network_cmd_options = []
image_copy_tmp_dir = "{tmp}"
[network]
network_backend = "netavark"
network_config_dir = "{run}/networks"
[containers]
log_driver = "k8s-file"
# podman raises a container's open-file limit to 1048576 by default; root here has no
# CAP_SYS_RESOURCE to go above its own hard limit, so runc would fail to start the node.
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]
"""

STORAGE_CONF = """# written by tests/e2e/kind/podman_env.py
[storage]
driver = "overlay"
graphroot = "{graphroot}"
runroot = "{run}/storage"
"""

# No search registries: a short name never resolves to a remote registry.
REGISTRIES_CONF = """# written by tests/e2e/kind/podman_env.py
unqualified-search-registries = []
short-name-mode = "permissive"
"""


#: Above about 50000 processes runc's setrlimit was refused here although the shell's hard
#: limit reads 96365 (found by trial: 32768 starts, 50000 does not); 32768 is plenty for a node.
NPROC_CEILING = 32768


def _hard_limit(which: int, ceiling: int) -> int:
    """This process's hard limit, or `ceiling` where it is unlimited."""
    hard = resource.getrlimit(which)[1]
    return ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)


@dataclass
class PodmanEnv:
    """The files and environment of the private podman; `root` is under the cache."""

    root: pathlib.Path
    run_dir: str = "/run/topo-kind"

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "tmp").mkdir(exist_ok=True)
        files = {
            "containers.conf": CONTAINERS_CONF.format(run=self.run_dir, tmp=self.root / "tmp",
                                                      nofile=_hard_limit(resource.RLIMIT_NOFILE, 1048576),
                                                      nproc=_hard_limit(resource.RLIMIT_NPROC, NPROC_CEILING)),
            "storage.conf": STORAGE_CONF.format(graphroot=self.root / "storage", run=self.run_dir),
            "registries.conf": REGISTRIES_CONF,
        }
        for name, text in files.items():
            p = self.root / name
            if not p.exists() or p.read_text() != text:
                p.write_text(text)

    def env(self) -> dict[str, str]:
        return {
            "CONTAINERS_CONF": str(self.root / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(self.root / "storage.conf"),
            "CONTAINERS_REGISTRIES_CONF": str(self.root / "registries.conf"),
            "TMPDIR": str(self.root / "tmp"),
            "KIND_EXPERIMENTAL_PROVIDER": "podman",
        }


@dataclass
class Holder:
    """Private mount, network and UTS namespaces, kept alive by one `sleep` process."""

    proc: subprocess.Popen | None = None
    pid: int = 0
    _own: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--net", "--uts", "--propagation", "private", "sleep", "infinity"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.proc.pid
        own = {k: os.readlink(f"/proc/self/ns/{k}") for k in ("mnt", "net")}
        deadline = time.monotonic() + 30
        while any(self._ns(k) in (None, own[k]) for k in own):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the namespace holder did not start (exit {self.proc.poll()})")
            time.sleep(0.05)
        self.sh(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run"])
        self.sh(["ip", "link", "set", "lo", "up"])
        self.sh(["hostname", "topo-kind"])

    def _ns(self, kind: str) -> str | None:
        try:
            return os.readlink(f"/proc/{self.pid}/ns/{kind}")
        except OSError:
            return None

    def enter(self) -> list[str]:
        return ["nsenter", "-t", str(self.pid), "-m", "-n", "-u", "--"]

    def sh(self, argv: Sequence[str], env: dict[str, str] | None = None, check: bool = True,
           timeout: float = 600, input_bytes: bytes | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([*self.enter(), *argv], capture_output=True, timeout=timeout, input=input_bytes,
                              env={**os.environ, **(env or {})})
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n"
                               f"{proc.stdout.decode(errors='replace')[-3000:]}\n"
                               f"{proc.stderr.decode(errors='replace')[-5000:]}")
        return proc

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
