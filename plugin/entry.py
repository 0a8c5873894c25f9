"""The console script's first code: signals are taken before anything slow is imported.

Why: in its container the daemon is PID 1, and the kernel ignores a signal sent to a namespace's PID 1
whose disposition is the default: until the event loop installs its handlers (plugin/runtime/signals.py),
a SIGTERM from the kubelet is dropped, and a daemon pod deleted in its first seconds (importing the
CLI, reading the config, discovering the node) waits out its whole grace period before the SIGKILL.
So, as PID 1, SIGTERM, SIGINT and SIGQUIT end the process at once (exit 128 + the signal, through
the ordinary `finally`s: nothing is being served yet) until the loop's own handlers replace these.
Elsewhere the defaults stay (they end the process anyway).
"""

from __future__ import annotations

import os
import signal
from types import FrameType

EARLY_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


def _exit_now(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    if os.getpid() == 1:
        for sig in EARLY_SIGNALS:
            signal.signal(sig, _exit_now)
    from .cli import main as cli_main  # noqa: PLC0415  (after the handlers: importing the CLI is the slow part)

    cli_main()
