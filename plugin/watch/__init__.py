"""Watching the node: a file through inotify, GPU health through NVML events, and the cancellation-safe wait they share."""
