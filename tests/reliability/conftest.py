"""The reliability suite uses the daemon tests' fixtures (a real daemon process, the kubelet stand-in)
and the DRA tests' stand-in API server.

They are loaded from tests/daemon/conftest.py and tests/dra/conftest.py rather than copied, so the
suites drive the daemon and the driver the same way.
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

_DRA = pathlib.Path(__file__).resolve().parents[1] / "dra"
_dra_spec = importlib.util.spec_from_file_location("dra_fixtures", _DRA / "conftest.py")
_dra_fixtures = importlib.util.module_from_spec(_dra_spec)
_dra_spec.loader.exec_module(_dra_fixtures)

apiserver = _dra_fixtures.apiserver
