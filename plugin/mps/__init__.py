"""NVIDIA's MPS control daemon, run and watched by us: `control` talks to the program, `supervisor` keeps it up."""
