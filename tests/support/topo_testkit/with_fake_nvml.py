"""Run the real `topo-device-plugin` CLI with NVML answered by a `FakeNvml`.

    python -m topo_testkit.with_fake_nvml NODE serve --config config.yaml ...

NODE is a simulated node (built-in name, YAML or `nvidia-smi topo -m` text)
whose GPUs the fake NVML reports. Why a launcher and not a product flag: the
hardware boundary is the only thing replaced. The plugin code imports
`pynvml` as always; this module makes that name resolve to the fake before
the CLI runs, so start-up, discovery, health and the daemon are the shipped
code paths. `TOPO_TESTKIT_FABRIC_FILE` names the fake's fabric-manager file
(`FakeNvml.fabric_file`), so a test can change the fabric state of the running daemon.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from .fake_nvml import FakeNvml


def fake_for(node: str, **kw: Any) -> FakeNvml:
    """A `FakeNvml` for the GPUs of a simulated node (its NICs come from sysfs, not NVML)."""
    from plugin.sources.simulated import load_simulated

    topology = load_simulated(node)
    return FakeNvml(topology.without(d.name for d in topology.nics), **kw)


@contextlib.contextmanager
def installed(fake: FakeNvml) -> Iterator[FakeNvml]:
    """Make `import pynvml` return `fake` for as long as the context lasts (in this process)."""
    saved = sys.modules.get("pynvml")
    sys.modules["pynvml"] = fake  # type: ignore[assignment]  # the fake stands in for the module
    try:
        yield fake
    finally:
        if saved is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = saved


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        sys.exit("usage: python -m topo_testkit.with_fake_nvml NODE COMMAND [OPTIONS...]")
    fake = fake_for(args.pop(0))
    fake.fabric_file = os.environ.get("TOPO_TESTKIT_FABRIC_FILE") or None  # the fabric manager stand-in
    from plugin.cli import cli

    with installed(fake):
        sys.exit(cli.main(args=args, prog_name="topo-device-plugin", standalone_mode=True))


if __name__ == "__main__":
    main()
