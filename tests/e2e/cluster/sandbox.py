"""Private mount, network and UTS namespaces for a throwaway node, and containerd in them.

Why this shape: the kubelet hard-codes /var/lib/kubelet/device-plugins, containerd and the
CNI plugins write under /run, /var/lib and /var/log, and a cluster listens on well-known
ports. One *holder* process (`unshare --mount --net --uts --propagation private sleep`)
owns new namespaces; every daemon is started in them with `nsenter`, so nothing of this
machine's own /var/lib/kubelet, /run/containerd, /var/lib/cni or network is touched and
no port can clash. In the holder's mount namespace /var/lib, /var/log and /run are
overlays whose writable layer lies in the work directory, /var/lib/kubelet is a bind
mount of a work directory (the kubelet's disk statistics need a real filesystem there) and
/run/containerd is a tmpfs. Killing the holder last drops every mount and network link.

Every process is stopped by its PID, in the order the caller chooses; `close` then looks
for anything left in the namespaces (or below a process that was), kills it and reports it.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# containerd's configuration for every sandboxed node (the clusters' and the standalone kubelet's):
# its root, state and socket under the sandbox's work directory, CNI binaries and configs beside them.
CONTAINERD_CONFIG = """version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # This VM's root has no CAP_SYS_RESOURCE: runc cannot lower oom_score_adj to the
  # kubelet's -998 for sandboxes, so clamp it at containerd's own value.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{w}/cni-bin"
    conf_dir = "{w}/cni-conf"
