"""topo-device-plugin: the daemon, its discovery sources and its kubelet-facing servers."""

__version__ = "0.1.0"
