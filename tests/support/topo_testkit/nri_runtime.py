"""NRI's real runtime side as a subprocess (tests/support/nri_runtime), for tests/nri and benchmarks/nri_bench.py.

The Go program wraps containerd/nri v0.8.0's pkg/adaptation (what containerd
v2.1.4 runs) and is driven by JSON lines: commands in, replies and events out,
in order. `build()` builds it once through scripts/go_build_cached.sh.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "tests" / "support" / "nri_runtime" / "build.sh"
#: Generous safety net for one expected event on a busy 2-core machine; never a timing assertion.
WAIT_S = 60.0


def build() -> tuple[str | None, str]:
    """(path of the binary, "") or (None, why it could not be built)."""
    proc = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True)
    if proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.strip().splitlines()[-1], ""
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
    return None, f"cannot build nri-runtime ({BUILD} exited {proc.returncode}):\n{tail}"


class Runtime:
    """The Go NRI runtime as a subprocess: commands in, replies and events out, in order."""

    def __init__(self, proc: asyncio.subprocess.Process, log_path: Path):
        self.proc = proc
        self.log_path = log_path
        self.lines: list[dict[str, Any]] = []
        self._seen = 0  # lines already handed to a waiter
        self._changed = asyncio.Condition()
        self._pump = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, binary: str, socket_path: str, pods: list[dict[str, Any]] | None = None) -> Runtime:
        """A runtime listening on `socket_path`, knowing `pods` from the start (as after a restart)."""
        log_path = Path(socket_path).parent / f"runtime-{os.urandom(4).hex()}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(binary, "-socket", socket_path, "-pods", json.dumps(pods or []),
                                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        rt = cls(proc, log_path)
        await rt.next_event("listening")
        return rt

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            async with self._changed:
                self.lines.append(json.loads(raw))
                self._changed.notify_all()

    async def _next(self, pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """The first line after the last one returned that satisfies `pred`."""
        async def find() -> dict[str, Any]:
            async with self._changed:
                while True:
                    for i in range(self._seen, len(self.lines)):
                        if pred(self.lines[i]):
                            self._seen = i + 1
                            return self.lines[i]
                    if self.proc.returncode is not None or self._pump.done():
                        raise AssertionError(f"nri-runtime exited waiting for {what}; it said {self.lines}\n"
                                             f"{self.log()}")
                    await self._changed.wait()

        try:
            return await asyncio.wait_for(find(), WAIT_S)
        except TimeoutError:
            raise AssertionError(f"no {what} from nri-runtime; it said {self.lines}\n{self.log()}") from None

    def log(self) -> str:
        """What NRI's runtime logged (stderr)."""
        return self.log_path.read_text(errors="replace")

    async def next_event(self, name: str) -> dict[str, Any]:
        return await self._next(lambda line: line.get("event") == name, f"event {name!r}")

    async def reply(self, cmd: str, **fields: Any) -> dict[str, Any]:
        """Send a command; the runtime's whole reply (error, and `us`: microseconds it spent on it)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"cmd": cmd, **fields}) + "\n").encode())
        await self.proc.stdin.drain()
        return await self._next(lambda line: line.get("reply") == cmd, f"reply to {cmd}")

    async def command(self, cmd: str, **fields: Any) -> str:
        """Send a command; the error the runtime got doing it ("" for none)."""
        return (await self.reply(cmd, **fields))["error"]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("event") == name]

    async def close(self) -> None:
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b'{"cmd": "quit"}\n')
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), WAIT_S)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        await self._pump
