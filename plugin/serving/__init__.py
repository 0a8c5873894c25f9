"""Kubelet-facing serving: one device-plugin gRPC server per resource, registration, and the sockets they bind."""
