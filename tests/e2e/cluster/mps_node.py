"""The MPS stand-in on a cluster node: placed in the node files the daemon pod mounts, and what it recorded.

Why the node files and not an image: the stand-in (tests/support/mps_standin) is test code and must never
be in the product image; the daemon pod already mounts the node directory (`workloads.chart_values`), and
the image has the Python the stand-in runs on, so `mpsControlBinary` names it there.

Why a "held" program: a restart of the control daemon after it died takes the supervisor about a second,
shorter than the kubelet's node-status period, so an operator (and a test) could miss the Unhealthy window.
While the program at the path is the held one, no control daemon can start, and the replicas stay Unhealthy
until the test puts the stand-in back: what the node shows is then a state to wait for, not a race.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from typing import Any

STANDIN = pathlib.Path(__file__).resolve().parents[2] / "support" / "mps_standin" / "nvidia-cuda-mps-control"
#: What the control program answers while held: no daemon can start, and none answers.
HELD = "#!/bin/sh\necho 'the MPS control program is held by the test' >&2\nexit 1\n"
#: The longest control socket under an MPS root: a DRA GPU's (`<root>/dra-GPU-<uuid>/pipe/control`); it must fit
#: in 107 bytes, which pytest's tmp paths under xdist workers can pass, hence a short directory for the root.
SOCKET_SUFFIX = "/dra-GPU-" + "0" * 36 + "/pipe/control"


def place(node_dir: pathlib.Path, held: bool = False) -> pathlib.Path:
    """The control program at `node_dir/nvidia-cuda-mps-control`, replaced atomically (a running copy keeps
    its file); the stand-in, or the held program when `held`."""
    dest = node_dir / "nvidia-cuda-mps-control"
    tmp = node_dir / ".nvidia-cuda-mps-control.new"
    if held:
        tmp.write_text(HELD)
    else:
        shutil.copyfile(STANDIN, tmp)
    tmp.chmod(0o755)
    os.replace(tmp, dest)
    return dest


def mps_root(base: pathlib.Path) -> pathlib.Path:
    """`base/mps`, checked to leave room for the control sockets under it (a longer root is refused by the daemon);
    `base` is a short directory (`topo_testkit.short_dirs`) that outlives the cluster."""
    root = base / "mps"
    assert len(os.fsencode(str(root) + SOCKET_SUFFIX)) <= 107, f"{root}: too long for the control socket"
    return root


def records(log_dir: pathlib.Path) -> list[dict[str, Any]]:
    """What the stand-in daemon(s) of one log directory were told, in order ([] before the first start)."""
    path = log_dir / "standin.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def settings_told(recs: list[dict[str, Any]]) -> list[str]:
    """The commands other than the supervisor's `get_server_list` probes."""
    return [r["command"] for r in recs if r["event"] == "command" and r["command"] != "get_server_list"]


#: Run in a client container (`python3 -c`): what it finds of MPS from the inside, as JSON. Its argument is the
#: pipe directory; it lists it, asks the daemon behind the control socket for its thread share (the stand-in's
#: wire format: one command line in, one JSON line out), reads /dev/shm/<marker> if the host put one there, and
#: creates a file of its own in /dev/shm (`shm_write_error`: None when it could).
INSIDE = """
import json, os, socket, sys
pipe, marker = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.path.join(pipe, "control"))
s.sendall(b"get_default_active_thread_percentage\\n")
answer = json.loads(s.makefile().readline())
shm = os.path.join("/dev/shm", marker)
try:  # as an MPS client does: its own segment in /dev/shm, as the container's (here non-root) user
    with open(os.path.join("/dev/shm", f"client-{os.getuid()}"), "w") as f:
        f.write("client")
    made = None
except OSError as e:
    made = str(e)
print(json.dumps({"uid": os.getuid(), "pipe": sorted(os.listdir(pipe)), "answer": answer,
                  "shm": open(shm).read() if os.path.exists(shm) else None, "shm_write_error": made}))
"""
