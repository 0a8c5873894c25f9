"""The kubelet's side of the DRA driver: its gRPC services (DRAPlugin, registration, device health), prepare and
unprepare of claims, the checkpoint that makes them idempotent across restarts, one CDI spec per claim, and the
socket and state paths they use."""
