"""Generated v1beta1 stubs; regenerate with scripts/gen_proto.py."""
