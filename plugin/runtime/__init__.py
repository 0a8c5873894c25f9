"""The daemon: one asyncio loop composing sources → model → servers and DRA driver; the one writer of live changes."""
