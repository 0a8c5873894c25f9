"""Test helpers shipped with the package (so `discover` demos and CI use the same fixtures)."""
