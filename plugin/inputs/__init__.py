"""Reading users' files: bounded YAML reading and locating a field in it (pure; config and sources read through it)."""
