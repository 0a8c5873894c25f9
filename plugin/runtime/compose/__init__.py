"""The composition root: every long-lived object of a mode is built here, from typed settings.

- `settings`: the typed settings (`ServeSettings`, `SourceSettings`, `DraSettings`);
- `source`: the topology source (simulated or real hardware, with clique labels);
- `dra`: the DRA driver and its collaborators (API client, MIG and sharing backends, publisher, NIC side);
- `root`: one function per mode of `serve` (device plugin, DRA, both) building the daemon.
"""

from .settings import DraSettings, Mode, ServeSettings, SourceSettings

__all__ = ["DraSettings", "Mode", "ServeSettings", "SourceSettings"]
