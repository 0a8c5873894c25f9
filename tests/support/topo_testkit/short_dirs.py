"""A short temporary directory for unix sockets: the one place tests make one.

Why: a unix socket path is limited to 107 bytes (108 with the NUL in
`sun_path`), and pytest's `tmp_path` (`/tmp/pytest-of-<user>/pytest-<n>/<test
name>0/`) easily passes that once a kubelet plugin directory and a socket name
are added. A directory straight under /tmp, named `tdp-` and 8 random
characters (17 bytes), leaves ~90 bytes for what goes in it. /tmp explicitly,
not $TMPDIR, which may itself be long.

`tests/conftest.py` offers it as the `short_tmp` fixture; code that is not a
fixture (a benchmark, a helper class) uses `short_tmp_dir()` directly.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator

#: The parent of every short directory.
SHORT_TMP_PARENT = "/tmp"


@contextlib.contextmanager
def short_tmp_dir(prefix: str = "tdp-") -> Iterator[str]:
    """A fresh directory under /tmp with a short path; removed with everything in it afterwards."""
    d = tempfile.mkdtemp(prefix=prefix, dir=SHORT_TMP_PARENT)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
