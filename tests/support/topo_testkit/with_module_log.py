"""Run a module as `python -m` would, and write the names of every module it imported when it exits.

    python -m topo_testkit.with_module_log OUT MODULE [ARGS...]

SIGUSR1 writes the list at that moment to OUT.1, OUT.2, ... (the daemon leaves SIGUSR1 alone),
so a test can compare what was loaded at two points of one run.

Why: what a `serve` process imports is what it costs in memory and start-up time; a test or
benchmark reads OUT (one module name per line, written at interpreter exit, e.g. after SIGTERM
ends the daemon cleanly) to check that a mode leaves out what it does not use. MODULE may itself
be a launcher such as `topo_testkit.with_fake_nvml`.
"""

from __future__ import annotations

import atexit
import os
import runpy
import signal
import sys


def main() -> None:
    out, module, *args = sys.argv[1:]

    def write(path: str = out) -> None:
        with open(path + ".tmp", "w") as f:
            f.write("\n".join(sorted(sys.modules)) + "\n")
        os.replace(path + ".tmp", path)  # a reader never sees half a list

    snapshots = 0

    def on_usr1(signum: int, frame: object) -> None:
        nonlocal snapshots
        snapshots += 1
        write(f"{out}.{snapshots}")

    signal.signal(signal.SIGUSR1, on_usr1)
    atexit.register(write)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
