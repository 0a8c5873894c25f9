# syntax=docker/dockerfile:1
#
# Production image of topo-device-plugin (docs/deployment.md).
#
#   docker build -t topo-device-plugin:0.1.0 \
#     --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" .
#
# Two stages. The builder turns the source into a wheel and installs it, with its
# dependencies as binary wheels only, into a venv without pip. The final stage is the
# same slim Python base plus that venv: no compiler, no build tools, no source tree.
# tests/image/test_image.py runs the builder's commands outside Docker and lints this file.

# Pin by digest in release builds: --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:...
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY allocator/ allocator/
COPY plugin/ plugin/
# --only-binary: every dependency must come as a wheel, so a platform without one fails
# here loudly instead of needing a compiler. pip installs into the venv from outside it
# (--python), so the venv carries no pip. The last line is a smoke test of the result.
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv --without-pip /opt/topo-device-plugin \
 && pip --python /opt/topo-device-plugin/bin/python install --only-binary=:all: /wheels/*.whl \
 && /opt/topo-device-plugin/bin/topo-device-plugin --version

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="topo-device-plugin" \
      org.opencontainers.image.description="Topology-aware Kubernetes device plugin for GPUs and high-performance NICs" \
      org.opencontainers.image.source="https://github.com/topo-device-plugin/topo-device-plugin" \
      org.opencontainers.image.url="https://github.com/topo-device-plugin/topo-device-plugin" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /opt/topo-device-plugin /opt/topo-device-plugin
ENV PATH="/opt/topo-device-plugin/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root by default: discover, allocate and explain need nothing more. `serve` must
# reach the kubelet's root-owned device-plugins directory (mode 0750) and kubelet.sock,
# so the Helm chart runs it as uid 0 with every capability dropped, a read-only root
# filesystem and no privilege escalation (docs/deployment.md, "Why root").
USER 65532:65532
# No HEALTHCHECK: Kubernetes probes /healthz and /readyz on the metrics port.
ENTRYPOINT ["topo-device-plugin"]
CMD ["serve"]
