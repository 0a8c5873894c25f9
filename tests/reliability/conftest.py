"""The reliability suite uses the daemon tests' fixtures (a real daemon process, the kubelet stand-in).

They are loaded from tests/daemon/conftest.py rather than copied, so both suites drive the
daemon the same way.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

_DAEMON = pathlib.Path(__file__).resolve().parents[1] / "daemon"
if str(_DAEMON) not in sys.path:
    sys.path.insert(0, str(_DAEMON))
_spec = importlib.util.spec_from_file_location("daemon_fixtures", _DAEMON / "conftest.py")
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)

plugin_dir = _fixtures.plugin_dir
kubelet = _fixtures.kubelet
start_daemon = _fixtures.start_daemon