"""

NODE_IP = "10.231.0.2"
NODE_CIDR = "10.231.0.2/24"
POD_SUBNET = "10.232.0.0/24"
OVERLAID = ("/var/lib", "/var/log", "/run")

def log(msg: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Gone(RuntimeError):
    """What `wait_for` waits on can no longer happen (the process died): stop polling."""


def wait_for(what: str, fn: Callable[[], T], timeout: float, interval: float = 0.5) -> T:
    """Poll `fn` until it returns something truthy; the deadline is generous on purpose."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = fn()
            if last:
                return last
        except (Gone, NameError, TypeError, AttributeError):
            raise  # the condition can no longer come true, or the check itself is wrong
        except Exception as e:  # noqa: BLE001 - keep polling, report the last error
            last = e
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def _ns(pid: int | str, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _ppid(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return None


def _cmdline(pid: int | str) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class Sandbox:
    """The holder and everything started in its namespaces."""

    def __init__(self, workdir: pathlib.Path, hostname: str = "topo-node", address: str | None = NODE_CIDR,
                 pod_subnet: str = POD_SUBNET, private_network: bool = True):
        """`address`: this node's address on a veth of its own (None: the caller links it, `link_to`);
        `pod_subnet`: its pods' addresses (one per node of a cluster, so routes between nodes can tell them apart);
        `private_network=False`: mount namespace only, for a machine whose own sandbox refuses network and UTS
        namespaces (the GPU machine may: scripts/device/real_gpu_check.sh probes); the ports are then this
        machine's, and `address` is ignored."""
        self.w = workdir
        self.hostname = hostname
        self.address = address
        self.pod_subnet = pod_subnet
        self.private_network = private_network
        self.kinds = ("mnt", "net", "uts") if private_network else ("mnt",)
        self.w.mkdir(parents=True, exist_ok=True)
        self.logs_dir = self.w / "logs"
        self.logs_dir.mkdir(exist_ok=True)
        self.holder: subprocess.Popen | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, list[pathlib.Path]] = {}
        self.namespaces: dict[str, str] = {}
        self.leftovers: list[str] = []
        self.cgroups_before = {str(p) for p in pathlib.Path("/sys/fs/cgroup").glob("*/k8s.io")}
        self.container_ids: set[str] = set()
        self.closed = False
        self._pins: list[int] = []
        self._released = False

    # ---- namespaces ----
    def start(self) -> None:
        flags = ["--mount", "--net", "--uts"] if self.private_network else ["--mount"]
        self.holder = subprocess.Popen(
            ["unshare", *flags, "--propagation", "private", "sleep", "infinity"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        own = {k: _ns("self", k) for k in self.kinds}
        wait_for("the namespace holder", lambda: all(_ns(self.holder.pid, k) not in (None, own[k]) for k in own), 30,
                 interval=0.05)
        # Only namespaces of its own: `members` must not count the whole machine's network as ours.
        self.namespaces = {k: _ns(self.holder.pid, k) for k in ("mnt", "net") if k in self.kinds}
        # Pinned open until `close` has seen them empty: a freed namespace's number can be given to a new one (another
        # worker's cluster), and `members` identifies ours by number.
        self._pins = [os.open(f"/proc/{self.holder.pid}/ns/{k}", os.O_RDONLY) for k in self.namespaces]
        log(f"holder pid {self.holder.pid}: {self.namespaces}")
        if self.private_network:
            self.sh("hostname", self.hostname)
        # This machine's mounts below the overlaid directories (a /run/netns left by `ip netns`, say)
        # would lie hidden under the overlays yet stay in the namespace's mount table, where a lookup
        # of a path's mount by name finds them first (containerd's check that a HostToContainer
        # source is a shared mount does): drop them here, in the holder's namespace only (its
        # mounts are private copies, the machine's own stay).
        for target in self.mounts_below(OVERLAID):
            self.sh("umount", "-l", target)
        for d in OVERLAID:
            name = d.strip("/").replace("/", "-")
            upper, work = self.w / "overlay" / name / "upper", self.w / "overlay" / name / "work"
            upper.mkdir(parents=True)
            work.mkdir(parents=True)
            self.sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={d},upperdir={upper},workdir={work}", d)
        kubelet_dir = self.w / "var-lib-kubelet"
        kubelet_dir.mkdir()
        self.sh("mkdir", "-p", "/var/lib/kubelet", "/run/containerd")
        self.sh("mount", "--bind", str(kubelet_dir), "/var/lib/kubelet")
        self.sh("mount", "-t", "tmpfs", "-o", "mode=0711", "tmpfs", "/run/containerd")
        if not self.private_network:
            return
        self.sh("ip", "link", "set", "lo", "up")
        if self.address is None:
            return
        # The node's address: this kernel has no dummy links, so one end of a veth pair.
        for argv in (["ip", "link", "add", "tdp-node", "type", "veth", "peer", "name", "tdp-peer"],
                     ["ip", "addr", "add", self.address, "dev", "tdp-node"],
                     ["ip", "link", "set", "tdp-node", "up"], ["ip", "link", "set", "tdp-peer", "up"],
                     ["ip", "route", "add", "default", "dev", "tdp-node"]):
            self.sh(*argv)

    def link_to(self, hub: Sandbox, name: str, cidr: str, hub_cidr: str) -> None:
        """Join this sandbox's network to `hub`'s (the control plane's) with a veth pair: `cidr` here,
        `hub_cidr` there, this side's default route through the hub, the hub's route to this node's pods
        through this side. Both sides forward (a new network namespace starts with forwarding off), so
        pods on this node reach the API server and the hub reaches this node's kubelet and pods."""
        assert self.holder is not None and hub.holder is not None
        here, there = cidr.split("/")[0], hub_cidr.split("/")[0]
        self.sh("ip", "link", "add", "tdp-up", "type", "veth", "peer", "name", name)
        self.sh("ip", "link", "set", name, "netns", str(hub.holder.pid))
        for argv in (["ip", "addr", "add", cidr, "dev", "tdp-up"], ["ip", "link", "set", "tdp-up", "up"],
                     ["ip", "route", "add", "default", "via", there],
                     ["sysctl", "-qw", "net.ipv4.ip_forward=1"]):
            self.sh(*argv)
        for argv in (["ip", "addr", "add", hub_cidr, "dev", name], ["ip", "link", "set", name, "up"],
                     ["ip", "route", "add", self.pod_subnet, "via", here],
                     ["sysctl", "-qw", "net.ipv4.ip_forward=1"]):
            hub.sh(*argv)

    def mounts_below(self, dirs: Iterable[str]) -> list[str]:
        """Mount points in the holder's namespace strictly below `dirs`, deepest first."""
        assert self.holder is not None
        targets = {line.split()[4] for line in pathlib.Path(f"/proc/{self.holder.pid}/mountinfo").read_text().splitlines()}
        below = [t for t in targets if any(t.startswith(d.rstrip("/") + "/") for d in dirs)]
        return sorted(below, key=lambda t: (-t.count("/"), t))

    def enter(self) -> list[str]:
        assert self.holder is not None
        flags = {"mnt": "-m", "net": "-n", "uts": "-u"}
        return ["nsenter", "-t", str(self.holder.pid), *(flags[k] for k in self.kinds), "--"]

    def sh(self, *argv: str, check: bool = True, timeout: float = 120, env: dict[str, str] | None = None,
           input: str | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([*self.enter(), *argv], capture_output=True, text=True, timeout=timeout,
                              env=None if env is None else {**os.environ, **env}, input=input)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start a daemon in the namespaces (nsenter execs it: the PID is the daemon's)."""
        n = len(self.logs.setdefault(name, [])) + 1
        logf = self.logs_dir / f"{name}-{n}.log"
        self.logs[name].append(logf)
        with open(logf, "w") as out:
            p = subprocess.Popen([*self.enter(), *argv], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env={**os.environ, **(env or {})}, start_new_session=True)
        self.procs[name] = p
        log(f"started {name} pid {p.pid} ({logf.name})")
        return p

    def running(self, name: str) -> bool:
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 60) -> int | None:
        """Signal one process by its PID and wait for it; SIGKILL after `timeout`."""
        p = self.procs.get(name)
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"{name} (pid {p.pid}) ignored {signal.Signals(sig).name} for {timeout:.0f}s: SIGKILL")
                p.kill()
                p.wait(30)
        return p.returncode

    @property
    def kubelet_dir(self) -> pathlib.Path:
        """What the namespaces see as /var/lib/kubelet (a bind mount of it): readable from outside."""
        return self.w / "var-lib-kubelet"

    def read_text(self, path: str) -> str:
        """A file as the namespaces see it (below the overlays, say /var/log/pods)."""
        return self.sh("cat", "--", path).stdout

    def glob(self, pattern: str) -> list[str]:
        """Paths matching a shell `pattern` as the namespaces see them, sorted; none: []."""
        out = self.sh("sh", "-c", f"for f in {pattern}; do [ -e \"$f\" ] && echo \"$f\"; done; true").stdout
        return sorted(out.split())

    def http_get(self, url: str, timeout: float = 5) -> str:
        """GET `url` from inside the network namespace (no curl needed: this interpreter does it); the body.
        Raises RuntimeError (with the reason) unless the answer is 200."""
        code = ("import sys,urllib.request;"
                f"sys.stdout.write(urllib.request.urlopen({url!r}, timeout={timeout!r}).read().decode())")
        return self.sh(sys.executable, "-c", code, timeout=timeout + 60).stdout

    def tail(self, name: str, lines: int = 30) -> str:
        files = self.logs.get(name) or []
        if not files:
            return f"(no log of {name})"
        text = files[-1].read_text(errors="replace").splitlines()[-lines:]
        return f"--- {files[-1].name}\n" + "\n".join(text)

    # ---- containerd ----
    @property
    def containerd_sock(self) -> str:
        return str(self.w / "containerd" / "containerd.sock")

    def pod_network(self) -> dict[str, Any]:
        """The cluster's pod network (a CNI conflist): a bridge with host-local addresses."""
        return {
            "cniVersion": "0.4.0", "name": "topo-e2e",
            "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                         "ipam": {"type": "host-local", "ranges": [[{"subnet": self.pod_subnet}]],
                                  "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.w / "cni-ipam")}}],
        }

    def start_containerd(self, cni_bin: pathlib.Path, pause_image: str, binary: str = "containerd",
                         cdi_dirs: Sequence[str] = (), nri_socket: str | None = None) -> None:
        """containerd (Debian's, or `binary`); `cdi_dirs`: enable CDI in its CRI plugin (containerd >= 1.7);
        `nri_socket`: turn NRI on with external plugins connecting there (containerd 2.x, where it is on
        by default: said explicitly, so the test does not lean on a default that 1.7 does not share)."""
        d = self.w / "containerd"
        d.mkdir(exist_ok=True)
        (d / "cni-bin").symlink_to(cni_bin)
        conf_dir = d / "cni-conf"
        conf_dir.mkdir(exist_ok=True)
        (conf_dir / "10-topo-e2e.conflist").write_text(json.dumps(self.pod_network(), indent=1))
        cfg = d / "config.toml"
        text = CONTAINERD_CONFIG.format(root=d / "root", state=d / "state", sock=self.containerd_sock,
                                        pause=pause_image, w=d)
        if cdi_dirs:
            anchor = "  restrict_oom_score_adj = true\n"
            assert anchor in text
            text = text.replace(anchor, anchor + f"  enable_cdi = true\n  cdi_spec_dirs = {json.dumps(list(cdi_dirs))}\n")
        if nri_socket:
            text += f'[plugins."io.containerd.nri.v1.nri"]\n  disable = false\n  socket_path = {json.dumps(nri_socket)}\n'
        cfg.write_text(text)
        # A containerd of our own finds its own runc shim first (containerd looks shims up in PATH).
        path = {"PATH": f"{os.path.dirname(binary)}:{os.environ.get('PATH', '')}"} if os.sep in binary else None
        self.spawn("containerd", [binary, "--config", str(cfg)], env=path)
        wait_for("containerd's socket", lambda: self.ctr("version", check=False).returncode == 0, 60)

    def ctr(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.sh("ctr", "--address", self.containerd_sock, "-n", "k8s.io", *args, check=check, timeout=timeout)

    def import_image(self, archive: pathlib.Path) -> None:
        self.ctr("images", "import", str(archive))

    def stop_containerd(self) -> None:
        """Kill what containerd still runs, then containerd, then its shims (they outlive it)."""
        if self.running("containerd"):
            ids = self.ctr("containers", "ls", "-q", check=False).stdout.split()
            self.container_ids.update(ids)
            for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
            for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                wait_for(f"task {task} to stop", lambda t=task: t not in self.ctr("tasks", "ls", "-q", check=False)
                         .stdout.split() or self.ctr("tasks", "delete", "-f", t, check=False).returncode == 0, 30)
            for c in ids:
                self.ctr("containers", "delete", c, check=False)
            # containerd tells a shim to shut down once its last task is deleted, a moment later
            # (containerd 2.x asynchronously): give it that moment while containerd still runs.
            self._wait_for_shims(5)
        self.stop("containerd")
        self._stop_shims()

    def _shims(self) -> list[str]:
        return [pid for pid in self.members() if "containerd-shim" in _cmdline(pid)]

    def _wait_for_shims(self, timeout: float) -> bool:
        try:
            wait_for("containerd's shims to exit", lambda: not self._shims(), timeout)
            return True
        except TimeoutError:
            return False

    def _stop_shims(self) -> None:
        """Shims outlive containerd by design (containers survive its restarts). Their tasks are
        deleted by now, so one still running is only waiting for a shutdown call that can no
        longer come (seen under load with containerd 2.x, and on the DRA clusters' nodes, which waited here 10 s each):
        stop it by its PID, as `ctr` would have, at once."""
        if self._wait_for_shims(1):
            return
        shims = self._shims()
        log(f"stopping containerd shims whose containers are gone: {shims}")
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
            for pid in self._shims():
                try:
                    os.kill(int(pid), sig)
                except OSError:
                    pass
            if self._wait_for_shims(wait):
                return

    # ---- teardown ----
    def members(self) -> list[str]:
        """PIDs in the holder's mount or network namespace, and everything below them.

        Only namespaces the holder owns count, and a namespace that cannot be read (a kernel thread's,
        PID 1's in some VMs) never matches: `close` SIGKILLs what this returns, so an unread namespace
        matching a missing one would take PID 1's descendants, the whole machine (it once did)."""
        ours = {k: v for k, v in self.namespaces.items() if v}
        if not ours or self._released:
            return []  # released: seen empty while pinned; the numbers may now be another sandbox's
        inside: set[str] = set()
        parents: dict[str, str | None] = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == str(os.getpid()):
                continue
            parents[pid] = _ppid(pid)
            if any(_ns(pid, kind) == ns for kind, ns in ours.items()):
                inside.add(pid)
        inside.discard("1")  # never this machine's init, whatever its namespaces read as
        grew = True
        while grew:
            grew = False
            for pid, ppid in parents.items():
                if pid not in inside and ppid in inside:
                    inside.add(pid)
                    grew = True
        return sorted(inside, key=int)

    def close(self, order: Iterable[str] = ()) -> None:
        """Stop `order` first (by PID, in that order), then the rest, containerd, the holder."""
        if self.closed:
            return
        self.closed = True
        for name in order:
            self.stop(name)
        for name in reversed(list(self.procs)):
            if name != "containerd":
                self.stop(name)
        self.stop_containerd()
        holder = self.holder
        if holder is not None:
            # Anything still in the namespaces now was not stopped by its PID: report it.
            for pid in self.members():
                if int(pid) != holder.pid:
                    self.leftovers.append(f"{pid} {_cmdline(pid)}")
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except OSError:
                        pass
            holder.kill()
            holder.wait(30)
            wait_for("the namespaces to empty", lambda: not self.members(), 60)
        for fd in self._pins:
            os.close(fd)
        self._pins = []
        self._released = True
        self._remove_cgroups()
        if self.leftovers:
            log(f"killed leftovers: {self.leftovers}")

    def _remove_cgroups(self) -> None:
        """containerd puts containers' cgroups in <controller>/k8s.io/<id>; remove ours."""
        for top in pathlib.Path("/sys/fs/cgroup").glob("*/k8s.io"):
            for cid in self.container_ids:
                d = top / cid
                if d.is_dir():
                    for dirpath, _, _ in os.walk(d, topdown=False):
                        try:
                            os.rmdir(dirpath)
                        except OSError:
                            pass
            if str(top) not in self.cgroups_before:
                try:
                    os.rmdir(top)
                except OSError:
                    pass


def host_mounts_under(path: pathlib.Path) -> list[str]:
    """Mount points of this (the host's) mount namespace at or below `path`."""
    out = []
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4]
        if target == str(path) or target.startswith(str(path) + "/"):
            out.append(target)
    return out


def tools_missing(tools: Iterable[str]) -> list[str]:
    return [t for t in tools if shutil.which(t) is None]
