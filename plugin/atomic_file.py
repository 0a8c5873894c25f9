"""Replace a file's content in one step: readers see the old file or the new one, never a part.

Why one helper: the DRA checkpoint and the NFD label file are both rewritten
whole while other processes read them (the kubelet's plugin, NFD's worker).
Both write a temp file beside the target and rename it over the target; the
checkpoint also needs the data and the rename on disk before it answers the
kubelet (`durable`), the label file does not. A leaf: it imports nothing of ours.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

__all__ = ["replace_file"]


def replace_file(path: str, text: str, *, mode: int, prefix: str, durable: bool) -> None:
    """Write `text` to `path` through a temp file in the same directory and a rename.

    `durable`: fsync the data before the rename and the directory after it, so a
    crash leaves the old or the new file. Raises OSError with the temp file removed.
    """
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
