"""Run a module as `python -m` would, and write the names of every module it imported when it exits.

    python -m topo_testkit.with_module_log OUT MODULE [ARGS...]

Why: what a `serve` process imports is what it costs in memory and start-up time; a test or
benchmark reads OUT (one module name per line, written at interpreter exit, e.g. after SIGTERM
ends the daemon cleanly) to check that a mode leaves out what it does not use. MODULE may itself
be a launcher such as `topo_testkit.with_fake_nvml`.
"""

from __future__ import annotations

import atexit
import runpy
import sys


def main() -> None:
    out, module, *args = sys.argv[1:]

    def write() -> None:
        with open(out, "w") as f:
            f.write("\n".join(sorted(sys.modules)) + "\n")

    atexit.register(write)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
