# syntax=docker/dockerfile:1
# ipvs-leftovers: the node agent image (DaemonSet in daemonset/).
#   docker build -t ghcr.io/example/ipvs-leftovers:0.1.0 --build-arg VERSION=0.1.0 .
# For reproducible builds pin the base image by digest as well (python:3.11-slim-bookworm@sha256:...).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: the wheel, and a venv with it and its dependencies (all pure-Python wheels) ---
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
# The dependency pins are pyproject.toml's; the wheel is this source tree's.
RUN pip wheel --no-deps -w /dist . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install /dist/*.whl

# --- runtime -----------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="ipvs-leftovers" \
      org.opencontainers.image.description="Audits what kube-proxy's ipvs mode left on a Kubernetes node that now runs nftables mode, and exports it as Prometheus metrics" \
      org.opencontainers.image.source="https://github.com/example/ipvs-leftovers" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

# The tools the agent runs as subprocesses: iptables-{legacy,nft}-save/-restore and their
# ip6tables twins (reading, and the cleanup's one transaction per table), and for the backup
# bundle and `restore` (SPEC §5) `ipvsadm -S -n` / `ipvsadm -R` and `ipset save` / `restore`.
# Reads and deletions of IPVS, sets and links are netlink from Python.
# Pinned to bookworm's versions: a Debian point release that replaces one fails the build loudly.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        iptables=1.8.9-2 ipset=7.17-1 ipvsadm=1:1.31-1+b1 \
 && rm -rf /var/lib/apt/lists/*

COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# root on purpose: netlink dumps of IPVS, ipsets and nf_tables need CAP_NET_ADMIN, and
# iptables-legacy-save needs CAP_NET_RAW; a non-root uid loses capabilities at exec. The
# DaemonSet drops every other capability and makes the root filesystem read-only.
# hadolint ignore=DL3002
USER 0:0
EXPOSE 9437
ENTRYPOINT ["ipvs-leftovers"]
CMD ["serve"]
