"""What `topo-device-plugin demo` needs besides the daemon: a kubelet stand-in and its admission walk.

Why in the product and behind this name: the demo is the first thing a new
user runs (no kubelet, no root), so it ships; keeping the stand-in here makes
clear it is for the demo, not a part of the daemon. It holds only what the
demo needs: the test hooks tests and benchmarks use live in the test kit's
subclasses (tests/support/topo_testkit/), which are not shipped.
"""
