# syntax=docker/dockerfile:1
# ipvs-leftovers: the node agent image (DaemonSet in daemonset/).
#   sudo scripts/build-image [TAG]      builds the wheels, then this file, and prints the reference
# The build context must hold build/image-wheels/ (the agent's wheel and its pinned dependencies,
# made by scripts/build-image with `pip wheel`): pip runs outside the build, so the build needs
# no index and no certificate of a package proxy, and installs with --no-index.
#
# The base is Debian's own bookworm-slim with Debian's python3: scripts/build-image makes the
# same base from Debian packages (mmdebstrap + podman import) when no registry answers.
# For reproducible builds pin it by digest as well (debian:bookworm-slim@sha256:...).

ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

# --- builder: a venv with the agent's wheels, nothing fetched ---------------------------------
FROM ${BASE_IMAGE} AS builder
# Pinned to bookworm's versions: a Debian point release that replaces one fails the build loudly.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3=3.11.2-1+b1 python3-venv=3.11.2-1+b1 \
 && rm -rf /var/lib/apt/lists/*
COPY build/image-wheels /wheels
# Only the pinned wheels are in /wheels (requirements-image.txt): a dependency that is not
# pinned there has no wheel, and the install fails instead of fetching anything.
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-index --find-links /wheels --disable-pip-version-check \
        ipvs-leftovers

# --- runtime -----------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="ipvs-leftovers" \
      org.opencontainers.image.description="Audits what kube-proxy's ipvs mode left on a Kubernetes node that now runs nftables mode, and exports it as Prometheus metrics" \
      org.opencontainers.image.source="https://github.com/example/ipvs-leftovers" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

# The tools the agent runs as subprocesses: iptables-{legacy,nft}-save/-restore and their
# ip6tables twins (reading, and the cleanup's one transaction per table), and for the backup
# bundle and `restore` (docs/contract.md#cleanup) `ipvsadm -S -n` / `ipvsadm -R` and `ipset save` / `restore`.
# Reads and deletions of IPVS, sets and links are netlink from Python.
# Pinned to bookworm's versions: a Debian point release that replaces one fails the build loudly.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        python3=3.11.2-1+b1 iptables=1.8.9-2 ipset=7.17-1 ipvsadm=1:1.31-1+b1 \
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
