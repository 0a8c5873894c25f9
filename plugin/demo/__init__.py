"""What `topo-device-plugin demo` needs besides the daemon: a kubelet stand-in.

Why in the product and behind this name: the demo is the first thing a new
user runs (no kubelet, no root), so it ships; keeping the stand-in here makes
clear it is for the demo (tests and benchmarks use it too), not a part of the
daemon.
"""
