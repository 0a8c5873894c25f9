"""Watching the node: files through inotify, GPU health through NVML events, and a cancellation-safe wait."""
