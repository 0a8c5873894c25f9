"""NVIDIA device plugin config files, verbatim from NVIDIA's README, for the compatibility tests.

Why in one place: the promise is that an operator's existing NVIDIA ConfigMap works unchanged, so the
tests of the config reader (tests/sharing) and of the daemon (tests/daemon) read the same texts.
Source: NVIDIA/k8s-device-plugin README at v0.20.0, "With CUDA Time-Slicing" and the config file
example of "Configuration Option Details" (with gpu-feature-discovery's `gfd` section, which
shares the file).
"""

from __future__ import annotations

#: "With CUDA Time-Slicing": 10 replicas of every GPU.
TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""

#: The README's config file example (flags as NVIDIA ships them), with the time-slicing section.
FLAGS_AND_TIME_SLICING = """\
version: v1
flags:
  migStrategy: "none"
  failOnInitError: true
  nvidiaDriverRoot: "/"
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: "envvar"
    deviceIDStrategy: "uuid"
  gfd:
    oneshot: false
    noTimestamp: false
    outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd
    sleepInterval: 60s
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: false
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""
