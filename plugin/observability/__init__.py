"""What operators see: Prometheus metrics, the /metrics /healthz /readyz endpoint and its HTTP server, logging."""
