"""The allocation service: preferred answers on a search pool under a deadline, GPU–NIC pairing, pod-resources."""
