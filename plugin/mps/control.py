"""Talking to `nvidia-cuda-mps-control`: start it as a daemon, send it commands, ask it to quit.

Why through the program and not its socket: the control pipe's wire format is
NVIDIA's and undocumented; the program's client mode (commands on stdin, one a
line, answers on stdout, a non-zero exit when no daemon answers) is the
documented interface (NVIDIA's MPS guide, "Tools and Interface Reference"), and
it is what NVIDIA's own device plugin uses (k8s-device-plugin
`cmd/mps-control-daemon/mps/daemon.go`: `-d` to start, `echo <command> |
nvidia-cuda-mps-control` for the rest).

Which daemon a command reaches is decided by the environment:
`CUDA_MPS_PIPE_DIRECTORY` (its control pipe) and `CUDA_MPS_LOG_DIRECTORY`
(`control.log`); `CUDA_VISIBLE_DEVICES` at start decides the GPUs its servers
may use. Every call here is blocking; callers run them in a worker thread.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: How long one command may take before the daemon counts as not answering.
COMMAND_TIMEOUT_S = 30.0


#: The longest path a unix socket may be bound at (`sun_path` is 108 bytes with its terminating NUL).
UNIX_PATH_MAX = 107


class MpsControlError(RuntimeError):
    """The control program could not be run, or the daemon did not answer; the message says which and why."""


@dataclass(frozen=True)
class DaemonSpec:
    """One control daemon: its directories, the GPUs it serves, the defaults it must be given."""

    #: Who the daemon is for (a shared resource, or a DRA GPU), for messages and logs.
    name: str
    pipe_dir: str
    log_dir: str
    #: GPU UUIDs, as `CUDA_VISIBLE_DEVICES` (empty: every GPU the program sees).
    gpus: tuple[str, ...] = ()
    #: `set_default_*` commands sent once the daemon answers, in order.
    defaults: tuple[str, ...] = field(default_factory=tuple)
    #: Started with `-M` (multi-user: clients of different UIDs share the daemon; NVIDIA's DRA `multiUser`).
    multi_user: bool = False

    @property
    def ready_file(self) -> str:
        """Written once the defaults are set (as NVIDIA's `.ready`, PR #1946), removed when it stops."""
        return os.path.join(os.path.dirname(self.pipe_dir.rstrip("/")), ".ready")

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["CUDA_MPS_PIPE_DIRECTORY"] = self.pipe_dir
        env["CUDA_MPS_LOG_DIRECTORY"] = self.log_dir
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        return env


def default_commands(limits: Sequence[tuple[int, int | None]], thread_percentage: int | None) -> tuple[str, ...]:
    """`set_default_device_pinned_mem_limit <ordinal> <MiB>M` per GPU with a known limit, then the thread share.

    The ordinal is the GPU's place in `CUDA_VISIBLE_DEVICES` (what the daemon numbers devices by).
    """
    out = [f"set_default_device_pinned_mem_limit {n} {mib}M" for n, mib in limits if mib]
    if thread_percentage:
        out.append(f"set_default_active_thread_percentage {thread_percentage}")
    return tuple(out)


class MpsControl:
    """The control program, by path or by name on PATH."""

    def __init__(self, binary: str = "nvidia-cuda-mps-control", timeout_s: float = COMMAND_TIMEOUT_S):
        self.binary = binary
        self.timeout_s = timeout_s

    def _run(self, spec: DaemonSpec, args: list[str], stdin: str | None) -> str:
        try:
            done = subprocess.run([self.binary, *args], input=stdin, capture_output=True, text=True,
                                  env=spec.env(), timeout=self.timeout_s, check=False)
        except FileNotFoundError:
            raise MpsControlError(f"{spec.name}: {self.binary} not found (fix: install NVIDIA's MPS control "
                                  "program in the image, or name it with --mps-control-binary)") from None
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MpsControlError(f"{spec.name}: {self.binary} {' '.join(args)}: {e}") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[-300:]
            raise MpsControlError(f"{spec.name}: {self.binary} {' '.join(args) or (stdin or '').strip()} exited "
                                  f"{done.returncode}: {said or 'no output'}")
        return done.stdout

    def start(self, spec: DaemonSpec) -> None:
        """`nvidia-cuda-mps-control -d` (`-d -M` multi-user) with the spec's environment (it returns once the
        daemon runs)."""
        # The daemon listens on a unix socket in its pipe directory: a path past the kernel's limit makes it
        # fail to start with no word of why, so say it here, with the option that sets the directory.
        control = os.path.join(spec.pipe_dir, "control")
        if len(os.fsencode(control)) > UNIX_PATH_MAX:
            raise MpsControlError(f"{spec.name}: the control daemon's socket {control} would be "
                                  f"{len(os.fsencode(control))} bytes, past the {UNIX_PATH_MAX} a unix socket path "
                                  "may have (fix: a shorter --mps-root)")
        os.makedirs(spec.pipe_dir, mode=0o755, exist_ok=True)
        os.makedirs(spec.log_dir, mode=0o755, exist_ok=True)
        # The clients' /dev/shm (plugin.model.mps_allocate); the chart mounts it at the daemon's /dev/shm too.
        # Every client creates its segments there, whatever its user (an image's non-root user included), so it
        # must be world-writable with the sticky bit, as a /dev/shm tmpfs is (NVIDIA's plugin mounts one): a
        # chmod, since makedirs' mode goes through the umask and the chart's hostPath makes it 0755 first.
        shm = os.path.join(os.path.dirname(os.path.dirname(spec.pipe_dir.rstrip("/"))), "shm")
        os.makedirs(shm, exist_ok=True)
        os.chmod(shm, 0o1777)
        self._run(spec, ["-d", "-M"] if spec.multi_user else ["-d"], None)

    def command(self, spec: DaemonSpec, text: str) -> str:
        """One command to the spec's daemon; its answer. Raises `MpsControlError` when none answers."""
        return self._run(spec, [], text + "\n")

    def probe(self, spec: DaemonSpec) -> bool:
        """Whether the daemon answers (`get_server_list`: cheap, and starts no MPS server)."""
        try:
            self.command(spec, "get_server_list")
        except MpsControlError:
            return False
        return True

    def configure(self, spec: DaemonSpec) -> None:
        """Send the defaults, then write the ready file."""
        for c in spec.defaults:
            self.command(spec, c)
        with open(spec.ready_file, "w", encoding="utf-8") as f:
            f.write("ready\n")

    def quit(self, spec: DaemonSpec) -> None:
        """Ask the daemon to quit (nothing to do if none answers); the ready file goes first."""
        try:
            os.unlink(spec.ready_file)
        except FileNotFoundError:
            pass
        if self.probe(spec):
            self.command(spec, "quit")
