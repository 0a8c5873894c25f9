"""A reader that went away (`topo-device-plugin discover | head -1`) ends a command quietly.

Why: `head`, `grep -q` and pagers close the pipe once they have what they
want; the next write then fails with EPIPE. That is the reader's choice, not
a bug, so it must not print a traceback or "internal error". We exit like
other Unix filters killed by SIGPIPE do, with status 141 (128 + SIGPIPE),
nothing on stderr, so `set -o pipefail` scripts see the usual code. We do not
restore SIGPIPE's default action instead: the daemon writes to sockets, and
a peer closing one must be an error it handles, not its death.

Only a broken pipe on our own stdout/stderr counts: an EPIPE from a socket
is still routed as a bug (`routing.Command`).
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import sys
from collections.abc import Iterator
from typing import TextIO

import click

#: The status a shell reports for a filter killed by SIGPIPE.
EXIT_CLOSED_PIPE = 141


def _gone(stream: TextIO | None) -> bool:
    """The stream is a pipe or socket whose reader has closed it (poll reports an error or hang-up)."""
    try:
        fd = stream.fileno() if stream is not None else -1
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False  # not a real file (e.g. a test runner's buffer)
    if fd < 0:
        return False
    poller = select.poll()
    poller.register(fd, 0)  # errors and hang-ups are always reported
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _to_devnull(stream: TextIO) -> None:
    """Point the stream's descriptor at /dev/null, so the interpreter's final flush cannot fail loudly
    (the Python docs' recipe for SIGPIPE)."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, stream.fileno())
    finally:
        os.close(null)


@contextlib.contextmanager
def quiet_on_closed_pipe() -> Iterator[None]:
    """Turn a BrokenPipeError on our closed stdout/stderr into a quiet exit 141; re-raise any other."""
    try:
        yield
    except BrokenPipeError:
        gone = [s for s in (sys.stdout, sys.stderr) if _gone(s)]
        if not gone:
            raise
        for stream in gone:
            _to_devnull(stream)
        raise click.exceptions.Exit(EXIT_CLOSED_PIPE) from None
