"""Is the host's IMEX daemon ready? Asked before a claim's IMEX channel is handed out (host-managed IMEX).

Why: a channel is only useful while the host's `nvidia-imex` serves the node's NVLink domain; a pod given a
channel while that daemon is down or still forming the domain fails later inside CUDA with an error far from
the cause. NVIDIA's DRA driver (dra-driver-nvidia-gpu v0.5.0, `HostManagedIMEXDaemon`,
cmd/compute-domain-kubelet-plugin `checkHostIMEXReady`) therefore runs `nvidia-imex-ctl -q --u=<socket>` at
prepare of a channel claim ("query the status of the IMEX daemon once and return", over the daemon's command
socket, `IMEX_CMD_UNIX_DOMAIN_PATH` of /etc/nvidia-imex/config.cfg) and fails the prepare, which the kubelet
retries, unless it answers READY. We do the same, with two differences said here so nobody is surprised:

- the program is run as this process finds it (`--imex-control-binary`: a name looked up on PATH or a path,
  e.g. the host's binary mounted into the pod), not chrooted into the driver root (that needs privileges
  this daemon does not otherwise use);
- the answer must be READY as its first line, as NVIDIA's compute-domain daemon checks it, not merely
  contain READY (NVIDIA's kubelet plugin's substring test would also take a "NOT READY").

The check is bounded (`timeout_s`) and never raises: `problem()` says what is wrong and the fix, or None.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

#: NVIDIA's default command socket of the host daemon (its chart's `hostSocketPath`).
DEFAULT_SOCKET = "/etc/nvidia-imex/imex_ctrl.sock"
DEFAULT_BINARY = "nvidia-imex-ctl"
#: Bytes of the program's answer kept (its status line is short; a runaway program is not read further).
_OUTPUT_LIMIT = 4096
_NOT_READY_FIX = ("start or repair the host's nvidia-imex service (systemctl status nvidia-imex; its "
                  "/etc/nvidia-imex/config.cfg needs IMEX_CMD_ENABLED=1 and IMEX_CMD_UNIX_DOMAIN_PATH={socket}, "
                  "the path --imex-control-socket names); the kubelet retries the prepare")


@dataclass(frozen=True)
class ImexReadiness:
    """How the host's IMEX daemon is asked: its control program and command socket."""

    binary: str = DEFAULT_BINARY
    socket: str = DEFAULT_SOCKET
    timeout_s: float = 10.0

    @property
    def command(self) -> tuple[str, ...]:
        return (self.binary, "-q", f"--u={self.socket}")

    async def problem(self) -> str | None:
        """None when the daemon answers READY; otherwise its state, what was run, and the fix."""
        shown = " ".join(self.command)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT)
        except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
            return (f"the host's IMEX daemon cannot be asked: {self.binary} {_start_failure(e)} (fix: install "
                    "nvidia-imex on the host and give this daemon its nvidia-imex-ctl, e.g. the host's binary "
                    "mounted into the pod and named by --imex-control-binary; or --imex-control-binary '' to hand "
                    "channels out unchecked)")
        except OSError as e:
            return f"the host's IMEX daemon cannot be asked: {shown} failed to start: {e.strerror or e}"
        try:
            async with asyncio.timeout(self.timeout_s):
                raw = await _read_bounded(proc)
                rc = await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return (f"the host's IMEX daemon did not answer: {shown} gave no answer within {self.timeout_s:g} s "
                    f"(fix: {_NOT_READY_FIX.format(socket=self.socket)})")
        text = raw.decode("utf-8", "replace").strip()
        first = text.splitlines()[0].strip() if text else ""
        if rc == 0 and first == "READY":
            return None
        said = repr(text[-300:]) if text else "nothing"
        state = f"exited with status {rc} and said {said}" if rc != 0 else f"answered {said}, not READY"
        return f"the host's IMEX daemon is not ready: {shown} {state} (fix: {_NOT_READY_FIX.format(socket=self.socket)})"


async def _read_bounded(proc: asyncio.subprocess.Process) -> bytes:
    """The program's output to its end, or its first `_OUTPUT_LIMIT` bytes (the program is then stopped)."""
    assert proc.stdout is not None  # stdout=PIPE
    out = b""
    while len(out) < _OUTPUT_LIMIT:
        chunk = await proc.stdout.read(_OUTPUT_LIMIT - len(out))
        if not chunk:
            return out
        out += chunk
    with contextlib.suppress(ProcessLookupError):
        proc.kill()  # a runaway answer: what was read says enough
    return out


def _start_failure(e: OSError) -> str:
    if isinstance(e, FileNotFoundError):
        return "was not found (no such file, or not on PATH)"
    if isinstance(e, PermissionError):
        return "cannot be run (permission denied: not executable?)"
    return f"cannot be run ({e.strerror or e})"
