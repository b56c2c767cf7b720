"""Reproduce real kube-proxy ipvs-mode kernel state inside throwaway network namespaces.

The names, comments and rule texts mirror upstream kube-proxy's ipvs mode
(https://github.com/kubernetes/kubernetes/tree/v1.30.3/pkg/proxy/ipvs) so the agent can be
tested against what a node really carries; tests/netns/test_lab_matches_real_kube_proxy.py
compares the lab with what the real v1.30.3 wrote (tests/data/kube-proxy-v1.30.3).
"""

from lab.model import Node, Port, Service

__all__ = ["Node", "Port", "Service"]
