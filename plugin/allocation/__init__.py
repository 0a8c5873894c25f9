"""The allocation service: preferred answers under a deadline on a search pool, GPU–NIC pairing groups, pod-resources."""
