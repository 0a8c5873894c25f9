"""NRI (containerd's Node Resource Interface) plugin side: ttrpc framing, NRI's multiplexing, the plugin.

Knows nothing of NICs or DRA: it reports pod-sandbox events to a `PodSandboxHandler`.
"""

from plugin.nri.plugin import NriPlugin, PodSandbox, PodSandboxHandler

__all__ = ["NriPlugin", "PodSandbox", "PodSandboxHandler"]
