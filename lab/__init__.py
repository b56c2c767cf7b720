"""Reproduce real kube-proxy ipvs-mode kernel state inside throwaway network namespaces.

The names, comments and rule texts mirror /work/shared/reference/kube-proxy-state.md so the
agent can be tested against what a node really carries.
"""

from lab.model import Node, Port, Service

__all__ = ["Node", "Port", "Service"]
