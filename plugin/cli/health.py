"""`topo-device-plugin health clear`: the operator's word that a GPU is fixed, to the running daemon.

Why a command and a file: faults of the `restart node` and `contact support` kinds
(and a `reset GPU` fault whose reset the driver cannot evidence) wait for
evidence the daemon cannot read; an operator who repaired the GPU says so here.
The command appends to `<stateDirectory>/gpu-health-clear.json`, which the daemon
watches (plugin/health/store.py); the GPU is Healthy again at once. Run it where
the daemon's state directory is (on the node, or `kubectl exec` into the daemon's pod).
"""

from __future__ import annotations

import click

from ..config import load_config
from ..errors import InputError
from ..health.store import CLEAR_FILE, add_clear
from .routing import Command

DEFAULT_STATE_DIRECTORY = "/var/lib/topo-device-plugin"


@click.command(cls=Command, examples=("topo-device-plugin health clear --gpu GPU3 --state-dir /var/lib/topo-device-plugin",),
               arguments={"action": "clear: the named GPUs are fixed (the daemon drops their faults at once)"})
@click.argument("action", type=click.Choice(["clear"]))
@click.option("--gpu", "gpus", multiple=True, required=True, metavar="GPU", envvar="TOPO_DP_GPU",
              help="A GPU UUID, its name as `discover` prints it (GPU3), or `all`; repeatable.")
@click.option("--state-dir", default=None, metavar="DIR", envvar="TOPO_DP_STATE_DIR",
              help="The daemon's gpus.health.stateDirectory (default: from --config, else "
                   f"{DEFAULT_STATE_DIRECTORY}).")
@click.option("--config", "config_path", default=None, metavar="FILE", envvar="TOPO_DP_CONFIG",
              help="The daemon's config file (its gpus.health.stateDirectory).")
def health(action: str, gpus: tuple[str, ...], state_dir: str | None, config_path: str | None) -> None:
    """GPU health: `clear` tells the running daemon the named GPUs are fixed; they are Healthy again at once."""
    clear(gpus, state_dir, config_path)


def clear(gpus: tuple[str, ...], state_dir: str | None, config_path: str | None) -> None:
    """End the named GPUs' faults now (one clear file entry each)."""
    if state_dir is None and config_path:
        state_dir = load_config(config_path).gpu_health.get("stateDirectory")
        if not state_dir:
            raise InputError(f"{config_path}: field gpus.health.stateDirectory: not set, so the daemon "
                             "watches no clear file (fix: set it, restart the daemon, or pass --state-dir)")
    directory = state_dir or DEFAULT_STATE_DIRECTORY
    try:
        added = add_clear(directory, list(gpus))
    except OSError as e:
        raise InputError(f"{directory}/{CLEAR_FILE}: cannot write it: {e.strerror} (fix: run where the daemon's "
                         "state directory is, as a user who may write it, or pass --state-dir)") from None
    for c in added:
        click.echo(f"clear requested: {c.gpu} ({directory}/{CLEAR_FILE}, id {c.id[:8]})")
