"""Generated stubs; regenerate with scripts/gen_proto.py."""
