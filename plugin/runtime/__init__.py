"""The daemon: one asyncio loop composing sources → model → servers and DRA; the one writer of live changes."""
